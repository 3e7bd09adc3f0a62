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
