"""Real third-party exports (torchvision stems, TorchScript and dynamo exporters) quantized by
onnxruntime's quantize_static: every group lowered, the int8 arena a quarter of the float one,
verified against onnxruntime within its own spread and against the VM's requests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from tvm_memplan.frontend import LoadedModel, to_relax
from tvm_memplan.planner import plan_model
from tvm_memplan.quant.lower import LowerQDQ
from tvm_memplan.quant.reference import run_onnxruntime, top_class_agreement
from tvm_memplan.verify import run_vm, verify_plan

from . import models

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize(
    "name",
    [
        "torchvision_efficientnet_b0_stem.dynamo",  # SiLU (sigmoid quantized in between) and squeeze-excite
        "torchvision_mobilenet_v2_stem.torchscript",  # one bias tensor shared by several convs
        "torchvision_shufflenet_v2_unit.torchscript",  # channel split, shuffle (reshape/transpose), concat
    ],
)
def test_quantized_export_is_lowered_and_verified(name):
    float_model = onnx.load(str(FIXTURES / f"{name}.onnx"))
    qmodel = models.quantize_qdq(float_model, samples=2)
    reports = []
    LowerQDQ(reports.append)(to_relax(LoadedModel(name, qmodel)))
    assert not reports[0].kept_float
    float_arena = plan_model(LoadedModel(name, float_model), None, order="program").main.arena_bytes
    plan = plan_model(LoadedModel(name, qmodel), None, order="program")
    assert plan.main.arena_bytes <= 0.26 * float_arena
    result = verify_plan(plan, stock=False)
    assert result.ok, result.problems
    assert result.max_lsb_diff_vs_onnxruntime <= result.tolerance_lsb


@pytest.mark.parametrize(
    "name",
    [
        "torchvision_mobilenet_v2_stem.torchscript",
        "torchvision_shufflenet_v2_unit.torchscript",
    ],
)
def test_top_class_agrees_with_onnxruntime_at_least_as_often_as_its_unoptimized_run(name):
    """The issue's rule on 20 random inputs, on a torchvision stem with a 10-class head."""
    float_model = models.with_classifier(onnx.load(str(FIXTURES / f"{name}.onnx")))
    qmodel = models.quantize_qdq(float_model, samples=2)
    loaded = LoadedModel(name, qmodel)
    executable = plan_model(loaded, None, order="program").build()
    ours, default, unoptimized = [], [], []
    for seed in range(20):
        inputs = loaded.random_inputs(seed)
        ours.append(run_vm(executable, inputs)[0][0])
        default.append(run_onnxruntime(qmodel, inputs)[0])
        unoptimized.append(run_onnxruntime(qmodel, inputs, optimized=False)[0])
    assert len({int(np.argmax(logits)) for logits in default}) > 2  # the inputs pick different classes
    agreement = top_class_agreement(ours, default, unoptimized)
    assert agreement.inputs == 20
    assert agreement.ok, agreement


def test_efficientnet_stem_is_identical_where_onnxruntime_runs_integer_operators(tmp_path):
    """With uint8 activations onnxruntime's default run executes EfficientNet-B0's SiLU, squeeze-excite
    and residual add as integer operators (QLinearConv, QLinearSigmoid, QLinearMul, QLinearAdd; only
    ReduceMean stays float): our kernels give the same integers. With int8 activations it keeps the
    convs that SiLU reads in float, whose float32 sums break rounding ties their own way (see
    :mod:`tvm_memplan.quant.reference`)."""
    import onnxruntime as ort

    name = "torchvision_efficientnet_b0_stem.dynamo"
    qmodel = models.quantize_qdq(onnx.load(str(FIXTURES / f"{name}.onnx")), activation="uint8", samples=2)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(qmodel.SerializeToString(), options, providers=["CPUExecutionProvider"])
    fused = {node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node}
    assert {"QLinearConv", "QLinearSigmoid", "QLinearMul", "QLinearAdd"} <= fused
    assert not fused & {"Conv", "Sigmoid", "Mul", "Add"}
    loaded = LoadedModel(name, qmodel)
    executable = plan_model(loaded, None, order="program").build()
    for seed in range(4):
        inputs = loaded.random_inputs(seed)
        ours = run_vm(executable, inputs)[0][0]
        np.testing.assert_array_equal(ours, run_onnxruntime(qmodel, inputs)[0])
