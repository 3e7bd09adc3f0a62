"""The LowerQDQ pass: what it lowers, what it leaves in float, and whole networks in the pipeline."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_memplan
from tvm_memplan.frontend import LoadedModel, to_relax
from tvm_memplan.quant.lower import LowerQDQ
from tvm_memplan.quant.reference import lsb_difference, output_scales, run_onnxruntime
from tvm_memplan.verify import run_vm

from . import models


def _lower(qmodel):
    reports = []
    mod = LowerQDQ(reports.append)(to_relax(LoadedModel("m", qmodel)))
    return mod, reports[0]


def _ops(mod) -> list[str]:
    return [binding.value.op.name for block in mod["main"].body.blocks for binding in block.bindings]


def test_network_becomes_integer_kernels_with_int8_weights():
    mod, report = _lower(models.quantize_qdq(models.network()))
    assert not report.kept_float
    assert report.lowered == {
        "quantize+conv2d": 1,
        "conv2d": 1,
        "depthwise_conv2d": 1,
        "conv2d+add": 1,
        "max_pool2d": 2,
        "concat": 1,
        "mean": 1,
        "reshape": 1,
        "dense": 1,
    }
    ops = _ops(mod)
    assert ops.count("relax.dequantize") == 1  # only the output's
    assert "relax.nn.conv2d" not in ops and "relax.quantize" not in ops
    weights = [c.value.numpy() for c in _constants(mod) if c.value.numpy().ndim >= 2]
    assert len(weights) == 5 and all(w.dtype == np.int8 for w in weights)


def _constants(mod):
    found = []

    def visit(expr):
        if isinstance(expr, tvm.ir.GenericConst):
            found.append(expr)
        elif isinstance(expr, relax.Tuple):
            for field in expr.fields:
                visit(field)
        elif isinstance(expr, relax.Call):
            for arg in expr.args:
                visit(arg)

    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            visit(binding.value)
    return found


def test_float_model_is_left_alone():
    model = models.network()
    mod = to_relax(LoadedModel("f", model))
    assert LowerQDQ()(mod).same_as(mod)


def test_an_op_without_an_integer_kernel_stays_float():
    qmodel = models.quantize_qdq(models.after_conv("LeakyRelu"))
    mod, report = _lower(qmodel)
    assert report.kept_float == ["relax.nn.leakyrelu"]
    ops = _ops(mod)
    assert "relax.dequantize" in ops and "relax.nn.leakyrelu" in ops
    # the float LeakyRelu's output quantized as MLAS rounds; the input's quantized in the conv that reads it
    assert report.lowered["quantize"] == 1 and report.lowered["quantize+conv2d"] == 1


def test_an_op_kept_in_float_still_matches_onnxruntime():
    qmodel = models.quantize_qdq(models.after_conv("LeakyRelu"))
    loaded = LoadedModel("m", qmodel)
    executable = tvm.compile(to_relax(loaded), "llvm", relax_pipeline=tvm_memplan.pipeline("llvm", order="program"))
    (scale,) = output_scales(qmodel)
    for seed in range(3):
        inputs = loaded.random_inputs(seed)
        assert lsb_difference(run_vm(executable, inputs)[0][0], run_onnxruntime(qmodel, inputs)[0], scale) <= 1


def test_a_bias_with_another_scale_is_requantized_to_the_accumulator():
    """TorchScript exports share one bias between convs: the quantizer's bias scale is then not
    ``x_scale * w_scale`` for all of them. The bias is rescaled (at most 1 LSB from onnxruntime)."""
    from onnx import numpy_helper

    from .test_kernels import compare

    qmodel = models.quantize_qdq(models.conv())
    bias = next(n for n in qmodel.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == "b")
    scale = next(i for i in qmodel.graph.initializer if i.name == bias.input[1])
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * 2, scale.name))
    diff, lowered = compare(qmodel)
    assert lowered.get("conv2d") == 1 and diff <= 1


@pytest.mark.parametrize("activation", ["int8", "uint8"])
def test_compiled_with_the_pipeline_matches_onnxruntime_on_top_class(activation):
    """``tvm.compile(..., relax_pipeline=tvm_memplan.pipeline())`` lowers by default; on 20 random
    inputs the output is within onnxruntime's own spread and the top class agrees at least as often
    as onnxruntime's unoptimized run agrees with its default run."""
    qmodel = models.quantize_qdq(models.network(), activation=activation)
    target = tvm.target.Target("llvm")
    mod = to_relax(LoadedModel("net", qmodel))
    executable = tvm.compile(mod, target, relax_pipeline=tvm_memplan.pipeline(target, order="program"))
    (scale,) = output_scales(qmodel)
    rng = np.random.default_rng(5)
    ours_agree = theirs_agree = 0
    for _ in range(20):
        inputs = {"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}
        ours = run_vm(executable, inputs)[0][0]
        fused, plain = run_onnxruntime(qmodel, inputs)[0], run_onnxruntime(qmodel, inputs, optimized=False)[0]
        assert lsb_difference(ours, fused, scale) <= max(2, lsb_difference(plain, fused, scale))
        ours_agree += int(np.argmax(ours) == np.argmax(fused))
        theirs_agree += int(np.argmax(plain) == np.argmax(fused))
    assert ours_agree >= theirs_agree


def test_every_integer_kernel_gets_a_default_cpu_schedule():
    """The default CPU rules take the integer kernels too (pad + int32 reduction + requantizing
    epilogue is the structure ``tiled_reduction`` tiles); none is left as plain loops."""
    from tvm_memplan.planner import plan_model
    from tvm_memplan.schedule import DefaultCPUSchedule

    plan = plan_model(LoadedModel("net", models.quantize_qdq(models.network())), "llvm", order="program")
    reports = []
    with plan.target:
        DefaultCPUSchedule(plan.target, reports.append)(plan.planned)
    rules = reports[0].rules
    assert not reports[0].unscheduled
    assert any(
        name.startswith(("fused_qconv2d", "qconv2d")) and rule == "tiled_reduction" for name, rule in rules.items()
    )
    assert all(rule == "tiled_reduction" for name, rule in rules.items() if "qconv2d" in name)
    assert any("qdense" in name for name in rules)  # a 1-row dense: the generic rule, as the float one


def test_concat_of_another_scale_requantizes_in_the_producing_conv():
    """onnxruntime's QLinearConcat requantizes an input of another scale through a table; here the
    producing conv applies that table in its epilogue, so the concat can be eliminated (its inputs
    written in place) and no separate table kernel runs."""
    from onnx import helper

    from tvm_memplan.planner import plan_model

    rng = np.random.default_rng(4)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1] * 4),
        helper.make_node("Conv", ["x", "w2"], ["b"]),
        helper.make_node("Concat", ["a", "b"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "w3"], ["y"]),
    ]
    weights = {
        "w1": rng.standard_normal((4, 3, 3, 3)),
        "w2": rng.standard_normal((4, 3, 1, 1)) * 3,
        "w3": rng.standard_normal((2, 8, 1, 1)),
    }
    qmodel = models.quantize_qdq(models.float_model(nodes, weights, {"x": [1, 3, 8, 8]}, {"y": [1, 2, 8, 8]}))
    mod, report = _lower(qmodel)
    assert report.lowered.get("conv2d") == 3 and report.lowered.get("concat") == 1
    assert not [g for g in mod.functions if g.name_hint.startswith("qrequantize")]
    assert plan_model(LoadedModel("cat", qmodel), "llvm", order="program").main.concats_removed == 1
    from .test_kernels import compare

    assert compare(qmodel)[0] == 0  # the same two roundings as onnxruntime's table


@pytest.mark.parametrize("pads", [1, 0], ids=["padded", "unpadded"])
def test_the_first_conv_quantizes_the_network_input_itself(pads):
    """ShuffleNetV2 and MobileNetV3 peak at their stem: the quantized input (1 byte per element)
    and the first conv's output were live together, which the float build does not have (its float
    input is a parameter, outside the arena): 0.30x of the float arena instead of 0.25x. The first
    conv now quantizes its float input as it pads it: the arena is the conv's output only, with the
    same integers as onnxruntime's QuantizeLinear + QLinearConv."""
    from onnx import helper

    from tvm_memplan.planner import plan_model

    from .test_kernels import compare

    rng = np.random.default_rng(6)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[pads] * 4, strides=[2, 2]),
        helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    size = 32 + 2 * (1 - pads)
    qmodel = models.quantize_qdq(
        models.float_model(
            nodes, {"w": rng.standard_normal((8, 3, 3, 3))}, {"x": [1, 3, size, size]}, {"y": [1, 8, 8, 8]}
        )
    )
    mod, report = _lower(qmodel)
    assert report.lowered == {"quantize+conv2d": 1, "max_pool2d": 1}
    assert "relax.quantize" not in _ops(mod) and not [g for g in mod.functions if g.name_hint == "quantize_linear"]
    plan = plan_model(LoadedModel("stem", qmodel), None, order="program").main
    # the int8 conv output only (the pool and the output's dequantize are one kernel writing the
    # returned float tensor); with the input quantized apart, 3 * 32 * 32 more bytes
    assert plan.arena_bytes == 8 * 16 * 16
    assert compare(qmodel)[0] == 0
