"""What TVM's own StaticPlanBlockMemory allocates, for side-by-side reports."""

from __future__ import annotations

import tvm
from tvm import relax, tirx

_ALLOC_STORAGE = tvm.ir.Op.get("relax.memory.alloc_storage")


def static_storage_bytes(mod: tvm.IRModule) -> int:
    """Sum of the constant-size ``R.memory.alloc_storage`` requests in every Relax function."""
    total = 0

    def visit(expr: relax.Expr) -> None:
        nonlocal total
        if isinstance(expr, relax.Call) and expr.op.same_as(_ALLOC_STORAGE):
            size = expr.args[0]
            if isinstance(size, relax.ShapeExpr) and all(isinstance(v, tirx.IntImm) for v in size.values):
                count = 1
                for v in size.values:
                    count *= int(v.value)
                total += count

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return total


def stock_planned_bytes(staged: tvm.IRModule, target: tvm.target.Target) -> int:
    """Bytes SPBM allocates for a module at the planning stage (after ``CallTIRRewrite``)."""
    with target:
        return static_storage_bytes(relax.transform.StaticPlanBlockMemory()(staged))
