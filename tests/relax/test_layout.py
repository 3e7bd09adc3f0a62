"""Blocked channel layouts: which targets get them, the packed weights, and a small network that runs
in NCHW[x]c with onnxruntime's outputs and the planned allocations."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax, te, topi

from tvm_memplan.frontend import load_model, to_relax
from tvm_memplan.options import MemplanOptions
from tvm_memplan.planner import plan_model
from tvm_memplan.relax.fold import fold_call
from tvm_memplan.relax.layout import BlockedLayout, channel_block, clip_bound_op, layout_block
from tvm_memplan.verify import verify_plan

from .modules import op_calls, save_graph

HOST = tvm.target.Target.from_device("cpu")


@pytest.mark.parametrize(
    "target, block",
    [
        ({"kind": "llvm", "mcpu": "skylake-avx512"}, 16),
        ({"kind": "llvm", "mcpu": "znver4"}, 16),
        ({"kind": "llvm", "mcpu": "haswell"}, 8),
        ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}, None),
        ({"kind": "c", "mcpu": "skylake-avx512"}, None),
    ],
)
def test_the_block_is_the_vector_width_of_the_targets_isa(target: dict, block: int | None) -> None:
    assert channel_block(tvm.target.Target(target)) == block


@pytest.mark.parametrize(
    "target, layout, block",
    [
        ({"kind": "llvm", "mcpu": "skylake-avx512"}, "auto", 16),
        ({"kind": "llvm", "mcpu": "haswell"}, "blocked", 8),
        ({"kind": "llvm", "mcpu": "skylake-avx512"}, "nchw", None),
        ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}, "auto", None),
        ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}, "blocked", 4),
        ({"kind": "c", "mcpu": "skylake-avx512"}, "auto", None),
        ({"kind": "cuda"}, "auto", None),
    ],
)
def test_the_default_layout_blocks_only_llvm_targets_with_a_block(target: dict, layout: str, block) -> None:
    assert MemplanOptions().layout == "auto"
    assert layout_block(tvm.target.Target(target), layout) == block


def test_packed_weights_fold_as_tvm_maps_them() -> None:
    weights = np.random.default_rng(0).standard_normal((32, 16, 3, 3)).astype("float32")
    index_map = tvm.tirx.IndexMap.from_func(lambda o, i, h, w: (o // 16, i // 8, h, w, i % 8, o % 16))
    call = relax.BlockBuilder().normalize(relax.op.layout_transform(relax.const(weights), index_map))
    by_tvm = index_map.map_tensor(tvm.runtime.tensor(weights)).numpy()
    np.testing.assert_array_equal(fold_call(call).value.numpy(), by_tvm)


def _residual_net(path) -> str:
    """A stem whose 3 input channels no block divides (read as NCHW1c), a 3x3 conv with ReLU6 (the frontend's Clip is a
    call_tir), a pool, a depthwise and a 1x1 conv, a residual add and a classifier."""
    rng = np.random.default_rng(0)

    def init(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p", "wd", "bd"], ["cd"], pads=[1, 1, 1, 1], group=32),
        helper.make_node("Clip", ["cd", "lo", "hi"], ["rd"]),
        helper.make_node("Conv", ["rd", "w2", "b2"], ["c2"]),
        helper.make_node("Add", ["c2", "p"], ["s"]),
        helper.make_node("Relu", ["s"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    shapes = {"w0": [16, 3, 3, 3], "w1": [32, 16, 3, 3], "wd": [32, 1, 3, 3], "w2": [32, 32, 1, 1], "wf": [10, 32]}
    shapes.update({"b0": [16], "b1": [32], "bd": [32], "b2": [32], "bf": [10]})
    bounds = [numpy_helper.from_array(np.array(v, np.float32), name) for name, v in (("lo", 0), ("hi", 0.5))]
    initializers = [init(name, shape) for name, shape in shapes.items()] + bounds
    return save_graph(path, "residual", nodes, ([1, 3, 20, 20], [1, 10]), initializers)


def test_a_residual_net_runs_blocked_as_onnxruntime_with_the_planned_allocations(tmp_path) -> None:
    block = channel_block(HOST)
    if block is None:
        pytest.skip("this CPU has no vectors of 8 or more float32 lanes")
    model = load_model(_residual_net(tmp_path / "residual.onnx"))
    plan = plan_model(model, HOST, layout="blocked", order="program")
    kernels = [gv.name_hint for gv, f in plan.planned.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    # the stem reads its 3 channels as NCHW1c and writes blocks
    assert sum("conv2d_nchwc" in name for name in kernels) == 4
    assert sum("depthwise_conv2d_nchwc" in name for name in kernels) == 1
    result = verify_plan(plan, stock=False)
    assert result.problems == []  # onnxruntime's outputs; the VM's requests are the plan
    assert result.trace_matches_plan


def test_only_activations_are_transformed_weights_are_packed_constants(tmp_path) -> None:
    mod = to_relax(load_model(_residual_net(tmp_path / "residual.onnx")))
    with HOST:
        blocked = BlockedLayout(16)(mod)
    transforms = op_calls(blocked, "relax.layout_transform")
    assert transforms and not any(isinstance(c.args[0], tvm.ir.GenericConst) for c in transforms)
    # the stem reads NCHW1c (a reshape of the input) and writes blocks; out of them before the classifier
    assert sorted(c.ty.ndim for c in transforms) == [4]
    assert not op_calls(blocked, "relax.nn.conv2d")  # none left to LegalizeOps
    # the Clips' bounds are Relax ops that carry the layout, their PrimFuncs gone
    assert len(op_calls(blocked, "relax.maximum")) == len(op_calls(blocked, "relax.minimum")) == 2
    assert not any(gv.name_hint.startswith(("maximum", "minimum")) for gv in blocked.get_global_vars())


def test_a_clip_bound_is_recognized_and_other_kernels_are_not() -> None:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 2, 2), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            bound = bb.emit_te(topi.maximum, x, relax.const(0.0, "float32"))
            tensor_max = bb.emit_te(topi.maximum, x, x)
            shifted = bb.emit_te(lambda t: te.compute(t.shape, lambda *i: tvm.te.max(t(*i), 1.0)), x)
            out = bb.emit_output(relax.op.add(relax.op.add(bound, tensor_max), shifted))
        bb.emit_func_output(out)
    functions = {gv.name_hint: f for gv, f in bb.get().functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert [name for name, f in sorted(functions.items()) if clip_bound_op(f) is not None] == ["maximum"]


def test_a_hardswish_stays_in_the_blocked_layout(tmp_path) -> None:
    """HardSwish (``x * clip(x + 3, 0, 6) / 6``, a ``relax.clip`` from the frontend) between two blocked
    convolutions: the only transforms are the network's input and output."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
        for n, s in (("w0", [32, 16, 1, 1]), ("w1", [16, 32, 1, 1]))
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"]),
        helper.make_node("HardSwish", ["c0"], ["h"]),
        helper.make_node("Conv", ["h", "w1"], ["y"]),
    ]
    shape = [1, 16, 8, 8]
    graph = helper.make_graph(
        nodes,
        "hardswish",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        weights,
    )
    path = tmp_path / "hardswish.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    mod = to_relax(load_model(str(path)))
    assert len(op_calls(mod, "relax.clip")) == 1
    with HOST:
        blocked = BlockedLayout(16)(mod)
    assert not op_calls(blocked, "relax.clip")
    assert len(op_calls(blocked, "relax.layout_transform")) == 2


def _dense_block(path) -> str:
    """DenseNet's pre-activation as torchvision exports it: a concat of two convolutions' outputs, an unfolded
    BatchNormalization and a ReLU before the next convolution."""
    rng = np.random.default_rng(0)

    def init(name, shape, low=-0.5):
        return numpy_helper.from_array(rng.uniform(low, 0.5, shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c0", "w1"], ["c1"]),
        helper.make_node("Concat", ["c0", "c1"], ["cat"], axis=1),
        helper.make_node("BatchNormalization", ["cat", "gamma", "beta", "mean", "var"], ["n"], epsilon=1e-5),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1]),
    ]
    shapes = {"w0": [16, 8, 3, 3], "w1": [16, 16, 1, 1], "w2": [16, 32, 3, 3], "gamma": [32], "beta": [32]}
    shapes.update({"mean": [32]})
    initializers = [init(name, shape) for name, shape in shapes.items()] + [init("var", [32], low=0.1)]
    return save_graph(path, "dense_block", nodes, ([1, 8, 12, 12], [1, 16, 12, 12]), initializers)


def test_an_unfolded_batch_norm_stays_in_the_blocked_layout(tmp_path) -> None:
    """Relax's ``batch_norm`` only runs in NCHW; as a multiply and an add by constants it carries the block, so
    the only transforms are the network's input and output."""
    mod = to_relax(load_model(_dense_block(tmp_path / "dense.onnx")))
    assert op_calls(mod, "relax.nn.batch_norm")
    with HOST:
        blocked = BlockedLayout(8)(mod)
    assert not op_calls(blocked, "relax.nn.batch_norm")
    assert len(op_calls(blocked, "relax.layout_transform")) == 2


def test_a_dense_block_runs_blocked_as_onnxruntime_with_the_planned_allocations(tmp_path) -> None:
    if channel_block(HOST) is None:
        pytest.skip("this CPU has no vectors of 8 or more float32 lanes")
    plan = plan_model(load_model(_dense_block(tmp_path / "dense.onnx")), HOST, layout="blocked", order="program")
    result = verify_plan(plan, stock=False)
    assert result.problems == []
    assert result.trace_matches_plan


def _fire_module(path) -> str:
    """SqueezeNet's fire module on a 16-channel input: two expand convolutions read the input, a concat joins them,
    a squeeze convolution reduces them."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["e1"]),
        helper.make_node("Relu", ["e1"], ["r1"]),
        helper.make_node("Conv", ["x", "w3"], ["e3"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["e3"], ["r3"]),
        helper.make_node("Concat", ["r1", "r3"], ["c"], axis=1),
        helper.make_node("Conv", ["c", "ws"], ["y"]),
    ]
    shapes = {"w1": [32, 16, 1, 1], "w3": [32, 16, 3, 3], "ws": [16, 64, 1, 1]}
    initializers = [
        numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(np.float32), n) for n, s in shapes.items()
    ]
    return save_graph(path, "fire", nodes, ([1, 16, 12, 12], [1, 16, 12, 12]), initializers)


def test_an_input_read_by_two_blocked_convolutions_is_transformed_once(tmp_path) -> None:
    """ConvertLayout transforms an input once per blocked consumer; a split chain measured alone read its input
    through one transform per tile."""
    model = load_model(_fire_module(tmp_path / "fire.onnx"))
    with HOST:
        blocked = BlockedLayout(16)(to_relax(model))
    param = blocked["main"].params[0]
    transforms = op_calls(blocked, "relax.layout_transform")
    assert len([c for c in transforms if c.args[0].same_as(param)]) == 1
    assert len(transforms) == 2  # the input into blocks, the output out of them
    if channel_block(HOST) is None:
        pytest.skip("this CPU has no vectors of 8 or more float32 lanes")
    plan = plan_model(model, HOST, layout="blocked", order="program")
    result = verify_plan(plan, stock=False)
    assert result.problems == []
    assert result.trace_matches_plan
