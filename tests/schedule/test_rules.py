"""Each default schedule computes what the unscheduled kernel computes, and the expected rule
schedules it: convolutions of every kind, odd widths, strides, pooling, dense, softmax, elementwise."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir, tirx
from tvm.s_tir import dlight as dl

from tvm_memplan.schedule import DEFAULT_RULES, CPUScheduleRule, CpuSpec, NotApplicable, cpu_spec, schedule_function

from ..kernels import conv_body, kernels_of

AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})


def _run(func: tirx.PrimFunc, target: tvm.target.Target, tmp_path=None) -> np.ndarray:
    lib = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    if target.kind.name == "c":  # C source: compile it, then load the library
        path = str(tmp_path / f"kernel_{func.attrs.get('tir.is_scheduled', False)}.so")
        lib.export_library(path, options=["-O2"])
        lib = tvm.runtime.load_module(path)
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.shape]).astype("float32")) for p in func.params]
    lib["main"](*args)
    return args[-1].numpy()


CASES = {
    "conv3x3_pad": (conv_body(32, 3, padding=1), (1, 16, 14, 14), "tiled_reduction"),
    "conv1x1_odd_width": (conv_body(24, 1), (1, 8, 13, 13), "tiled_reduction"),
    "conv3x3_wide_odd": (conv_body(16, 3, padding=1), (1, 8, 9, 37), "tiled_reduction"),
    "conv7x7_stride2_stem": (conv_body(16, 7, stride=2, padding=3), (1, 3, 32, 32), "tiled_reduction"),
    "conv1x1_stride2": (conv_body(32, 1, stride=2, activation=None), (1, 16, 14, 14), "tiled_reduction"),
    "depthwise3x3": (conv_body(24, 3, padding=1, groups=24), (1, 24, 28, 28), "tiled_reduction"),
    "depthwise3x3_stride2": (conv_body(24, 3, stride=2, padding=1, groups=24), (1, 24, 28, 28), "tiled_reduction"),
    "grouped3x3": (conv_body(32, 3, padding=1, groups=8), (1, 32, 10, 10), "tiled_reduction"),
    "max_pool": (lambda bb, x: relax.op.nn.max_pool2d(x, 3, 2, 1), (1, 8, 27, 27), "tiled_reduction"),
    "avg_pool": (lambda bb, x: relax.op.nn.avg_pool2d(x, 2, 2), (1, 8, 16, 16), None),
    "global_avg_pool": (lambda bb, x: relax.op.mean(x, axis=[2, 3], keepdims=True), (1, 32, 7, 7), "generic"),
    "dense": (
        lambda bb, x: relax.op.matmul(
            x, relax.const(np.random.default_rng(2).standard_normal((64, 100)).astype("float32"))
        ),
        (3, 64),
        "tiled_reduction",
    ),
    "dense_prime_rows": (  # 29 rows: padded to whole register tiles
        lambda bb, x: relax.op.add(
            relax.op.matmul(x, relax.const(np.random.default_rng(2).standard_normal((64, 64)).astype("float32"))),
            relax.const(np.random.default_rng(3).standard_normal(64).astype("float32")),
        ),
        (1, 29, 64),
        "tiled_reduction",
    ),
    "attention_scores_prime_tokens": (  # 29 x 29 per head: padded rows, and a width no vector divides
        lambda bb, x: relax.op.matmul(
            x, relax.const(np.random.default_rng(2).standard_normal((2, 16, 29)).astype("float32"))
        ),
        (2, 29, 16),
        "tiled_reduction",
    ),
    "softmax": (lambda bb, x: relax.op.nn.softmax(x, axis=-1), (2, 1000), "row_wise"),
    "attention_softmax": (lambda bb, x: relax.op.nn.softmax(x, axis=-1), (1, 2, 16, 32), "row_wise"),
    "softmax_short_rows": (lambda bb, x: relax.op.nn.softmax(x, axis=-1), (8, 3), "generic"),
    "sum_to_scalar": (lambda bb, x: relax.op.sum(x), (4, 33), "generic"),  # no output axis to tile
    "layer_norm": (
        lambda bb, x: relax.op.nn.layer_norm(
            x, relax.const(np.ones(64, "float32")), relax.const(np.zeros(64, "float32")), axes=[-1]
        ),
        (16, 64),
        "row_wise",
    ),
    "elementwise": (lambda bb, x: relax.op.nn.relu(relax.op.add(x, x)), (1, 16, 20, 20), "spatial"),
    "transpose": (lambda bb, x: relax.op.permute_dims(x, [0, 2, 3, 1]), (1, 16, 20, 20), "spatial"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_schedule_matches_unscheduled_kernel(case: str) -> None:
    body, shape, expected_rule = CASES[case]
    target = tvm.target.Target.from_device("cpu")
    for name, func in kernels_of(body, shape).items():
        scheduled = schedule_function(func, cpu_spec(target))
        assert scheduled is not None, f"{name}: no rule applied"
        new_func, rule = scheduled
        assert new_func.attrs["tir.is_scheduled"]
        if expected_rule is not None:
            assert rule == expected_rule, f"{name} scheduled by {rule}"
        np.testing.assert_allclose(_run(new_func, target), _run(func, target), rtol=1e-4, atol=1e-4)


def test_tiled_kernels_are_parallel_vectorized_and_register_tiled() -> None:
    (func,) = kernels_of(conv_body(64, 3, padding=1), (1, 32, 28, 28)).values()
    new_func, _ = schedule_function(func, cpu_spec(AVX2))
    script = new_func.script()
    assert "T.parallel" in script and "T.vectorized" in script and "T.unroll" in script
    assert 'scope="local"' in script  # accumulators of a tile, not a full-size buffer


@pytest.mark.parametrize("target", [AVX2, tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})])
def test_rows_no_register_tile_divides_are_padded_to_whole_tiles(target: tvm.target.Target) -> None:
    """29 rows (as a ViT's 197 tokens, a prime) take tiles of several rows over a padded copy, not tiles of one."""
    weights = relax.const(np.random.default_rng(2).standard_normal((64, 64)).astype("float32"))
    (func,) = kernels_of(lambda bb, x: relax.op.matmul(x, weights), (1, 29, 64)).values()
    new_func, rule = schedule_function(func, cpu_spec(target))
    assert rule == "tiled_reduction"
    script = new_func.script()
    rows = [int(extent) for extent in re.findall(r"T\.unroll\((?:T\.int64\()?(\d+)", script)]
    assert rows and min(rows) > 1 and 29 % min(rows) != 0, script
    assert "x_pad" in script  # the padded copy of the rows
    host = tvm.target.Target.from_device("cpu")
    np.testing.assert_allclose(_run(new_func, host), _run(func, host), rtol=1e-4, atol=1e-4)


def test_a_grouped_convolution_tiles_the_channels_of_a_group() -> None:
    """8 channels a group (RegNetY's): split into groups and channels within a group, the channels are the register
    tile's reuse axis; unsplit, no axis was (every multiply-add loaded both operands)."""
    from tvm_memplan.schedule.blocks import iter_extents, reduction_axes, the_reduction, top_level_blocks
    from tvm_memplan.schedule.cpu.tiled_reduction import _split_groups

    def axes(func):
        sch = s_tir.Schedule(func)
        block = sch.get(the_reduction(sch, top_level_blocks(sch)))
        return reduction_axes(block, iter_extents(block))

    (func,) = kernels_of(conv_body(48, 3, stride=2, padding=1, groups=6), (1, 48, 28, 28)).values()
    split = _split_groups(func)
    assert axes(func).reuse is None and axes(split).reuse is not None
    new_func, rule = schedule_function(func, cpu_spec(AVX2))
    assert rule == "tiled_reduction" and "T.unroll" in new_func.script()
    host = tvm.target.Target.from_device("cpu")
    np.testing.assert_allclose(_run(new_func, host), _run(func, host), rtol=1e-4, atol=1e-4)
    # a regular convolution reads no channel that way and is left as it is
    (regular,) = kernels_of(conv_body(16, 3, padding=1), (1, 8, 12, 12)).values()
    assert _split_groups(regular).same_as(regular)


@pytest.mark.parametrize(
    "index_map",
    [lambda n, c, h, w: (n, c // 8, h, w, c % 8), lambda n, c, h, w, i: (n, c * 8 + i, h, w)],
    ids=["to_blocked", "to_nchw"],
)
def test_layout_transforms_iterate_over_their_output(index_map) -> None:
    """Stores contiguous, loads gathered: NCHW <-> NCHW[x]c transforms ran 10x faster."""
    shape = (1, 16, 6, 6) if index_map.__code__.co_argcount == 4 else (1, 2, 6, 6, 8)
    (func,) = kernels_of(lambda bb, x: relax.op.layout_transform(x, tirx.IndexMap.from_func(index_map)), shape).values()
    new_func, rule = schedule_function(func, cpu_spec(AVX2))
    assert rule == "spatial"
    sch = s_tir.Schedule(new_func)
    assert len(sch.get(sch.get_sblock("te_layout_transform")).iter_vars) == len(func.params[-1].shape)
    host = tvm.target.Target.from_device("cpu")
    np.testing.assert_array_equal(_run(new_func, host), _run(func, host))


def test_a_transform_out_of_channel_blocks_transposes_tiles() -> None:
    """NCHW8c -> NCHW as 8 x 6 tiles: the block's 8 lanes a vector (contiguous loads), the 6 columns unrolled."""
    to_nchw = tirx.IndexMap.from_func(lambda n, c, h, w, i: (n, c * 8 + i, h, w))
    (func,) = kernels_of(lambda bb, x: relax.op.layout_transform(x, to_nchw), (1, 2, 5, 6, 8)).values()
    new_func, rule = schedule_function(func, cpu_spec(AVX2))
    script = new_func.script()
    assert rule == "spatial" and "T.unroll(T.int64(6))" in script and "T.vectorized(T.int64(8))" in script, script
    host = tvm.target.Target.from_device("cpu")
    np.testing.assert_array_equal(_run(new_func, host), _run(func, host))


def test_a_layout_transform_into_a_row_range_keeps_its_loops() -> None:
    """A split tile converted back from NCHW[x]c and written into rows 1.. of a larger NCHW tensor: its stores
    cover a range that does not start at 0, which TVM's transform_block_layout rejects (an InternalError, not a
    ScheduleError); the rule keeps the input's loops and still schedules the kernel."""
    from tvm.script import tirx as T

    @T.prim_func(private=True, s_tir=True)
    def into_rows(tile: T.Buffer((1, 4, 1, 4, 4), "float32"), out: T.Buffer((1, 16, 4, 4), "float32")):
        T.func_attr({"tirx.noalias": True})
        for n, c, h, w, i in T.grid(1, 4, 1, 4, 4):
            with T.sblock("te_layout_transform"):
                vn, vc, vh, vw, vi = T.axis.remap("SSSSS", [n, c, h, w, i])
                out[vn, vc * 4 + vi, vh + 1, vw] = tile[vn, vc, vh, vw, vi]

    new_func, rule = schedule_function(into_rows, cpu_spec(AVX2))
    assert rule == "spatial"
    host = tvm.target.Target.from_device("cpu")
    np.testing.assert_array_equal(_run(new_func, host), _run(into_rows, host))


def test_c_target_gets_unrolled_not_vectorized_loops(tmp_path) -> None:
    c = tvm.target.Target({"kind": "c"})
    spec = cpu_spec(c)
    assert not spec.vector_codegen
    (func,) = kernels_of(conv_body(16, 3, padding=1), (1, 8, 12, 12)).values()
    new_func, _ = schedule_function(func, spec)
    assert "T.vectorized" not in new_func.script()
    np.testing.assert_allclose(_run(new_func, c, tmp_path), _run(func, c, tmp_path), rtol=1e-4, atol=1e-4)
    # the tile's accumulators are a C array on the stack (registers after the C compiler's scalar
    # replacement), not workspace memory the compiler must store every multiply-add back to
    source = tvm.tirx.build(
        tvm.IRModule({"main": new_func.with_attr("global_symbol", "main")}), target=c
    ).inspect_source()
    assert (
        re.search(r"^  float \w+\[\d+\];$", source, re.M) and source.count("TVMBackendAllocWorkspace(") == 1
    )  # the padding


@pytest.mark.parametrize(
    "target, lanes, registers",
    [
        ({"kind": "llvm", "mcpu": "haswell"}, 8, 16),
        ({"kind": "llvm", "mcpu": "skylake-avx512"}, 16, 32),
        ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}, 4, 32),
        ({"kind": "c"}, 4, 16),
        ({"kind": "c", "mcpu": "cortex-m7"}, 1, 32),  # scalar code, the FPU's 32 single-precision registers
    ],
)
def test_cpu_spec_reads_the_target(target: dict, lanes: int, registers: int) -> None:
    cores = {"num-cores": 3} if target["kind"] == "llvm" else {}  # the C target has no such option
    spec = cpu_spec(tvm.target.Target({**target, **cores}))
    assert (spec.lanes, spec.registers) == (lanes, registers)
    assert spec.threads == 3 or not cores
    assert spec.threads == 1 or "mcpu" not in target or not target["mcpu"].startswith("cortex-m")  # one core


def test_softmax_runs_per_row_with_exp_once_and_the_c_target_keeps_the_generic_rule() -> None:
    (func,) = kernels_of(lambda bb, x: relax.op.nn.softmax(x, axis=-1), (4, 64)).values()
    scheduled, rule = schedule_function(func, CpuSpec(lanes=16, registers=32, threads=2, vector_codegen=True))
    # on llvm the exp is legalized as arithmetic (relax/vector_math.py) with one floor per exp
    script = scheduled.script()
    assert rule == "row_wise" and "T.exp(" not in script and script.count("T.floor(") == 1 and "T.vectorized" in script
    _, rule = schedule_function(func, CpuSpec(lanes=4, registers=16, threads=1, vector_codegen=False))
    assert rule == "generic"


@pytest.mark.parametrize(
    ("width", "lanes_used"), [(128, 16), (1000, 8), (36, 4), (33, None)], ids=["128", "1000", "36", "33"]
)
def test_row_reductions_are_vectorized_across_lanes_where_a_vector_divides_the_row(width, lanes_used) -> None:
    spec = CpuSpec(lanes=16, registers=32, threads=2, vector_codegen=True)
    layer_norm = lambda bb, x: relax.op.nn.layer_norm(  # noqa: E731
        x, relax.const(np.ones(width, "float32")), relax.const(np.zeros(width, "float32")), axes=[-1]
    )
    for body in (lambda bb, x: relax.op.nn.softmax(x, axis=-1), layer_norm):
        (func,) = kernels_of(body, (2, 3, width)).values()
        scheduled, rule = schedule_function(func, spec)
        script = scheduled.script()
        assert rule == "row_wise"
        assert ("_rf_update" in script) == (lanes_used is not None)
        if lanes_used:  # one partial per lane, reduced along the row in vectors
            assert f"T.vectorized(T.int64({lanes_used}))" in script
        host = tvm.target.Target.from_device("cpu")
        np.testing.assert_allclose(_run(scheduled, host), _run(func, host), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_dense_layer_at_batch_one_streams_its_weight_rows_and_splits_them_between_threads(threads) -> None:
    weights = relax.const(np.random.default_rng(3).standard_normal((512, 1000)).astype("float32"))
    (func,) = kernels_of(lambda bb, x: relax.op.matmul(x, weights), (1, 512)).values()
    scheduled, rule = schedule_function(func, CpuSpec(lanes=16, registers=32, threads=threads, vector_codegen=True))
    script = scheduled.script()
    assert rule == "tiled_reduction"
    # each thread sums its own rows into partial outputs (rfactor), added at the end
    assert ("T.parallel" in script) == ("_rf" in script) == (threads == 2)
    host = tvm.target.Target.from_device("cpu")
    np.testing.assert_allclose(_run(scheduled, host), _run(func, host), rtol=1e-4, atol=1e-4)


def test_one_thread_keeps_kernels_serial() -> None:
    (func,) = kernels_of(conv_body(32, 3, padding=1), (1, 16, 28, 28)).values()
    new_func, _ = schedule_function(func, CpuSpec(lanes=8, registers=16, threads=1, vector_codegen=True))
    assert "T.parallel" not in new_func.script()


def test_the_rules_are_dlight_rules_applied_in_order() -> None:
    """dlight's ApplyDefaultSchedule, given the CPU rules, schedules a kernel as schedule_function does."""
    target = tvm.target.Target.from_device("cpu")
    (func,) = kernels_of(conv_body(16, 3, padding=1), (1, 8, 12, 12)).values()
    with target:
        by_dlight = dl.ApplyDefaultSchedule(*DEFAULT_RULES)(tvm.IRModule({"main": func}))["main"]
    ours, rule = schedule_function(func, cpu_spec(target))
    assert rule == "tiled_reduction"
    tvm.ir.assert_structural_equal(by_dlight.body, ours.body)


class _Broken(CPUScheduleRule):
    name = "broken"

    def transform(self, sch: s_tir.Schedule, spec: CpuSpec) -> None:
        raise TypeError("a bug in the rule")


class _Declines(CPUScheduleRule):
    name = "declines"

    def transform(self, sch: s_tir.Schedule, spec: CpuSpec) -> None:
        raise NotApplicable("never fits")


def test_a_rule_declines_only_by_not_applicable_and_a_bug_propagates() -> None:
    (func,) = kernels_of(lambda bb, x: relax.op.nn.relu(x), (1, 16)).values()
    spec = cpu_spec(tvm.target.Target.from_device("cpu"))
    assert schedule_function(func, spec, rules=(_Declines(),)) is None
    assert schedule_function(func, spec, rules=(_Declines(), *DEFAULT_RULES))[1] == "spatial"
    with pytest.raises(TypeError, match="a bug in the rule"):
        schedule_function(func, spec, rules=(_Broken(), *DEFAULT_RULES))


@pytest.mark.parametrize(
    "body",
    [
        lambda bb, x: relax.op.nn.relu(x),
        lambda bb, x: relax.op.nn.softmax(x),
        lambda bb, x: relax.op.matmul(x, relax.const(np.ones((64, 32), "float32"))),
    ],
    ids=["relu", "softmax", "dense"],
)
def test_kernels_with_symbolic_shapes_are_declined_by_every_rule(body) -> None:
    """Symbolic extents (a dynamic batch) are declined explicitly; they used to raise a TypeError that
    the rules' error swallowing turned into "not applicable"."""
    spec = cpu_spec(tvm.target.Target.from_device("cpu"))
    for func in kernels_of(body, (tirx.Var("n", "int64"), 64)).values():
        assert schedule_function(func, spec) is None


def test_stride_two_stage_tvm_cannot_deinterleave_keeps_its_layout():
    """A 3x3 stride-2 int8 conv of 128 channels at 56x56: TVM cannot invert the deinterleaving map
    over the staged padding; the rule schedules it without (it raised TVM's InternalError)."""
    import tvm
    from tvm import te

    from tvm_memplan.quant import kernels
    from tvm_memplan.schedule.cpu import TiledReduction, cpu_spec

    x = te.placeholder((1, 128, 56, 56), "int8", "x")
    w = te.placeholder((128, 128, 3, 3), "int8", "w")
    b = te.placeholder((128,), "int32", "b")
    m = te.placeholder((128,), "float32", "m")
    out = kernels.conv2d(
        x,
        w,
        b,
        m,
        strides=[2, 2],
        padding=[1, 1, 1, 1],
        dilation=[1, 1],
        groups=1,
        x_zero_point=3,
        y_zero_point=0,
        low=-128,
        high=127,
        out_dtype="int8",
    )
    spec = cpu_spec(tvm.target.Target({"kind": "llvm", "mcpu": "znver4"}))
    assert TiledReduction().schedule(te.create_prim_func([x, w, b, m, out]), spec) is not None


@pytest.mark.parametrize("shape", [(1, 2, 6, 6, 8), (1, 16, 6, 6)], ids=["blocked", "nchw"])
def test_a_concat_runs_each_input_in_a_loop_of_its_own(shape) -> None:
    """DenseNet's pre-activation: a concat of three inputs along the channels, scaled, shifted and ReLU'd."""

    def body(bb, x):
        layout = "NCHW8c" if len(shape) == 5 else "NCHW"
        pooled = [bb.emit(relax.op.nn.max_pool2d(x, k, 1, k // 2, layout=layout)) for k in (1, 3)]
        pooled.append(bb.emit(relax.op.nn.avg_pool2d(x, 3, 1, 1, layout=layout)))
        narrow = relax.op.strided_slice(pooled[1], axes=[1], begin=[0], end=[shape[1] // 2])
        cat = relax.op.concat([pooled[0], pooled[2], narrow, x], axis=1)
        channels = 3 * shape[1] + shape[1] // 2
        scale = np.random.default_rng(1).standard_normal((1, channels, 1, 1, *shape[4:])).astype("float32")
        return relax.op.nn.relu(relax.op.add(relax.op.multiply(cat, relax.const(scale)), cat))

    target = tvm.target.Target.from_device("cpu")
    funcs = {n: f for n, f in kernels_of(body, shape).items() if "concatenate" in n}
    assert funcs
    for name, func in funcs.items():
        new_func, rule = schedule_function(func, cpu_spec(target))
        assert rule == "spatial", f"{name} scheduled by {rule}"
        # the channels' loop partitioned at the inputs' boundaries: inputs of 2, 2, 1 and 2 blocks (or 16, 16, 8, 16)
        bounds = [int(a) for a in re.findall(r"in range\(T\.int64\((\d+)\), T\.int64\(\d+\)\)", new_func.script())]
        assert bounds == [shape[1], 2 * shape[1], 2 * shape[1] + shape[1] // 2]
        np.testing.assert_allclose(_run(new_func, target), _run(func, target), rtol=1e-6, atol=1e-6)  # FMA contraction
