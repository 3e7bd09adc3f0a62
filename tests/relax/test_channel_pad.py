"""Channels padded to whole blocks: a network with 24 channels, a squeeze-and-excitation block and a
channel shuffle runs blocked throughout, with onnxruntime's outputs and the planned allocations."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import relax

from tvm_memplan.frontend import load_model, to_relax
from tvm_memplan.planner import plan_model
from tvm_memplan.relax.channel_pad import PadChannels, padded_channels
from tvm_memplan.relax.fold import FoldDataMovementConstants
from tvm_memplan.relax.layout import BlockedLayout, channel_block
from tvm_memplan.schedule.cpu import CpuSpec
from tvm_memplan.verify import verify_plan

from .modules import op_calls, save_graph

HOST = tvm.target.Target.from_device("cpu")
ODD_WEIGHTS = {
    "w0": [24, 3, 3, 3],
    "b0": [24],
    "wd": [24, 1, 3, 3],
    "bd": [24],
    "ws": [6, 24, 1, 1],
    "bs": [6],
    "we": [24, 6, 1, 1],
    "be": [24],
    "w1": [24, 24, 1, 1],
    "b1": [24],
    "wf": [10, 24],
    "bf": [10],
}


def _odd_channels_net(path) -> str:
    """A 3-channel stem to 24 channels, a depthwise conv, a squeeze-and-excitation block (global pool,
    conv to 6, ReLU, conv to 24, sigmoid, multiply), a residual add, a ShuffleNet channel shuffle
    (concat, reshape, transpose, reshape, split) and a classifier."""
    rng = np.random.default_rng(0)

    def init(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "wd", "bd"], ["cd"], pads=[1, 1, 1, 1], group=24),
        helper.make_node("Sigmoid", ["cd"], ["sd"]),
        helper.make_node("GlobalAveragePool", ["sd"], ["g"]),
        helper.make_node("Conv", ["g", "ws", "bs"], ["cs"]),
        helper.make_node("Relu", ["cs"], ["rs"]),
        helper.make_node("Conv", ["rs", "we", "be"], ["ce"]),
        helper.make_node("Sigmoid", ["ce"], ["gate"]),
        helper.make_node("Mul", ["sd", "gate"], ["m"]),
        helper.make_node("Add", ["m", "r0"], ["s"]),
        helper.make_node("Concat", ["s", "r0"], ["cat"], axis=1),
        helper.make_node("Reshape", ["cat", "groups"], ["g5"]),
        helper.make_node("Transpose", ["g5"], ["t5"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t5", "flat"], ["shuffled"]),
        helper.make_node("Split", ["shuffled", "halves"], ["h0", "h1"], axis=1),
        helper.make_node("Conv", ["h1", "w1", "b1"], ["c1"]),
        helper.make_node("Add", ["c1", "h0"], ["s1"]),
        helper.make_node("GlobalAveragePool", ["s1"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    constants = [
        numpy_helper.from_array(np.array(value, np.int64), name)
        for name, value in (("groups", [1, 2, 24, 8, 8]), ("flat", [1, 48, 8, 8]), ("halves", [24, 24]))
    ]
    weights = [init(name, shape) for name, shape in ODD_WEIGHTS.items()]
    return save_graph(path, "odd_channels", nodes, ([1, 3, 16, 16], [1, 10]), weights + constants)


def test_channels_round_up_to_whole_blocks() -> None:
    assert [padded_channels(c, 16) for c in (3, 16, 24, 58, 116)] == [16, 16, 32, 64, 128]


def test_padded_convolutions_have_zero_weights_and_the_real_channels_are_sliced_out(tmp_path) -> None:
    mod = to_relax(load_model(_odd_channels_net(tmp_path / "odd.onnx")))
    with HOST:
        padded = PadChannels(16)(FoldDataMovementConstants()(mod))
    convs = op_calls(padded, "relax.nn.conv2d")
    assert all(c.ty.shape[1] % 16 == 0 for c in convs)  # every output padded to whole blocks
    stem = convs[0]
    assert [int(d) for d in stem.args[1].ty.shape] == [32, 3, 3, 3]  # the stem's 3 inputs stay as they are
    assert not np.any(stem.args[1].value.numpy()[24:])
    squeeze = convs[2]
    assert [int(d) for d in squeeze.args[1].ty.shape] == [16, 32, 1, 1]
    assert not np.any(squeeze.args[1].value.numpy()[:, 24:]) and not np.any(squeeze.args[1].value.numpy()[6:])
    # the concat reads the real channels; the split halves are padded back in for the last conv
    assert len(op_calls(padded, "relax.strided_slice")) >= 2
    assert len(op_calls(padded, "relax.nn.pad")) == 1


def test_no_convolution_is_left_in_nchw_and_the_stem_reads_nchw1c(tmp_path) -> None:
    mod = to_relax(load_model(_odd_channels_net(tmp_path / "odd.onnx")))
    with HOST:
        blocked = BlockedLayout(8)(FoldDataMovementConstants()(mod))
    assert not op_calls(blocked, "relax.nn.conv2d")
    kernels = [call.args[0].name_hint for call in op_calls(blocked, "relax.call_tir")]
    assert sum(name.startswith("conv2d_nchwc") for name in kernels) == 4
    assert sum(name.startswith("depthwise_conv2d_nchwc") for name in kernels) == 1
    # the network's input becomes NCHW1c by a reshape (a view), not a copy
    transforms = op_calls(blocked, "relax.layout_transform")
    assert not any(c.args[0].same_as(blocked["main"].params[0]) for c in transforms)


def test_an_odd_channels_net_runs_blocked_as_onnxruntime_with_the_planned_allocations(tmp_path) -> None:
    if channel_block(HOST) is None:
        pytest.skip("this CPU has no vectors of 8 or more float32 lanes")
    model = load_model(_odd_channels_net(tmp_path / "odd.onnx"))
    plan = plan_model(model, HOST, layout="blocked", order="program")
    kernels = [gv.name_hint for gv, f in plan.planned.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert any("conv2d_nchwc" in name for name in kernels)
    result = verify_plan(plan, stock=False)
    assert result.problems == []  # onnxruntime's outputs; the VM's requests are the plan
    assert result.trace_matches_plan


def _conv_divide_conv(divisor: np.ndarray) -> tvm.IRModule:
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 4, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            c0 = bb.emit(relax.op.nn.conv2d(x, relax.const(rng.standard_normal((24, 16, 1, 1)).astype("float32"))))
            scaled = bb.emit(relax.op.divide(c0, relax.const(divisor)))
            weights = relax.const(rng.standard_normal((16, 24, 1, 1)).astype("float32"))
            out = bb.emit_output(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(scaled, weights))))
        bb.emit_func_output(out)
    return bb.get()


def test_a_per_channel_divisor_is_padded_with_ones_and_one_with_zeros_is_not_carried() -> None:
    divisor = np.linspace(1, 2, 24, dtype="float32").reshape(1, 24, 1, 1)
    padded = PadChannels(16)(_conv_divide_conv(divisor))
    (divide,) = op_calls(padded, "relax.divide")
    value = divide.args[1].value.numpy()
    assert value.shape == (1, 32, 1, 1) and np.all(value[:, 24:] == 1)  # padded channels stay finite
    assert not op_calls(padded, "relax.strided_slice")
    divisor[0, 3] = 0
    padded = PadChannels(16)(_conv_divide_conv(divisor))
    (divide,) = op_calls(padded, "relax.divide")
    assert divide.args[1].ty.shape[1] == 24  # real channels, sliced out of the padded conv
    assert len(op_calls(padded, "relax.strided_slice")) == 1


def _conv_104(path) -> str:
    """A 3x3 convolution of 64 to 104 channels (13 blocks of 8) at 14x14, a ReLU and a global pool."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)
        for name, shape in (("w", [104, 64, 3, 3]), ("b", [104]))
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["y"]),
    ]
    return save_graph(path, "conv_104", nodes, ([1, 64, 14, 14], [1, 104, 1, 1]), weights)


AVX2_SPEC = CpuSpec(lanes=8, registers=16, threads=1, vector_codegen=True)
AVX512_SPEC = CpuSpec(lanes=16, registers=32, threads=1, vector_codegen=True)


@pytest.mark.parametrize(("block", "spec", "channels"), [(8, AVX2_SPEC, 112), (8, None, 104), (16, AVX512_SPEC, 112)])
def test_output_blocks_no_register_tile_divides_get_one_more_block_of_zero_weights(
    tmp_path, block, spec, channels
) -> None:
    """13 blocks of 8 take one-block register tiles, bound by loads at AVX2's 16 registers: 14 blocks are
    computed and the real 104 channels sliced out after the pool. At AVX-512, 104 channels are 7 blocks of 16."""
    mod = to_relax(load_model(_conv_104(tmp_path / "c.onnx")))
    (conv,) = op_calls(PadChannels(block, spec)(FoldDataMovementConstants()(mod)), "relax.nn.conv2d")
    kernel = conv.args[1].value.numpy()
    assert kernel.shape[0] == channels and not np.any(kernel[104:])


def test_a_convolution_padded_for_its_register_tiles_runs_as_onnxruntime_with_the_planned_allocations(
    tmp_path,
) -> None:
    if channel_block(HOST) is None:
        pytest.skip("this CPU has no vectors of 8 or more float32 lanes")
    avx2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})
    plan = plan_model(load_model(_conv_104(tmp_path / "c.onnx")), avx2, layout="blocked", order="program")
    shapes = [
        [int(d) for d in p.shape]
        for f in plan.planned.functions.values()
        if isinstance(f, tvm.tirx.PrimFunc)
        for p in f.params
    ]
    assert [14, 8, 3, 3, 8, 8] in shapes  # 14 blocks of weights: 14 computed, the real 13 written
    result = verify_plan(plan, stock=False)
    assert result.problems == []
    assert result.trace_matches_plan
