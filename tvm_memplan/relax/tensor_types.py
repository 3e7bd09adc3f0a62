"""Byte sizes of Relax tensor types."""

from __future__ import annotations

import tvm
from tvm import relax, tirx


def dtype_nbytes(dtype: str, count: int) -> int:
    """Bytes of ``count`` elements of ``dtype`` (sub-byte types rounded up)."""
    data_type = tvm.runtime.DataType(dtype)
    return (count * data_type.bits * data_type.lanes + 7) // 8


def static_nbytes(ty: object) -> int:
    """Bytes of a statically shaped tensor type (tuples summed); 0 for anything else."""
    if isinstance(ty, (relax.TupleType, tvm.ir.TupleType)):
        return sum(static_nbytes(field) for field in ty.fields)
    if not isinstance(ty, relax.TensorType) or ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr):
        return 0
    count = 1
    for dim in ty.shape.values:
        if not isinstance(dim, tirx.IntImm):
            return 0
        count *= int(dim.value)
    return dtype_nbytes(str(ty.dtype), count)
