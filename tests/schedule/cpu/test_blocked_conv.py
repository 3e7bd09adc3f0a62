"""The blocked-convolution rule: it schedules the NCHW[x]c kernels of the blocked layout, computes
what they compute, and its register tile fits the register file."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import tirx

from tvm_memplan.schedule import CpuSpec, schedule_function
from tvm_memplan.schedule.cpu.blocked_conv import balanced, channel_tiles, register_tile, tile_padded_blocks

from ...kernels import conv_body, kernels_of

AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})
AVX512_TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
AVX512 = CpuSpec(lanes=16, registers=32, threads=2, vector_codegen=True)


def _run(func: tirx.PrimFunc) -> np.ndarray:
    host = tvm.target.Target.from_device("cpu")
    lib = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=host)
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.shape]).astype("float32")) for p in func.params]
    lib["main"](*args)
    return args[-1].numpy()


@pytest.mark.parametrize(
    "body, shape",
    [
        (conv_body(32, 3, padding=1), (1, 16, 14, 14)),  # rows first
        (conv_body(32, 1, activation="relu6"), (1, 16, 28, 28)),
        (conv_body(16, 3, stride=2, padding=1, activation=None), (1, 16, 13, 13)),  # odd width, a stride
        (conv_body(64, 3, padding=1), (1, 64, 4, 4)),  # weights outweigh inputs: channel tiles first
        (conv_body(32, 3, padding=1, groups=2), (1, 32, 6, 6)),  # 16 channels a group
        (conv_body(32, 3, padding=1), (1, 16, 13, 13)),  # 13 columns: a narrower last tile at 8 lanes
        (conv_body(64, 1), (1, 64, 7, 7)),  # 1x1 at 7x7: tiles across rows at 8 lanes, a narrower last tile
        (conv_body(64, 1), (1, 64, 6, 6)),  # 1x1 at 6x6: tiles across rows that divide the 36 positions
        (conv_body(64, 1), (1, 64, 10, 9)),
        (conv_body(64, 3, padding=1), (1, 64, 7, 7)),  # 3x3 at 7x7: padded rows read across the run
        (conv_body(64, 3, stride=2, padding=1, activation="relu6"), (1, 64, 14, 13)),  # stride 2 to 7x7
    ],
)
@pytest.mark.parametrize("spec", [AVX512, CpuSpec(lanes=8, registers=16, threads=1, vector_codegen=True)])
def test_blocked_kernels_compute_what_the_unscheduled_ones_compute(body, shape, spec: CpuSpec) -> None:
    kernels = kernels_of(body, shape, AVX2, layout="blocked")
    convs = {name: func for name, func in kernels.items() if name.startswith("fused_conv2d_nchwc")}
    assert convs, f"no blocked convolution among {sorted(kernels)}"
    for name, func in convs.items():
        new_func, rule = schedule_function(func, spec)
        assert rule == "blocked_conv", f"{name} scheduled by {rule}"
        np.testing.assert_allclose(_run(new_func), _run(func), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stride", [1, 2])
def test_blocked_depthwise_kernels_are_tiled_reductions_along_the_block(stride: int) -> None:
    kernels = kernels_of(
        conv_body(32, 3, stride=stride, padding=1, groups=32, activation="relu6"),
        (1, 32, 14, 14),
        AVX2,
        layout="blocked",
    )
    (func,) = (f for name, f in kernels.items() if "depthwise_conv2d_nchwc" in name)
    new_func, rule = schedule_function(func, AVX512)
    assert rule == "tiled_reduction"
    np.testing.assert_allclose(_run(new_func), _run(func), rtol=1e-4, atol=1e-4)


def test_blocked_kernels_are_parallel_vectorized_and_register_tiled() -> None:
    (func,) = (
        f
        for name, f in kernels_of(conv_body(32, 3, padding=1), (1, 16, 28, 28), AVX2, "blocked").items()
        if "conv2d_nchwc" in name
    )
    script = schedule_function(func, AVX512)[0].script()
    assert "T.parallel" in script and "T.vectorized" in script and "T.unroll" in script
    assert 'scope="local"' in script


@pytest.mark.parametrize("spec", [AVX512, CpuSpec(lanes=8, registers=16, threads=1, vector_codegen=True)])
@pytest.mark.parametrize("channels, columns", [(4, 56), (16, 7), (1, 13), (8, 28), (2, 1)])
def test_the_register_tile_fits_the_registers_and_divides_the_output(channels, columns, spec: CpuSpec) -> None:
    channel_tile, column_tile = register_tile(channels, columns, 1, spec)
    assert channels % channel_tile == 0 and columns % column_tile == 0
    accumulators = channel_tile * column_tile
    assert accumulators <= spec.accumulators and accumulators + channel_tile + 1 <= spec.registers


@pytest.mark.parametrize(
    "channels, columns, spec, tile",
    [
        (4, 56, AVX512, (4, 4)),  # 16 FMAs for 8 loads; 4 x 7 (28 + 4 weights + a broadcast) spills
        (16, 14, AVX512, (2, 14)),  # 28 accumulators
        (16, 7, CpuSpec(lanes=8, registers=16, threads=1, vector_codegen=True), (1, 7)),  # 12 accumulators at most
    ],
)
def test_the_register_tile_has_the_most_multiply_adds_per_load(channels, columns, spec: CpuSpec, tile) -> None:
    assert register_tile(channels, columns, 1, spec) == tile


@pytest.mark.parametrize(
    "channels, columns, spec, tile",
    [
        (4, 13, CpuSpec(lanes=8, registers=16, threads=1, vector_codegen=True), (2, 5)),  # 4 x 1 divides
        (6, 109, AVX512, (2, 8)),  # 109 is prime: 3 x 1 divides; 13 x 8 and a 5-column tail
        (16, 13, AVX512, (2, 13)),  # 2 x 13 divides, as fast as any tile with a tail
        (128, 14, CpuSpec(lanes=8, registers=16, threads=1, vector_codegen=True), (2, 5)),  # 4 x 2 divides
    ],
)
def test_a_width_no_good_tile_divides_gets_a_narrower_last_tile(channels, columns, spec: CpuSpec, tile) -> None:
    assert register_tile(channels, columns, 1, spec, tails=True) == tile
    channel_tile, column_tile = tile
    assert channels % channel_tile == 0
    assert channel_tile * column_tile <= spec.accumulators and channel_tile * (column_tile + 1) + 1 <= spec.registers


AVX2_SPEC = CpuSpec(lanes=8, registers=16, threads=1, vector_codegen=True)


@pytest.mark.parametrize(
    "channels, columns, spec, reduction, tile",
    [
        (8, 56, AVX2_SPEC, 64, (2, 4)),  # a 1x1 of 64 channels: the tail's row costs more than 2 x 6 saves
        (8, 56, AVX2_SPEC, 576, (2, 6)),  # a 3x3 of 64 channels: 2 x 6 and a 2-column tail
        (16, 28, AVX2_SPEC, 128, (2, 4)),
        (16, 28, AVX2_SPEC, 512, (2, 6)),
        (15, 14, AVX2_SPEC, 40, (3, 3)),  # short, but the dividing 3 x 2 waits on the latency: 3 x 3 and a tail
        (4, 56, AVX512, 576, (4, 4)),  # 16 accumulators cover the latency: no tail at 32 registers
    ],
)
def test_a_tail_is_taken_where_the_reduction_is_long_enough_to_pay_for_it(
    channels, columns, spec: CpuSpec, reduction, tile
) -> None:
    assert register_tile(channels, columns, 1, spec, tails=True, reduction=reduction) == tile
    assert columns % register_tile(channels, columns, 1, spec, tails=False, reduction=reduction)[1] == 0


@pytest.mark.parametrize(
    "body, shape, positions, flattens",
    [
        (conv_body(64, 1), (1, 64, 7, 7), 49, True),  # 2 x 4 and 2 x 3 a row; 2 x 6 tiles across the 49 positions
        (conv_body(64, 1, stride=2), (1, 64, 14, 14), 49, True),  # every other position
        (conv_body(64, 3, padding=1), (1, 64, 7, 7), 49, True),  # its neighbours
        (conv_body(64, 1), (1, 64, 56, 56), 3136, False),  # 2 x 6 fits a row; the run's accumulators would not fit L1
    ],
)
def test_a_convolution_with_narrow_rows_tiles_its_positions_across_rows(body, shape, positions, flattens) -> None:
    (func,) = (f for name, f in kernels_of(body, shape, AVX2, "blocked").items() if "conv2d_nchwc" in name)
    new_func, rule = schedule_function(func, AVX2_SPEC)
    assert rule == "blocked_conv"
    assert (f"T.int64({positions})" in new_func.script()) == flattens


@pytest.mark.parametrize(("kernel", "lanes"), [(3, 16), (5, 16), (5, 8)])
def test_a_blocked_depthwise_input_is_read_in_place_by_whole_vectors_with_a_narrower_tile(kernel, lanes) -> None:
    """The padded input is read in place (a bounds check per channel vector: no staged copy, no zero fill), and
    the register tile keeps to 16 registers: 7 of the 14 columns at 32 registers."""
    kernels = kernels_of(conv_body(32, kernel, padding=kernel // 2, groups=32), (1, 32, 14, 14), AVX2, layout="blocked")
    (func,) = (f for name, f in kernels.items() if "depthwise_conv2d_nchwc" in name)
    new_func, _ = schedule_function(func, CpuSpec(lanes=lanes, registers=32, threads=1, vector_codegen=True))
    script = new_func.script()
    assert "pad_const" not in script and "T.if_then_else" in script and 'T.sblock("data_pad")' not in script
    assert "T.unroll(T.int64(7))" in script and "T.unroll(T.int64(14))" not in script
    np.testing.assert_allclose(_run(new_func), _run(func), rtol=1e-4, atol=1e-4)


def test_a_rows_task_runs_its_channel_tiles_outside_its_column_tiles() -> None:
    """Within an output row, one channel tile's weights serve every column tile before the next tile's are read."""
    (func,) = (
        f
        for name, f in kernels_of(conv_body(64, 1), (1, 16, 28, 28), AVX2, "blocked").items()
        if "conv2d_nchwc" in name
    )
    script = schedule_function(func, AVX512)[0].script()
    assert "for oc_0, ow_0 in T.grid" in script  # tasks: rows (parallel); in a row, channel tiles, then columns


@pytest.mark.parametrize(
    ("body", "shape", "tasks"),
    [
        # 2 MiB of weights, 392 KiB of input: channel tiles, so that the weights are read once (by rows, once
        # per output row from beyond L2)
        (conv_body(1024, 1, stride=2), (1, 512, 14, 14), "b_oc_0"),
        # 576 KiB of weights, 1.6 MiB of padded input: rows, so that the input is read once (by channel tiles,
        # once per tile from beyond L2)
        (conv_body(128, 3, stride=2, padding=1), (1, 128, 56, 56), "b_oh"),
    ],
)
def test_the_tasks_reread_what_fits_the_l2_cache(body, shape, tasks) -> None:
    """Where the weights or the input fit L2 and the other does not, the tasks reread the one that fits."""
    (func,) = (f for name, f in kernels_of(body, shape, AVX512_TARGET, "blocked").items() if "conv2d_nchwc" in name)
    new_func, rule = schedule_function(func, AVX512)
    assert rule == "blocked_conv"
    parallel = re.findall(r"for (\w+) in T\.parallel", new_func.script())[-1]  # after the padding's
    assert parallel.startswith(tasks), parallel
    np.testing.assert_allclose(_run(new_func), _run(func), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(1, 64, 13, 13), (1, 256, 7, 7), (1, 32, 27, 27)])
def test_the_threads_get_tasks_alike(shape) -> None:
    """A parallel loop is split statically: an odd number of tasks under 16 (13 rows) leaves a thread idle for
    one task's time, so more loops join the tasks."""
    spec = CpuSpec(lanes=8, registers=16, threads=2, vector_codegen=True)
    (func,) = (f for name, f in kernels_of(conv_body(64, 1), shape, AVX2, "blocked").items() if "conv2d_nchwc" in name)
    new_func, rule = schedule_function(func, spec)
    assert rule == "blocked_conv"
    tasks = [int(n) for n in re.findall(r"T\.parallel\(T\.int64\((\d+)\)\)", new_func.script())]
    assert tasks and all(balanced(n, 2) for n in tasks), tasks
    np.testing.assert_allclose(_run(new_func), _run(func), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("tasks", "expected"), [(13, False), (14, True), (6, False), (17, True), (15, False)])
def test_balanced_tasks(tasks, expected) -> None:
    assert balanced(tasks, 2) == expected
    assert balanced(tasks, 1) == (tasks >= 4)


@pytest.mark.parametrize(
    ("blocks", "columns", "reduction", "spec", "padded"),
    [
        (125, 13, 512, AVX2_SPEC, 126),  # SqueezeNet's 1000 classes: 1 x 7 tiles bound by loads; 126 take 2 x 5
        (13, 14, 576, AVX2_SPEC, 14),
        (13, 14, 576, AVX512, 13),  # 1 x 14 loses less than a 13th block costs
        (5, 7, 100, AVX2_SPEC, 5),  # a sixth block costs more than 3 x 4 saves
        (24, 56, 576, AVX2_SPEC, 24),  # 3 x 4 divides
        (3, 56, 576, AVX2_SPEC, 3),  # a tile of all the blocks
        (5, 1, 288, AVX2_SPEC, 5),  # one column: a matrix-vector product, bound by its weight loads
    ],
)
def test_output_blocks_no_tile_divides_get_one_more_where_the_cycle_model_says_so(
    blocks, columns, reduction, spec: CpuSpec, padded
) -> None:
    assert tile_padded_blocks(blocks, columns, reduction, spec) == padded
    channel_tile, _ = register_tile(padded, columns, 1, spec, tails=True, reduction=reduction)
    assert channel_tile > 1 or padded == blocks


@pytest.mark.parametrize(
    ("channels", "spec", "tiles"),
    [
        (5, AVX512, [1, 5]),  # 80 channels at 16 lanes: 5 x 4 instead of 1 x 28
        (7, AVX512, [1, 7]),  # 7 x 3: 21 accumulators, 7 weights and a broadcast
        (13, AVX512, [1]),  # 13 x 2 does not fit: 13 x 1 would load a weight vector per multiply-add
        (25, AVX512, [1, 5]),
        (8, AVX512, [1, 2, 4]),  # 2 and 4 divide: no wider tile
        (5, AVX2_SPEC, [1]),  # at 16 registers channel_pad pads the count instead
    ],
)
def test_a_block_count_no_small_tile_divides_may_take_its_smallest_divisor(channels, spec: CpuSpec, tiles) -> None:
    assert channel_tiles(channels, 1, spec) == tiles


@pytest.mark.parametrize(
    ("channels", "columns", "reduction", "tile"),
    [(5, 56, 32, (5, 4)), (5, 14, 480, (5, 5)), (7, 14, 672, (7, 3)), (13, 14, 512, (1, 14))],
)
def test_a_wide_channel_tile_replaces_the_one_block_tile_at_32_registers(channels, columns, reduction, tile) -> None:
    assert register_tile(channels, columns, 1, AVX512, tails=True, reduction=reduction) == tile
    channel_tile, column_tile = tile
    assert channel_tile * column_tile <= AVX512.accumulators
    assert channel_tile * (column_tile + 1) + 1 <= AVX512.registers


@pytest.mark.parametrize(("channels_out", "shape"), [(80, (1, 32, 8, 8)), (112, (1, 16, 6, 6)), (80, (1, 16, 14, 9))])
def test_a_wide_channel_tile_computes_what_the_unscheduled_kernel_computes(channels_out, shape) -> None:
    """80 and 112 output channels are 5 and 7 blocks of 16: the tile holds all of them, unrolled."""
    (func,) = (
        f
        for name, f in kernels_of(conv_body(channels_out, 1), shape, AVX512_TARGET, "blocked").items()
        if "conv2d_nchwc" in name
    )
    new_func, rule = schedule_function(func, AVX512)
    assert rule == "blocked_conv"
    assert f"T.unroll(T.int64({channels_out // 16}))" in new_func.script()
    np.testing.assert_allclose(_run(new_func), _run(func), rtol=1e-4, atol=1e-4)


def _partial_sum_conv() -> tirx.PrimFunc:
    """SqueezeNet's classifier in 2 channel tiles in NCHW16c, as the blocked split tiles build it: a partial sum
    over 8 input blocks added to the running sum (63 output blocks at 13x13), whose column partition TVM's
    ``loop_partition`` rejects."""
    from tvm import te

    from tvm_memplan.relax.layout import conv2d_nchwc

    x, w, acc = (
        te.placeholder([tirx.IntImm("int64", d) for d in shape], "float32")
        for shape in ((1, 8, 13, 13, 16), (63, 8, 1, 1, 16, 16), (1, 63, 13, 13, 16))
    )
    conv = conv2d_nchwc(x, w, [1, 1], [0, 0, 0, 0], [1, 1], "float32")
    out = te.compute(acc.shape, lambda *i: conv(*i) + acc(*i), name="T_add")
    return te.create_prim_func([x, w, acc, out]).with_attr("tirx.noalias", True)


def test_a_partial_sum_whose_columns_tvm_cannot_partition_is_left_to_the_next_rule() -> None:
    func = _partial_sum_conv()
    scheduled = schedule_function(func, AVX512)
    assert scheduled is not None and scheduled[1] != "blocked_conv"
    np.testing.assert_allclose(_run(scheduled[0]), _run(func), rtol=1e-5, atol=1e-5)
