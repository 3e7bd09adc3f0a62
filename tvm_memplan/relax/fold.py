"""Fold the constant-only data-movement ops the ONNX frontend leaves, in numpy, before TVM's FoldConstant.

TVM's ``FoldConstant`` legalizes every call whose operands are all constants into a kernel, builds it
with LLVM and runs it. The ONNX frontend leaves many such calls: a Conv's bias becomes
``reshape(bias)``, a Gemm's weight ``permute_dims(weight)``, and each Clip's bounds ``isnan`` and
``where`` of scalars. MobileNetV2 has about 190 of them, and their LLVM builds took most of the time
of planning a model (on every target). These ops only move or select values, so numpy computes
exactly what the kernels would; anything else is left to ``FoldConstant``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax


def _permute(call: relax.Call, args: list[np.ndarray]) -> np.ndarray:
    axes = call.attrs.axes
    return np.transpose(args[0], None if axes is None else [int(a) for a in axes])


_INDEX_OPS: dict[type, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    tvm.tirx.Add: np.add,
    tvm.tirx.Sub: np.subtract,
    tvm.tirx.Mul: np.multiply,
    tvm.tirx.FloorDiv: np.floor_divide,
    tvm.tirx.FloorMod: np.mod,
}


def _index(expr: tvm.tirx.PrimExpr, grid: dict[tvm.tirx.Var, np.ndarray]) -> np.ndarray | int:
    """An index expression of an ``IndexMap`` evaluated on numpy index arrays."""
    if isinstance(expr, tvm.tirx.IntImm):
        return int(expr)
    if isinstance(expr, tvm.tirx.Var):
        return grid[expr]
    op = _INDEX_OPS.get(type(expr))
    if op is None:
        raise ValueError(f"no numpy form of {type(expr).__name__}")
    return op(_index(expr.a, grid), _index(expr.b, grid))


def _layout_transform(call: relax.Call, value: np.ndarray) -> np.ndarray | None:
    """A layout transform without padding (weights and biases packed into channel blocks), each
    element scattered to its mapped index (TVM's ``IndexMap.map_tensor`` took 112 s for ResNet-50's
    weights)."""
    index_map = call.attrs.index_map
    if call.attrs.pad_value is not None or len(index_map.initial_indices) != value.ndim:
        return None
    grid = dict(zip(index_map.initial_indices, np.indices(value.shape, sparse=True), strict=True))
    out = np.empty([int(d) for d in call.ty.shape.values], value.dtype)
    if out.size != value.size:  # not a permutation of the elements
        return None
    try:
        out[tuple(_index(expr, grid) for expr in index_map.final_indices)] = value
    except (ValueError, IndexError):  # an index op numpy lacks, or indices that do not cover the value
        return None
    return out


FOLDS: dict[str, Callable[[relax.Call, list[np.ndarray]], np.ndarray | None]] = {
    "relax.reshape": lambda call, args: args[0].reshape([int(d) for d in call.ty.shape.values]),
    "relax.permute_dims": _permute,
    "relax.isnan": lambda call, args: np.isnan(args[0]),
    "relax.where": lambda call, args: np.where(*args),
    "relax.layout_transform": lambda call, args: _layout_transform(call, args[0]),
}
"""Op name → its value from the call and its constant tensor operands (shapes come from the call's type),
or None where numpy does not compute it."""


def _static_type(call: relax.Call) -> tuple[tuple[int, ...], str] | None:
    ty = call.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    values = getattr(ty.shape, "values", None)
    if values is None or not all(isinstance(d, tvm.tirx.IntImm) for d in values):
        return None
    return tuple(int(d) for d in values), str(ty.dtype)


def fold_call(call: relax.Expr) -> relax.Expr | None:
    """``call`` as a constant when it is a foldable op whose tensor operands are all constants."""
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op) or call.op.name not in FOLDS:
        return None
    tensors = [a for a in call.args if not isinstance(a, relax.ShapeExpr)]
    if not tensors or not all(isinstance(a, tvm.ir.GenericConst) for a in tensors):
        return None
    static = _static_type(call)
    if static is None:
        return None
    shape, dtype = static
    value = FOLDS[call.op.name](call, [a.value.numpy() for a in tensors])
    if value is None:
        return None
    value = np.asarray(value)
    if value.shape != shape:
        return None
    return relax.const(value.astype(dtype, order="C"), dtype)  # (ascontiguousarray makes a scalar 1-d)


@relax.expr_functor.mutator
class _Folder(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.constants: dict[relax.Var, relax.Expr] = {}

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        folded = fold_call(self.visit_expr(binding.value))
        if folded is None:
            super().visit_var_binding_(binding)
        else:  # uses see the constant; the binding goes
            self.constants[binding.var] = folded

    def visit_var_(self, var: relax.Var) -> relax.Expr:
        return self.constants.get(var, var)

    def visit_dataflow_var_(self, var: relax.DataflowVar) -> relax.Expr:
        return self.constants.get(var, var)


def FoldDataMovementConstants() -> tvm.transform.Pass:  # noqa: N802 - named like TVM's passes
    """Fold :data:`FOLDS` calls on constants in every Relax function (see the module docstring)."""

    @tvm.transform.module_pass(opt_level=0, name="tvm_memplan.FoldDataMovementConstants")
    def _pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                mod[gv] = _Folder(mod).visit_expr(func)
        return mod

    return _pass
