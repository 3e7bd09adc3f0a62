"""One kernel per split chain: a chain's tiles merged into one PrimFunc compute what the unsplit model
computes, bit for bit, in one VM call, with the tiles' buffers in a scratch tensor the arena plans."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from tvm import relax

from tvm_memplan.relax.passes import PlanReport
from tvm_memplan.relax.pipeline import pipeline, stage_passes
from tvm_memplan.relax.split import find_chains as find_chains_of
from tvm_memplan.relax.split import split_chains
from tvm_memplan.relax.split.outline import TILES_ATTR
from tvm_memplan.relax.tile_kernels import MergeTileKernels, _copy_view, _one_of, _table
from tvm_memplan.split.simulate import SplitChoice
from tvm_memplan.verify.run import run_vm

from .modules import random_weights
from .test_split_spatial import SHAPE, TARGET, _longest, _stem_module

_KERNEL_CALLS = (tvm.ir.Op.get("relax.call_tir"), tvm.ir.Op.get("relax.call_tir_inplace"))


@pytest.fixture(scope="module")
def stem():
    return _stem_module()


def _kernel_calls(mod: tvm.IRModule) -> list[str]:
    """The kernels ``main`` calls after TVM's fusion (and the tile passes), in order."""
    with TARGET:
        fused = tvm.transform.Sequential(stage_passes(TARGET).dataflow)(mod)
    return [
        b.value.args[0].name_hint
        for block in fused["main"].body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call) and any(b.value.op.same_as(op) for op in _KERNEL_CALLS)
    ]


def _run_planned(mod: tvm.IRModule, x: np.ndarray) -> tuple[np.ndarray, list[int], list[PlanReport]]:
    reports: list[PlanReport] = []
    with TARGET:
        executable = tvm.compile(mod, TARGET, relax_pipeline=pipeline(TARGET, reports.append, order="program"))
    (out,), trace = run_vm(executable, [x])
    return out, trace.storage_bytes, reports


@pytest.mark.parametrize("parts", [8])
def test_a_fused_chain_runs_as_one_kernel_bit_identical_and_as_planned(stem, parts):
    chain = _longest(stem)
    per_kernel = split_chains(stem, [SplitChoice(chain, parts)])
    fused = split_chains(stem, [SplitChoice(chain, parts, fused=True)])
    # the stem has two kernels outside the chain (the side convolution and the last one)
    assert len(_kernel_calls(per_kernel)) > 2 + parts
    calls = _kernel_calls(fused)
    assert len(calls) == 3 and sum(name.endswith("_fused") for name in calls) == 1

    x = np.random.default_rng(1).standard_normal(SHAPE).astype("float32")
    expected, _, _ = _run_planned(stem, x)
    got, requested, (report,) = _run_planned(fused, x)
    np.testing.assert_array_equal(got, expected)
    # the VM asks for the planned arena (scratch inside) and the output, nothing else
    assert requested == [report.arena_bytes, got.nbytes]
    # the scratch lives only during the chain's call: no more arena than the per-kernel tiles
    _, per_kernel_requested, _ = _run_planned(per_kernel, x)
    assert report.arena_bytes <= per_kernel_requested[0]


def test_other_targets_get_the_per_kernel_tiles_back(stem):
    """A GPU target binds each kernel to threads of its own: the chain's calls go back into ``main``."""
    chain = _longest(stem)
    with TARGET:
        fused = tvm.transform.Sequential(stage_passes(TARGET).dataflow[:-1])(
            split_chains(stem, [SplitChoice(chain, 3, fused=True)])
        )
    assert any(f.attrs is not None and TILES_ATTR in f.attrs for f in fused.functions.values())
    inlined = MergeTileKernels(tvm.target.Target({"kind": "cuda"}))(fused)
    assert not [g for g, f in inlined.functions.items() if isinstance(f, relax.Function) and g.name_hint != "main"]
    calls = [b for block in inlined["main"].body.blocks for b in block.bindings if isinstance(b.value, relax.Call)]
    with TARGET:
        per_kernel = tvm.transform.Sequential(stage_passes(TARGET).dataflow)(
            split_chains(stem, [SplitChoice(chain, 3)])
        )
    assert len(calls) == len([b for block in per_kernel["main"].body.blocks for b in block.bindings])


def test_mobilenet_with_fused_spatial_and_channel_chains_verifies():
    """A spatial chain (row tiles written into the full tensor) and a channel chain (partial sums,
    written in place over each other and into the output) of a real network, each one kernel."""
    from tvm_memplan.frontend import load_model, to_relax
    from tvm_memplan.planner import plan_model
    from tvm_memplan.relax.split import find_chains, normalize, program_of
    from tvm_memplan.split.chain import disjoint
    from tvm_memplan.split.simulate import peak, split_program
    from tvm_memplan.verify import verify_plan

    model = load_model("zoo:mobilenet_v2?width=0.35&resolution=48")
    mod = normalize(to_relax(model))
    program, chains = program_of(mod), find_chains(mod)

    def best(candidates):
        return min(candidates, key=lambda c: peak(split_program(program, [SplitChoice(c, 4)])).bytes)

    spatial = best([c for c in chains if c.spatial and not c.gathered and c.units >= 4])
    channel = best([c for c in chains if c.kind == "temporal" and disjoint([c, spatial])])
    split = split_chains(mod, [SplitChoice(spatial, 4, fused=True), SplitChoice(channel, 4, fused=True)])
    assert sum(name.endswith("_fused") for name in _kernel_calls(split)) == 2
    plan = plan_model(model, "llvm", prepare=lambda _: split, order="program")  # the module normalized above
    result = verify_plan(plan, stock=False)  # vs onnxruntime, VM requests vs the plan
    assert result.ok, result.problems


def test_a_gathered_chain_is_not_fused(stem):
    """Its last tiles are kept until the end: one kernel would hold them and the output at once."""
    chain = _longest(stem, gathered=True)
    assert not chain.fusable and _longest(stem).fusable
    with pytest.raises(ValueError, match="one kernel"):
        split_chains(stem, [SplitChoice(chain, 3, fused=True)])


def test_fused_and_per_kernel_tiles_are_measured_apart(stem):
    """The latency cache keys a chain module by what its time depends on, the fused tiles included."""
    from tvm_memplan.relax.split import chain_signature

    chain = _longest(stem)
    signatures = {
        chain_signature(split_chains(stem, [SplitChoice(chain, parts, fused=fused)]))
        for parts in (2, 3)
        for fused in (False, True)
    }
    assert len(signatures) == 4


def _parallel_loops(mod: tvm.IRModule, name: str) -> int:
    with TARGET:
        fused = tvm.transform.Sequential(stage_passes(TARGET).dataflow)(mod)
    return fused[name].script().count("T.parallel(")


def test_independent_tiles_run_on_workers_each_with_its_scratch(stem):
    """A spatial chain's row tiles share only the chain's inputs and output: one loop nest runs them
    two at a time, each worker's tiles in a scratch region of their own; the simulator counts both."""
    from tvm_memplan.relax.split import program_of
    from tvm_memplan.split.simulate import peak, split_program

    chain = _longest(stem)
    x = np.random.default_rng(1).standard_normal(SHAPE).astype("float32")
    expected, _, _ = _run_planned(stem, x)
    arenas, simulated = {}, {}
    for workers in (1, 2):
        choice = SplitChoice(chain, 8, fused=True, workers=workers)
        split = split_chains(stem, [choice])
        # one parallel loop, over the workers, in place of each stage's own
        assert (_parallel_loops(split, "chain_tiles0_fused") == 1) == (workers == 2)
        got, requested, (report,) = _run_planned(split, x)
        np.testing.assert_array_equal(got, expected)
        assert requested == [report.arena_bytes, got.nbytes]
        arenas[workers] = report.arena_bytes
        simulated[workers] = peak(split_program(program_of(stem), [choice])).bytes
    assert arenas[2] > arenas[1] and simulated[2] > simulated[1]
    for workers in (1, 2):  # the simulator's tiles are not aligned as the scratch's views are
        assert simulated[workers] <= arenas[workers] <= simulated[workers] + 2 * 64 * 2


_STAGES = ("conv", "depthwise", "clip", "pool", "pointwise")


def _random_chain_module(height: int, width: int, stages: list[str], seed: int) -> tvm.IRModule:
    const = random_weights(seed)

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, height, width), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, const(4, 3, 3, 3), padding=1))
            for stage in stages:
                if stage == "conv":
                    y = bb.emit(relax.op.nn.conv2d(y, const(4, 4, 3, 3), strides=2, padding=1))
                elif stage == "depthwise":
                    y = bb.emit(relax.op.nn.conv2d(y, const(4, 1, 3, 3), padding=1, groups=4))
                elif stage == "clip":
                    y = bb.emit(relax.op.clip(bb.emit(relax.op.add(y, const(1, 4, 1, 1))), 0.0, 6.0))
                elif stage == "pool":
                    y = bb.emit(relax.op.nn.max_pool2d(y, pool_size=3, strides=2, padding=1))
                else:
                    y = bb.emit(relax.op.nn.conv2d(y, const(4, 4, 1, 1)))
            y = bb.emit(relax.op.nn.conv2d(y, const(2, 4, 3, 3), padding=1))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    from tvm_memplan.relax.split import normalize

    return normalize(bb.get())


@settings(max_examples=6, deadline=None)
@given(
    height=st.integers(12, 24),
    width=st.integers(5, 11),
    stages=st.lists(st.sampled_from(_STAGES), min_size=2, max_size=4),
    workers=st.integers(1, 3),
    rolling=st.booleans(),
    seed=st.integers(0, 2**16),
    pick=st.integers(0, 7),
)
# a tile whose halo spans every row of the chain's input: its last kernel reads as many rows as the output has
@example(height=12, width=5, stages=["conv", "conv", "conv"], workers=2, rolling=False, seed=0, pick=0)
def test_a_fused_random_chain_equals_the_unsplit_chain(height, width, stages, workers, rolling, seed, pick):
    """Property: whatever the chain's stages, tiles and workers, with halos recomputed or kept in a
    line buffer, the fused kernel computes what the unsplit model computes, bit for bit, in the arena
    the planner planned; the simulator's peak of the split is that arena's lower bound, short of it
    by no more than the scratch's alignment and packing."""
    from tvm_memplan.relax.split import find_chains, program_of
    from tvm_memplan.split.simulate import peak, split_program

    mod = _random_chain_module(height, width, stages, seed)
    chains = [c for c in find_chains(mod) if c.spatial and c.fusable and c.parts_ladder()]
    assume(chains)
    chain = max(chains, key=lambda c: len(c.spatial))
    ladder = chain.parts_ladder()
    choice = SplitChoice(chain, ladder[pick % len(ladder)], fused=True, workers=workers, rolling=rolling)
    assume(not rolling or chain.has_halo(choice.parts, choice.concurrent_tiles))  # else the same kernel
    x = np.random.default_rng(seed).standard_normal((1, 3, height, width)).astype("float32")
    expected, _, _ = _run_planned(mod, x)
    got, requested, (report,) = _run_planned(split_chains(mod, [choice]), x)
    np.testing.assert_array_equal(got, expected)
    assert requested == [report.arena_bytes, got.nbytes]
    simulated = peak(split_program(program_of(mod), [choice])).bytes
    # each tile buffer in the scratch starts at a 64-byte boundary, once per worker
    aligned = 64 * 2 * len(chain.spatial) * choice.concurrent_tiles
    assert simulated <= report.arena_bytes <= simulated + aligned


def _tile_bodies(func: tvm.tirx.PrimFunc) -> int:
    """The bodies of a fused kernel's loop over its tiles (one per class of alike tiles)."""
    loops: list = []
    tvm_ffi.structural_walk(
        func.body,
        lambda n: loops.append(n) if isinstance(n, tvm.tirx.For) and n.loop_var.name == "tile" else None,
        order="pre",
    )
    (loop,) = loops
    bodies, node = 0, loop.body
    while isinstance(node, tvm.tirx.IfThenElse):
        bodies, node = bodies + 1, node.else_case
    return bodies


def test_alike_tiles_run_as_one_body_of_a_loop_over_the_tiles():
    """Tiles that differ only in the rows they read and write are one body of the fused kernel's tile
    loop: its size (and compile time) stays flat as the tiles get finer, and outputs stay bit-identical."""
    mod = _random_chain_module(32, 8, ["depthwise", "clip", "pointwise"], 3)
    chain = max((c for c in find_chains_of(mod) if c.spatial and c.fusable), key=lambda c: len(c.spatial))
    x = np.random.default_rng(3).standard_normal((1, 3, 32, 8)).astype("float32")
    expected, _, _ = _run_planned(mod, x)
    bodies = {}
    for parts in (8, 16):
        split = split_chains(mod, [SplitChoice(chain, parts, fused=True, workers=1)])
        with TARGET:
            fused = tvm.transform.Sequential(stage_passes(TARGET).dataflow)(split)
        bodies[parts] = _tile_bodies(fused["chain_tiles0_fused"])
        got, _, _ = _run_planned(split, x)
        np.testing.assert_array_equal(got, expected)
    # the first and last tiles (padding) and those whose halo reaches it differ; the others are one body
    assert bodies[8] <= 4 and bodies[16] <= 6


def _evaluate(expr: tvm.tirx.Expr, var: tvm.tirx.Var, value: int) -> int:
    bound = tvm_ffi.structural_map(
        expr, [(tvm.ir.Var, lambda v: tvm.tirx.IntImm(v.ty, value) if v.same_as(var) else v)]
    )
    return int(tvm.sym.Analyzer().simplify(bound))


@settings(max_examples=30, deadline=None)
@given(
    keys=st.lists(st.integers(0, 40), min_size=2, max_size=8, unique=True).map(sorted),
    data=st.data(),
)
def test_a_tile_table_gives_each_tile_its_constant(keys, data):
    """Property: a hole's constants, affine in the tile index or not, come back for every tile of its
    class; a class's condition holds for its tiles and no other."""
    affine = data.draw(st.booleans())
    if affine:
        start, step = data.draw(st.integers(-50, 50)), data.draw(st.integers(-9, 9))
        values = [start + step * k for k in keys]
    else:
        values = data.draw(st.lists(st.integers(-100, 100), min_size=len(keys), max_size=len(keys)))
    members = data.draw(st.lists(st.sampled_from(keys), min_size=1, unique=True).map(sorted))
    tile = tvm.tirx.Var("tile", "int64")
    table = _table(tile, keys, values, "int64")
    assert [_evaluate(table, tile, k) for k in keys] == values
    condition = _one_of(tile, members)
    assert [bool(_evaluate(condition, tile, k)) for k in range(42)] == [k in members for k in range(42)]


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler to link the C target's module")
def test_a_c_target_runs_the_tile_loop_serially_bit_identical(tmp_path):
    """C code has no thread pool: the tile loop runs serially, with halos recomputed or in a line buffer."""
    mod = _random_chain_module(20, 7, ["conv", "depthwise", "clip"], 5)
    chain = max((c for c in find_chains_of(mod) if c.spatial and c.fusable), key=lambda c: len(c.spatial))
    x = np.random.default_rng(0).standard_normal((1, 3, 20, 7)).astype("float32")
    target = tvm.target.Target("c")
    outputs = []
    for i, choice in enumerate(
        [None, SplitChoice(chain, 4, fused=True, workers=1), SplitChoice(chain, 4, fused=True, rolling=True)]
    ):
        split = mod if choice is None else split_chains(mod, [choice])
        with target:
            executable = tvm.compile(split, target, relax_pipeline=pipeline(target, order="program"))
        path = tmp_path / f"chain{i}.so"
        executable.export_library(str(path))
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())
        outputs.append(vm["main"](tvm.runtime.tensor(x)).numpy())
    for got in outputs[1:]:
        np.testing.assert_array_equal(got, outputs[0])


def _kernel(compute, *shapes) -> tvm.tirx.PrimFunc:
    args = [tvm.te.placeholder(shape, "float32", name=f"x{i}") for i, shape in enumerate(shapes)]
    return tvm.te.create_prim_func([*args, compute(*args)])


def test_a_copy_of_an_inputs_rows_is_a_strided_view_of_it():
    """A row slice, with the reshape of a stem's NCHW input to NCHW1c after it, reads the input's
    elements at an offset and strides: the tile can read them in place."""
    rows = _kernel(lambda x: tvm.topi.strided_slice(x, [0, 0, 5, 0], [1, 3, 12, 16]), (1, 3, 20, 16))
    offset, strides = _copy_view(rows)
    assert offset == 5 * 16 and strides[1:] == [20 * 16, 16, 1]  # (the batch of one: any stride)
    reshaped = _kernel(
        lambda x: tvm.topi.reshape(tvm.topi.strided_slice(x, [0, 0, 5, 0], [1, 3, 12, 16]), (1, 3, 7, 16, 1)),
        (1, 3, 20, 16),
    )
    offset, strides = _copy_view(reshaped)
    assert offset == 5 * 16 and strides[1:4] == [20 * 16, 16, 1]
    # not a copy: arithmetic on the values, or a transpose of the rows
    assert _copy_view(_kernel(lambda x: tvm.topi.add(x, 1.0), (1, 3, 20, 16))) is None
    transposed = _kernel(lambda x: tvm.topi.transpose(x, [0, 1, 3, 2]), (1, 3, 20, 16))
    assert _copy_view(transposed)[1][1:] == [20 * 16, 1, 16]  # a strided view too, read in place


def _branching_module(
    height: int, kernels: list[int], widths: list[int], pool: bool, reduce: bool, seed: int
) -> tvm.IRModule:
    """SqueezeNet's fire module, generalized: a squeeze convolution, branches of one convolution (``kernels``
    square, ``widths`` blocks of 4 channels) and a ReLU each reading it (with ``reduce``, the last through a
    1x1 convolution of its own first, as an inception module's: computed between the branches' heads), a concat,
    a max pool after it or not, and a tail convolution reducing the joined channels."""
    const = random_weights(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, height, height), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            squeeze = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, const(8, 8, 1, 1)))))
            branches = []
            for i, (k, blocks) in enumerate(zip(kernels, widths, strict=True)):
                source = squeeze
                if reduce and i == len(kernels) - 1:
                    source = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(squeeze, const(8, 8, 1, 1)))))
                conv = relax.op.nn.conv2d(source, const(4 * blocks, 8, k, k), padding=k // 2)
                branches.append(bb.emit(relax.op.nn.relu(bb.emit(conv))))
            y = bb.emit(relax.op.concat(branches, axis=1))
            if pool:
                y = bb.emit(relax.op.nn.max_pool2d(y, pool_size=2, strides=2))
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(y, const(8, 4 * sum(widths), 1, 1))))
        bb.emit_func_output(out)
    from tvm_memplan.relax.split import normalize

    return normalize(bb.get())


def _fused_like_per_kernel(
    mod: tvm.IRModule, fused: SplitChoice, per_kernel: SplitChoice, x: np.ndarray, blocked: bool
) -> tuple[PlanReport, list[int]]:
    """``fused`` runs as one kernel, bit for bit what its ``per_kernel`` tiles compute and within float
    tolerance of the unsplit ``mod``, and the VM asks for the planned arena and the output alone, in NCHW4c
    where ``blocked``. Returns the split's plan report and the unsplit model's VM requests."""
    layout = "blocked" if blocked else "nchw"

    def run(module: tvm.IRModule) -> tuple[np.ndarray, list[int], list[PlanReport]]:
        reports: list[PlanReport] = []
        passes = pipeline(TARGET, reports.append, order="program", layout=layout)
        with TARGET:
            executable = tvm.compile(module, TARGET, relax_pipeline=passes)
        (out,), trace = run_vm(executable, [x])
        return out, trace.storage_bytes, reports

    expected, unsplit, _ = run(mod)
    in_tiles, _, _ = run(split_chains(mod, [per_kernel], windows_in_place=not blocked))
    split = split_chains(mod, [fused], windows_in_place=not blocked)
    assert sum(name.endswith("_fused") for name in _kernel_calls(split)) == 1
    got, requested, (report,) = run(split)
    np.testing.assert_array_equal(got, in_tiles)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    assert requested == [report.arena_bytes, got.nbytes]
    return report, unsplit


@settings(max_examples=6, deadline=None)
@given(
    height=st.integers(6, 12),
    kernels=st.lists(st.sampled_from([1, 3]), min_size=2, max_size=3),
    blocks=st.lists(st.integers(2, 4), min_size=3, max_size=3),
    pool=st.booleans(),
    reduce=st.booleans(),
    blocked=st.booleans(),
    seed=st.integers(0, 2**16),
    pick=st.integers(0, 7),
)
def test_a_fused_branching_chain_equals_its_per_kernel_tiles(
    height, kernels, blocks, pool, reduce, blocked, seed, pick
):
    """Property: a chain of several branches joined by a concat and reduced by a tail (a fire module) runs as
    one kernel that computes what its per-kernel tiles compute, bit for bit (the same partial sums in the same
    order), and the unsplit model within float tolerance, in NCHW and in NCHW4c, in the arena the planner
    planned; the simulator's peak of the split is that arena, short of it by no more than the scratch's
    alignment."""
    from tvm_memplan.relax.split import find_chains, program_of
    from tvm_memplan.split.chain import ChannelChain, in_channel_blocks
    from tvm_memplan.split.simulate import peak, split_program

    widths = blocks[: len(kernels)]
    mod = _branching_module(height, kernels, widths, pool, reduce, seed)
    block = 4 if blocked else None
    found = find_chains(mod, block)
    found = in_channel_blocks(found, block) if block else found
    (chain,) = [c for c in found if isinstance(c, ChannelChain) and len(c.branches) == len(kernels)]
    assert chain.fusable and chain.tail is not None
    ladder = chain.parts_ladder()
    assume(ladder)
    parts = ladder[pick % len(ladder)]
    fused, per_kernel = SplitChoice(chain, parts, fused=True), SplitChoice(chain, parts)
    x = np.random.default_rng(seed).standard_normal((1, 8, height, height)).astype("float32")
    report, _ = _fused_like_per_kernel(mod, fused, per_kernel, x, blocked)
    simulated = peak(split_program(program_of(mod, block=block), [fused])).bytes
    aligned = 64 * 2 * len(chain.bindings)
    assert simulated <= report.arena_bytes <= simulated + aligned


@pytest.mark.parametrize("blocked, rolling", [(False, False), (True, False), (True, True)])
def test_an_inception_module_in_row_tiles_runs_as_one_kernel(blocked, rolling):
    """Row tiles through an inception module (its branches' siblings, the concat, the pool after it) in one
    kernel: equal to the per-kernel tiles bit for bit, to the unsplit model within float tolerance, and the
    VM asks for the planned arena."""
    from tvm_memplan.relax.split import program_of
    from tvm_memplan.split.simulate import peak, split_program

    from .test_split_spatial import INCEPTION_SHAPE, _inception_module, _through_concat

    mod = _inception_module()
    chain = _through_concat(mod)
    fused, per_kernel = SplitChoice(chain, 4, fused=True, rolling=rolling), SplitChoice(chain, 4, rolling=rolling)
    x = np.random.default_rng(6).standard_normal(INCEPTION_SHAPE).astype("float32")
    report, unsplit = _fused_like_per_kernel(mod, fused, per_kernel, x, blocked)
    assert report.arena_bytes < unsplit[0]
    simulated = peak(split_program(program_of(mod, block=4 if blocked else None), [fused])).bytes
    assert abs(report.arena_bytes - simulated) <= 0.15 * simulated


_TWO_WORKERS = """
import numpy as np, tvm
from tvm import relax
from tvm_memplan.deploy.chain_latency import chain_module
from tvm_memplan.frontend import load_model, to_relax
from tvm_memplan.relax.pipeline import pipeline
from tvm_memplan.relax.split import find_chains, normalize, split_chains
from tvm_memplan.split.simulate import SplitChoice
mod = normalize(to_relax(load_model("zoo:googlenet")))
chain = {c.name: c for c in find_chains(mod)}["lv5..lv13 (rows)"]
alone = chain_module(mod, chain)
from tvm_memplan.deploy.targets import get_target
target = get_target("host").tvm_target()
shapes = [[int(d) for d in p.ty.shape.values] for p in alone["main"].params]
inputs = [tvm.runtime.tensor(np.random.default_rng(0).standard_normal(s).astype("float32")) for s in shapes]
def run(m):
    with target:
        ex = tvm.compile(m, target, relax_pipeline=pipeline(target, order="program", layout="blocked"))
    return relax.VirtualMachine(ex, tvm.cpu())["main"](*inputs).numpy()
split = split_chains(alone, [SplitChoice(chain, 4, True, 2, rolling=True)], False)
print(float(np.abs(run(split) - run(alone)).max()))
"""


def test_tiles_on_two_threads_never_write_rows_another_worker_owns():
    """GoogLeNet's 1x1, 3x3 and max pool chain alone, its four line-buffer tiles on two workers in NCHW16c:
    the blocked layout makes the first tile's rows in a whole blocked tensor and unblocks all of it into the
    output, which would overwrite the rows the other worker writes at the same time (NaN rows, seen only
    with two threads in the pool). Run where the pool has two threads, it equals the unsplit chain."""
    env = {**os.environ, "TVM_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", _TWO_WORKERS], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) == 0.0
