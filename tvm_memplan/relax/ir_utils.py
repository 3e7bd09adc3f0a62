"""Small Relax IR helpers shared by the analyses, the passes and the backends."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx


def static_shape(ty: object) -> tuple[int, ...] | None:
    """The shape of a statically shaped tensor type (or of a ``ShapeExpr``), else None."""
    shape = ty.shape if isinstance(ty, relax.TensorType) else ty
    if not isinstance(shape, relax.ShapeExpr) or not all(isinstance(dim, tirx.IntImm) for dim in shape.values):
        return None
    return tuple(int(dim.value) for dim in shape.values)


def top_level_bindings(func: relax.Function) -> list[relax.Binding]:
    """The function body's bindings in execution order (nested control flow stays inside its binding)."""
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return []
    return [binding for block in body.blocks for binding in block.bindings]


def op_name(value: relax.Expr | None) -> str | None:
    """``relax.nn.conv2d`` for a call of that operator; None for anything else."""
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return str(value.op.name)
    return None


def constant_value(expr: relax.Expr) -> np.ndarray | None:
    """The array of a constant, else None."""
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


def inference_batch_norm(value: relax.Expr | None) -> relax.Expr | None:
    """``batch_norm(x, gamma, beta, mean, var)[0]`` with constant statistics, as the per-channel
    ``x * scale + shift`` it computes at inference (exports that do not fold BatchNormalization, such as
    DenseNet's pre-activations); None for anything else."""
    if op_name(value) != "relax.nn.batch_norm" or bool(getattr(value.attrs, "training", False)):
        return None
    gamma, beta, mean, var = (constant_value(a) for a in value.args[1:5])
    shape = static_shape(value.args[0].ty)
    if any(c is None for c in (gamma, beta, mean, var)) or shape is None:
        return None
    scale = 1 / np.sqrt(var + float(value.attrs.epsilon))
    if bool(getattr(value.attrs, "scale", True)):
        scale = gamma * scale
    shift = -mean * scale + (beta if bool(getattr(value.attrs, "center", True)) else 0)
    broadcast = [1] * len(shape)
    broadcast[int(value.attrs.axis) % len(shape)] = -1
    dtype = str(value.args[0].ty.dtype)
    return relax.op.add(
        relax.op.multiply(value.args[0], relax.const(scale.reshape(broadcast).astype(dtype))),
        relax.const(shift.reshape(broadcast).astype(dtype)),
    )


@relax.expr_functor.mutator
class _InferenceBatchNorms(relax.PyExprMutator):
    def visit_tuple_getitem_(self, item: relax.TupleGetItem) -> relax.Expr:
        item = super().visit_tuple_getitem_(item)
        if item.index != 0 or not isinstance(item.tuple_value, relax.Var):
            return item
        folded = inference_batch_norm(self.lookup_binding(item.tuple_value))
        return item if folded is None else folded


@tvm.transform.module_pass(opt_level=0, name="tvm_memplan.FoldInferenceBatchNorms")
def fold_inference_batch_norms(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Every :func:`inference_batch_norm` of the module's Relax functions as its multiply and add (the
    batch norm's tuple is left for ``DeadCodeElimination``)."""
    rewriter = _InferenceBatchNorms(mod)
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return rewriter.builder_.get()
