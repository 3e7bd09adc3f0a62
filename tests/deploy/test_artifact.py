"""The constant pool read back from built executables: float weights as given, int8 weights as int8."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tvm_memplan.deploy.artifact import (
    TENSOR_MAGIC,
    constant_bytes,
    executable_constants,
    library_constants,
    parse_constants,
)
from tvm_memplan.frontend import LoadedModel
from tvm_memplan.planner import plan_model

from ..quant import models


def _build(model: onnx.ModelProto):
    return plan_model(LoadedModel("conv", model), None, order="program").build()


def test_a_float_build_holds_its_initializers():
    model = models.conv(cin=16, cout=32)
    constants = executable_constants(_build(model))
    initializers = [numpy_helper.to_array(init) for init in model.graph.initializer]
    assert sum(c.nbytes for c in constants) == sum(a.nbytes for a in initializers)
    assert {c.dtype for c in constants} == {"float32"}
    assert sorted(int(np.prod(c.shape)) for c in constants) == sorted(a.size for a in initializers)


def test_an_int8_build_holds_int8_weights_int32_biases_and_one_multiplier_per_channel():
    float_model = models.conv(cin=16, cout=32)
    built = constant_bytes(_build(models.quantize_qdq(float_model, samples=2)))
    assert built.by_dtype == {"int8": 32 * 16 * 3 * 3, "int32": 32 * 4, "float32": 32 * 4}
    assert built.total <= 0.27 * constant_bytes(_build(float_model)).total


def test_an_exported_library_holds_the_executables_constant_pool(tmp_path):
    executable = _build(models.quantize_qdq(models.conv(), samples=2))
    executable.export_library(str(tmp_path / "conv.so"))
    assert library_constants(tmp_path / "conv.so") == executable_constants(executable)


def test_a_corrupt_tensor_header_is_refused():
    header = TENSOR_MAGIC + bytes(8) + np.array([1, 0, 1], "<i4").tobytes() + bytes([2, 32, 1, 0])
    assert parse_constants(b"no tensors here") == []
    with pytest.raises(ValueError, match="bytes for shape"):
        parse_constants(header + np.array([4, 999], "<i8").tobytes())
