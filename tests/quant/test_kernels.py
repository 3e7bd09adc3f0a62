"""Each integer kernel against onnxruntime's default (fused integer) session on the same QDQ file.

Conv and Gemm/MatMul requantize exactly as MLAS does: they must be identical. Add, Mul, the pools
and lookup tables follow onnxruntime's float formulas (its own kernels use fixed point or sum in
another order): at most 1 LSB.
"""

from __future__ import annotations

import numpy as np
import pytest

from tvm_memplan.frontend import LoadedModel, to_relax
from tvm_memplan.planner import plan_model
from tvm_memplan.quant.lower import LowerQDQ
from tvm_memplan.quant.reference import lsb_difference, output_scales, run_onnxruntime
from tvm_memplan.verify import run_vm

from . import models


def compare(qmodel, seeds=(0, 1)) -> tuple[int, dict[str, int]]:
    """Largest LSB difference from onnxruntime over random inputs, and what LowerQDQ lowered (a
    conv that quantizes the network input itself, ``quantize+conv2d``, counted as its conv)."""
    loaded = LoadedModel("kernel", qmodel)
    reports = []
    LowerQDQ(reports.append)(to_relax(loaded))
    assert not reports[0].kept_float, f"kept in float: {reports[0].kept_float}"
    executable = plan_model(loaded, None, order="program", time_budget=1).build()
    (scale,) = output_scales(qmodel)
    worst = 0
    for seed in seeds:
        # twice the calibrated range: saturation is exercised too
        inputs = {k: v * 2 for k, v in loaded.random_inputs(seed).items()}
        ours, _ = run_vm(executable, inputs)
        reference = run_onnxruntime(qmodel, inputs)
        worst = max(worst, lsb_difference(ours[0], reference[0], scale))
    kernels: dict[str, int] = {}
    for kind, count in reports[0].lowered.items():
        kernels[kind.removeprefix("quantize+")] = kernels.get(kind.removeprefix("quantize+"), 0) + count
    return worst, kernels


CONVS = {
    "regular": {},
    "strided": {"stride": 2},
    "pointwise": {"kernel": 1, "pad": 0, "cout": 12},
    "depthwise": {"groups": 8},
    "grouped": {"groups": 2, "cout": 6},
    "relu": {"activation": "relu"},
    "clip": {"activation": "clip", "groups": 8},
}


@pytest.mark.parametrize("activation", ["int8", "uint8"])
@pytest.mark.parametrize("kind", list(CONVS))
def test_conv_is_identical_to_onnxruntime(kind, activation):
    diff, lowered = compare(models.quantize_qdq(models.conv(**CONVS[kind]), activation=activation))
    assert diff == 0
    assert lowered.get("conv2d", 0) + lowered.get("depthwise_conv2d", 0) == 1


@pytest.mark.parametrize("activation", ["int8", "uint8"])
@pytest.mark.parametrize("matmul", [False, True], ids=["gemm", "matmul"])
def test_dense_is_identical_to_onnxruntime(matmul, activation):
    diff, lowered = compare(models.quantize_qdq(models.gemm(matmul=matmul), activation=activation))
    assert diff == 0
    assert lowered.get("dense") == 1


def test_per_tensor_weights_are_identical_to_onnxruntime():
    diff, lowered = compare(models.quantize_qdq(models.conv(), per_channel=False))
    assert diff == 0 and lowered.get("conv2d") == 1


FOLLOWERS = {
    "Add": ({}, "conv2d+add"),  # the add in the second conv's epilogue
    "Mul": ({}, "multiply"),
    "Sigmoid": ({}, "lookup"),
    "AveragePool": ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, "avg_pool2d"),
    "GlobalAveragePool": ({}, "mean"),
    "MaxPool": ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, "max_pool2d"),
    "Concat": ({"axis": 1}, "concat"),
    "Reshape": ({}, "reshape"),
    "Flatten": ({}, "reshape"),
    "Transpose": ({"perm": [0, 2, 3, 1]}, "permute_dims"),
}


@pytest.mark.parametrize("activation", ["int8", "uint8"])
@pytest.mark.parametrize("op", list(FOLLOWERS))
def test_kernel_after_conv_within_one_lsb(op, activation):
    attrs, kind = FOLLOWERS[op]
    diff, lowered = compare(models.quantize_qdq(models.after_conv(op, **attrs), activation=activation))
    assert diff <= 1
    assert lowered.get(kind) == 1


@pytest.mark.parametrize("size", [5, 9])
def test_global_average_pool_as_one_sum_or_a_reduction_within_one_lsb(size):
    """A 5x5 plane (at most ``UNROLLED_MEAN`` elements) is summed as one expression per channel, straight from the
    input; a 9x9 one through the int32 reduction. Both within 1 LSB of onnxruntime, as the other followers."""
    from tvm import te

    from tvm_memplan.quant.kernels import UNROLLED_MEAN, mean

    x = te.placeholder((1, 8, size, size), "int8", name="x")
    y = mean(
        x, axes=[2, 3], keepdims=True, multiplier=0.01, x_zero_point=-3, y_zero_point=2, low=-128, high=127,
        out_dtype="int8",
    )  # fmt: skip
    assert (y.op.input_tensors[0] == x) == (size * size <= UNROLLED_MEAN)
    diff, lowered = compare(models.quantize_qdq(models.after_conv("GlobalAveragePool", size=size)))
    assert diff <= 1 and lowered.get("mean") == 1


@pytest.mark.parametrize("op", ["HardSwish", "HardSigmoid", "Tanh"])
def test_float_activation_between_convs_becomes_a_table(op):
    """The quantizer leaves these in float; DequantizeLinear → op → QuantizeLinear is still a
    function of 256 codes: a lookup table computed with the float ops (at most 1 LSB)."""
    diff, lowered = compare(models.quantize_qdq(models.between_convs(op)))
    assert diff <= 1
    assert lowered.get("lookup") == 1 and lowered.get("conv2d") == 2


def test_pytorch_style_qdq_conv_within_one_lsb():
    """Weights quantized in the graph and a float bias (PyTorch's exports): the weights are quantized
    here as QuantizeLinear would, the bias rounded to the accumulator's scale."""
    diff, lowered = compare(models.torch_style_conv())
    assert diff <= 1 and lowered.get("conv2d") == 1


def test_accumulator_is_float_only_where_exact():
    from tvm_memplan.quant.kernels import accumulator_dtype

    typical = np.random.default_rng(0).integers(-40, 40, size=(8, 64, 3, 3))
    assert accumulator_dtype(typical, "int8") == "float32"
    full = np.full((8, 128, 3, 3), 127)  # 1152 * 127 * 128 > 2^24
    assert accumulator_dtype(full, "int8") == "int32"
    assert accumulator_dtype(np.full((8, 64, 3, 3), 127), "int8") == "float32"
    assert accumulator_dtype(np.full((8, 64, 3, 3), 127), "uint8") == "int32"  # 576 * 127 * 255 > 2^24


def test_conv_beyond_the_float_bound_is_identical_to_onnxruntime():
    """±1 weights quantize to ±127: a 128-channel 3x3 conv's sums leave float32's exact range, the
    kernel accumulates in int32."""
    import onnx

    model = models.conv(cin=128, cout=4, size=6)
    weight = next(i for i in model.graph.initializer if i.name == "w")
    signs = np.where(np.random.default_rng(3).random((4, 128, 3, 3)) < 0.5, -1.0, 1.0).astype(np.float32)
    weight.CopyFrom(onnx.numpy_helper.from_array(signs * 0.05, "w"))
    diff, lowered = compare(models.quantize_qdq(model))
    assert diff == 0 and lowered.get("conv2d") == 1


def test_dilated_strided_asymmetric_conv_is_identical_to_onnxruntime():
    from onnx import helper

    rng = np.random.default_rng(0)
    model = models.float_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[0, 1, 2, 1], dilations=[2, 2], strides=[1, 2])],
        {"w": rng.standard_normal((6, 4, 3, 3)) * 0.3, "b": np.zeros(6)},
        {"x": [1, 4, 10, 10]},
        {"y": None},
    )
    diff, lowered = compare(models.quantize_qdq(model))
    assert diff == 0 and lowered.get("conv2d") == 1


def test_batched_matmul_is_identical_to_onnxruntime():
    from onnx import helper

    model = models.float_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        {"w": np.random.default_rng(1).standard_normal((16, 8)) * 0.3},
        {"x": [2, 5, 16]},
        {"y": None},
    )
    diff, lowered = compare(models.quantize_qdq(model))
    assert diff == 0 and lowered.get("dense") == 1


@pytest.mark.parametrize("activation", ["int8", "uint8"])
@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_standalone_binary_kernel_within_one_lsb(op, activation):
    """Add/Mul of two graph inputs (no producing conv to fuse into): the qadd/qmul kernels."""
    diff, lowered = compare(models.quantize_qdq(models.binary(op), activation=activation))
    assert diff <= 1
    assert lowered.get("add" if op == "Add" else "multiply") == 1


@pytest.mark.parametrize("misspelled", [{"residual_ad": None}, {}])
def test_kernels_reject_unknown_and_missing_keywords(misspelled):
    """A misspelled epilogue keyword would otherwise be dropped silently, and a missing zero point
    would fail deep inside the compute definition."""
    from tvm import te

    from tvm_memplan.quant import dot_kernels, kernels

    x = te.placeholder((1, 4, 5, 5), "int8", name="x")
    weight = te.placeholder((4, 1, 3, 3), "int8", name="w")
    bias = te.placeholder((4,), "int32", name="b")
    multiplier = te.placeholder((4,), "float32", name="m")
    window = {"strides": [1, 1], "padding": [1, 1, 1, 1], "dilation": [1, 1], "x_zero_point": 0}
    output = {"y_zero_point": 0, "low": -128, "high": 127, "out_dtype": "int8"}
    options = {**window, **output, **misspelled} if misspelled else {**window, "low": -128}
    expected = "unknown keyword residual_ad" if misspelled else "missing high, out_dtype, y_zero_point"
    with pytest.raises(TypeError, match=expected):
        kernels.conv2d(x, weight, bias, multiplier, groups=4, **options)
    with pytest.raises(TypeError, match=expected):
        dot_kernels.depthwise_conv2d(x, weight, bias, multiplier, **options)
    assert kernels.conv2d(x, weight, bias, multiplier, groups=4, **window, **output).shape[1] == 4
