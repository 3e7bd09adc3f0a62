"""Split tiles in the blocked layout: row tiles and channel tiles of NCHW[x]c tensors compute what the
unsplit blocked model computes, with no layout transform per tile, and keep the split's arena saving."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, s_tir

from tvm_memplan.relax.fold import FoldDataMovementConstants
from tvm_memplan.relax.layout import BlockedLayout
from tvm_memplan.relax.pipeline import stage_passes
from tvm_memplan.relax.split import find_chains, normalize, program_of, split_chains
from tvm_memplan.relax.tile_layout import packed_weights
from tvm_memplan.split.chain import ChannelChain, SpatialChain, in_channel_blocks
from tvm_memplan.split.simulate import SplitChoice, peak, split_program

from .modules import compile_and_run, random_weights

BLOCK = 4
TARGET = tvm.target.Target({"kind": "llvm"})  # layout="blocked": NCHW4c (SSE's 4 lanes)
SHAPE = (1, 8, 20, 18)


def _net() -> tvm.IRModule:
    """Channels in whole blocks of 4: a stem, a depthwise conv with its epilogue, a max pool, a 1x1
    projection with a residual add of a tensor from before the chain, an expansion and a reducing 1x1."""
    const = random_weights(0)

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            side = bb.emit(relax.op.nn.conv2d(x, const(8, 8, 1, 1), strides=2))  # 8x10x9
            y = bb.emit(relax.op.nn.conv2d(x, const(8, 8, 3, 3), padding=1))
            y = bb.emit(relax.op.clip(bb.emit(relax.op.add(y, const(1, 8, 1, 1))), 0.0, 6.0))
            y = bb.emit(relax.op.nn.conv2d(y, const(8, 1, 3, 3), padding=1, groups=8))
            y = bb.emit(relax.op.multiply(y, bb.emit(relax.op.sigmoid(y))))
            y = bb.emit(relax.op.nn.max_pool2d(y, pool_size=2, strides=2))
            y = bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(y, const(8, 8, 1, 1))), side))
            y = bb.emit(relax.op.clip(bb.emit(relax.op.nn.conv2d(y, const(16, 8, 1, 1))), 0.0, 6.0))
            y = bb.emit(relax.op.nn.conv2d(y, const(8, 16, 1, 1)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return normalize(bb.get())


@pytest.fixture(scope="module")
def net():
    return _net()


def _run(mod: tvm.IRModule, x: np.ndarray):
    return compile_and_run(mod, TARGET, x, layout="blocked")


def _blocked(mod: tvm.IRModule) -> tvm.IRModule:
    with TARGET:
        return tvm.transform.Sequential([FoldDataMovementConstants(), BlockedLayout(BLOCK)])(mod)


def _transforms(mod: tvm.IRModule) -> int:
    """``layout_transform`` bindings in ``main`` other than of the input or of rows of it (a tile blocks
    the rows of the NCHW input it reads, as the unsplit model blocks the whole input)."""
    main = mod["main"]
    bindings = [b for block in main.body.blocks for b in block.bindings]
    value = {b.var: b.value for b in bindings}

    def from_input(expr) -> bool:
        bound = value.get(expr)
        if isinstance(bound, relax.Call) and getattr(bound.op, "name", "") == "relax.strided_slice":
            return from_input(bound.args[0])
        return any(expr.same_as(p) for p in main.params)

    return sum(
        isinstance(b.value, relax.Call)
        and getattr(b.value.op, "name", "") == "relax.layout_transform"
        and not from_input(b.value.args[0])
        for b in bindings
    )


def _all_transforms(mod: tvm.IRModule) -> dict[str, int]:
    """``layout_transform`` bindings per Relax function."""
    return {
        gvar.name_hint: sum(
            isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.layout_transform"
            for block in func.body.blocks
            for b in block.bindings
        )
        for gvar, func in mod.functions.items()
        if isinstance(func, relax.Function)
    }


def _spatial(mod: tvm.IRModule) -> SpatialChain:
    """The longest spatial chain from the stem convolution (not the one from the side convolution, which
    takes the stem as its sibling: both read x)."""
    return max(
        (
            c
            for c in find_chains(mod)
            if isinstance(c, SpatialChain)
            and not c.gathered
            and sum(bool(op.window and op.outside) for op in c.ops) == 1
        ),
        key=lambda c: len(c.spatial),
    )


def _channel(mod: tvm.IRModule) -> ChannelChain:
    chains = [c for c in in_channel_blocks(find_chains(mod), BLOCK) if isinstance(c, ChannelChain) and c.tail]
    return max(chains, key=lambda c: c.tile_bytes)


@pytest.mark.parametrize("parts", [2, 3])
def test_row_tiles_run_blocked_bit_identical_with_less_memory(net, parts):
    x = np.random.default_rng(1).standard_normal(SHAPE).astype("float32")
    (expected,), unsplit = _run(net, x)
    split = split_chains(net, [SplitChoice(_spatial(net), parts)], windows_in_place=False)
    (got,), trace = _run(split, x)
    np.testing.assert_array_equal(got, expected)
    assert trace.storage_bytes[0] < unsplit.storage_bytes[0]
    # the tiles' slices, row copies and residual rows stay NCHW4c: transforms only at the edges, as unsplit
    assert _transforms(_blocked(split)) == _transforms(_blocked(net))
    with TARGET:  # and each tile's last kernel writes its rows of the blocked tensor itself
        fused = tvm.transform.Sequential(stage_passes(TARGET, layout="blocked").dataflow)(split)
    assert not [gv for gv in fused.functions if gv.name_hint.startswith("write_rows")]


@pytest.mark.parametrize("workers, rolling", [(1, False), (2, True)])
def test_fused_row_tiles_run_blocked_bit_identical(net, workers, rolling):
    """One kernel per chain (with a line buffer: rows carried from tile to tile) on NCHW4c tensors."""
    x = np.random.default_rng(3).standard_normal(SHAPE).astype("float32")
    (expected,), unsplit = _run(net, x)
    split = split_chains(net, [SplitChoice(_spatial(net), 4, True, workers, rolling=rolling)], windows_in_place=False)
    (got,), trace = _run(split, x)
    np.testing.assert_array_equal(got, expected)
    assert trace.storage_bytes[0] < unsplit.storage_bytes[0]


def test_a_fused_chain_takes_and_gives_blocked_tensors(net):
    """The outlined chain reads the residual tensor that ``main`` holds in NCHW4c, and returns its result
    in NCHW4c: no transform inside the chain save of the NCHW input's rows (which stays NCHW: a blocked
    copy would live on through the chain), and no more in ``main`` than unsplit."""
    split = split_chains(net, [SplitChoice(_spatial(net), 4, True, 1)], windows_in_place=False)
    counts = _all_transforms(_blocked(split))
    (chain,) = [name for name in counts if name.startswith("chain_tiles")]
    assert chain.endswith("_blocked")
    assert counts[chain] == 4  # one per tile, of the input's rows
    assert counts["main"] <= _all_transforms(_blocked(net))["main"]
    with TARGET:  # the tiles read their rows of the input in place: no copy of them in the tile loop
        fused = tvm.transform.Sequential(stage_passes(TARGET, layout="blocked").dataflow)(split)
    (kernel,) = [f for gv, f in fused.functions.items() if gv.name_hint.endswith("_fused")]
    blocks: list[str] = []
    tvm_ffi.structural_walk(
        kernel.body, lambda n: blocks.append(n.name_hint) if isinstance(n, s_tir.SBlock) else None, order="pre"
    )
    assert blocks and not [name for name in blocks if "strided_slice" in name]


def _padded_net() -> tvm.IRModule:
    """Six channels, padded to two blocks of 4: a residual tensor from before the chain that the chain
    adds in, and a convolution after it."""
    const = random_weights(0)

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(PADDED_SHAPE, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.conv2d(x, const(6, 6, 3, 3), padding=1))
            a = bb.emit(relax.op.clip(bb.emit(relax.op.add(a, const(1, 6, 1, 1))), 0.0, 6.0))
            y = bb.emit(relax.op.clip(bb.emit(relax.op.nn.conv2d(a, const(6, 1, 3, 3), padding=1, groups=6)), 0.0, 6.0))
            y = bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(y, const(6, 6, 1, 1))), a))
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(y, const(6, 6, 3, 3), padding=1)))
        bb.emit_func_output(out)
    return normalize(bb.get())


PADDED_SHAPE = (1, 6, 16, 12)


def test_a_fused_chain_of_padded_blocks_stays_blocked_bit_identical():
    """Tensors whose last block is padded cross the chain's edges blocked, padded blocks included (row
    slices and the residual add carry them), and the output is the unsplit blocked model's."""
    net = _padded_net()
    chain = next(c for c in find_chains(net) if c.name == "lv3..lv6 (rows)")  # after the stem, before the last conv
    split = split_chains(net, [SplitChoice(chain, 4, True, 1)], windows_in_place=False)
    counts = _all_transforms(_blocked(split))
    assert [counts[name] for name in counts if name.startswith("chain_tiles")] == [0]
    assert counts["main"] == _all_transforms(_blocked(net))["main"]
    x = np.random.default_rng(4).standard_normal(PADDED_SHAPE).astype("float32")
    (expected,), _ = _run(net, x)
    (got,), _ = _run(split, x)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("fused", [False, True])
def test_the_simulator_sizes_padded_blocks_as_the_planner_does(fused):
    """Six channels take two blocks of 4: the simulator, told the block, counts the padded blocks of the
    unsplit model's tensors and of a row chain's tiles (and the rows each tile cuts out of a blocked
    tensor), so its peaks are the blocked build's arenas within a few percent; NCHW sizes miss by a
    quarter."""
    net = _padded_net()
    x = np.random.default_rng(4).standard_normal(PADDED_SHAPE).astype("float32")
    _, unsplit = _run(net, x)
    assert peak(program_of(net, block=BLOCK)).bytes == unsplit.storage_bytes[0]
    assert peak(program_of(net)).bytes <= 0.8 * unsplit.storage_bytes[0]
    chain = next(c for c in find_chains(net, BLOCK) if c.name == "lv3..lv6 (rows)")
    choice = SplitChoice(chain, 4, fused)
    _, split = _run(split_chains(net, [choice], windows_in_place=False), x)
    simulated = peak(split_program(program_of(net, block=BLOCK), [choice])).bytes
    assert abs(split.storage_bytes[0] - simulated) <= 0.05 * split.storage_bytes[0]
    nchw_chain = next(c for c in find_chains(net) if c.name == chain.name)
    assert peak(split_program(program_of(net), [SplitChoice(nchw_chain, 4, fused)])).bytes <= 0.7 * simulated


def test_channel_tiles_accumulate_blocked(net):
    chain = _channel(net)
    assert all(b.units == b.channels // BLOCK for b in chain.branches)  # tiles of whole blocks
    x = np.random.default_rng(2).standard_normal(SHAPE).astype("float32")
    (expected,), _ = _run(net, x)
    split = split_chains(net, [SplitChoice(chain, 2)], windows_in_place=False)
    blocked = _blocked(split)
    names = {gv.name_hint for gv in blocked.functions}
    assert any(n.startswith("conv2d_nchwc_accumulate") for n in names)
    assert not any(n.startswith("conv2d_accumulate") for n in names)  # no NCHW partial sum left
    assert _transforms(blocked) == _transforms(_blocked(net))
    (got,), _ = _run(split, x)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)  # partial sums add in another order


def test_channel_chains_not_in_whole_blocks_are_left_out(net):
    """In blocks of 16, the 8-channel branches do not fill a block and the 16-channel expansion is one
    block, no split: every channel chain is left out, the row chains stay as they were."""
    chains = find_chains(net)
    assert any(isinstance(c, ChannelChain) for c in chains)
    assert in_channel_blocks(chains, 16) == [c for c in chains if not isinstance(c, ChannelChain)]


def test_packed_weights_are_the_blocked_kernel_layout():
    weight = np.arange(8 * 4 * 3 * 3, dtype="float32").reshape(8, 4, 3, 3)
    packed = packed_weights(weight, 4)
    assert packed.shape == (2, 1, 3, 3, 4, 4)
    o, i, kh, kw = 5, 2, 1, 0
    assert packed[o // 4, i // 4, kh, kw, i % 4, o % 4] == weight[o, i, kh, kw]
