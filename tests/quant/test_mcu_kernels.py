"""The Cortex-M lowering of a split row tile's input slice (:func:`.mcu_kernels.legalize_row_slice`)."""

from __future__ import annotations

import pytest
import tvm
from tvm import relax

from tvm_memplan.quant.mcu_kernels import is_row_band, legalize_row_slice


def _lowered(dtype: str, axes: list[int], begin: list[int], end: list[int]) -> list[tvm.tirx.PrimFunc]:
    x = relax.Var("x", relax.TensorType((1, 3, 10, 8), dtype))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.strided_slice(x, axes=axes, begin=begin, end=end))
        builder.emit_func_output(out)
    mod = relax.transform.LegalizeOps({"relax.strided_slice": legalize_row_slice})(builder.get())
    return [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]


def test_int8_rows_are_one_row_copy_call_with_the_bands_geometry():
    (func,) = _lowered("int8", [2], [2], [6])
    assert is_row_band(func)
    call = func.body.block.body.value
    # planes, bytes a plane, the input's plane stride, the first row's offset
    assert [int(a.value) for a in call.args[3:]] == [3, 4 * 8, 10 * 8, 2 * 8]


@pytest.mark.parametrize(
    ("dtype", "axes", "begin", "end"),
    [("float32", [2], [2], [6]), ("int8", [1], [0], [2]), ("int8", [2], [-4], [10]), ("int8", [2], [2], [12])],
    ids=["float", "channels", "negative begin", "clipped end"],
)
def test_anything_else_keeps_tvms_lowering(dtype, axes, begin, end):
    assert not any(is_row_band(f) for f in _lowered(dtype, axes, begin, end))
