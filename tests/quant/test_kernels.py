"""Each integer kernel against onnxruntime's default (fused integer) session on the same QDQ file.

Conv and Gemm/MatMul requantize exactly as MLAS does: they must be identical. Add, Mul, the pools
and lookup tables follow onnxruntime's float formulas (its own kernels use fixed point or sum in
another order): at most 1 LSB.
"""

from __future__ import annotations

import pytest

from tvm_memplan.frontend import LoadedModel, to_relax
from tvm_memplan.planner import plan_model
from tvm_memplan.quant.lower import LowerQDQ
from tvm_memplan.quant.reference import lsb_difference, output_scales, run_onnxruntime
from tvm_memplan.verify import run_vm

from . import models


def compare(qmodel, seeds=(0, 1)) -> tuple[int, dict[str, int]]:
    """Largest LSB difference from onnxruntime over random inputs, and what LowerQDQ lowered."""
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
    return worst, reports[0].lowered


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
    "Add": ({}, "add"),
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
