"""Row tiles with halos (no TVM): the rows each tile computes reproduce the whole operator."""

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_memplan.split.search import pareto, search, search_phased
from tvm_memplan.split.simulate import Branch, Chain, Program, SplitChoice, Step, peak, split_program
from tvm_memplan.split.spatial import RowOp, RowWindow, tile_rows


def _window_rows(x: np.ndarray, kernel: int, stride: int, top: int, bottom: int, dilation: int) -> np.ndarray:
    """A 1-D "convolution" along the rows that keeps which input rows each output row read:
    output row r = the tuple of (padded) input row values at its window's taps."""
    padded = np.concatenate([np.full(top, -1), x, np.full(bottom, -1)])
    count = (len(padded) - dilation * (kernel - 1) - 1) // stride + 1
    return np.array([[padded[r * stride + dilation * k] for k in range(kernel)] for r in range(count)])


@settings(max_examples=200, deadline=None)
@given(
    kernel=st.integers(1, 7),
    stride=st.integers(1, 3),
    dilation=st.integers(1, 2),
    rows_in=st.integers(1, 40),
    pad=st.integers(0, 3),
    bottom_extra=st.integers(0, 2),
    data=st.data(),
)
def test_input_rows_with_border_padding_reproduce_the_output_rows(
    kernel, stride, dilation, rows_in, pad, bottom_extra, data
):
    reach = dilation * (kernel - 1) + 1
    if rows_in + 2 * pad + bottom_extra < reach or pad + bottom_extra >= reach:
        return  # no output row, or one that reads only padding (the chain finder refuses those)
    rows = np.arange(rows_in)
    whole = _window_rows(rows, kernel, stride, pad, pad + bottom_extra, dilation)
    lo = data.draw(st.integers(0, len(whole) - 1))
    hi = data.draw(st.integers(lo + 1, len(whole)))
    (first, end), top, bottom = RowWindow(kernel, stride, pad, dilation, rows_in).input_rows((lo, hi))
    assert 0 <= first < end <= rows_in and top <= pad and bottom <= pad + bottom_extra
    tile = _window_rows(rows[first:end], kernel, stride, top, bottom, dilation)
    np.testing.assert_array_equal(tile, whole[lo:hi])


def _stem(rows: int = 6) -> tuple[Program, Chain]:
    """x (3 rows-in-12) -> conv k3 s2 -> a (6 rows) -> depthwise k3 -> d (6 rows) -> 1x1 -> y -> z; ``rows``
    scales every tensor's height (24: tiles of 2 to 16 parts, each lower than the last)."""
    ops = (
        RowOp("a", rows, 100, window=RowWindow(3, 2, 1, 1, 2 * rows), outside=("x",)),
        RowOp("d", rows, 100, reads=("a",), window=RowWindow(3, 1, 1, 1, rows)),
        RowOp("y", rows, 20, reads=("d",), window=RowWindow(1, 1, 0, 1, rows)),
    )
    sizes = {"a": 100 * rows, "d": 100 * rows, "y": 20 * rows, "z": 20 * rows}
    steps = [Step("a", "a", ("x",)), Step("d", "d", ("a",)), Step("y", "y", ("d",)), Step("z", "z", ("y",))]
    chain = Chain((Branch("a", ("d", "y"), rows, 2),), None, (), None, 200 * rows, spatial=ops)
    return Program(steps, sizes), chain


def test_tiles_cover_the_last_tensor_and_overlap_by_the_halos():
    _, chain = _stem()
    tiles = tile_rows(chain.spatial, 3)
    assert [t["y"] for t in tiles] == [(0, 2), (2, 4), (4, 6)]
    # the depthwise conv needs one row above and below; the strided conv reads rows 2r-1..2r+1
    assert [t["d"] for t in tiles] == [(0, 2), (2, 4), (4, 6)]
    assert [t["a"] for t in tiles] == [(0, 3), (1, 5), (3, 6)]


def test_spatial_split_lowers_the_peak_to_tiles_and_the_last_tensor():
    program, chain = _stem()
    assert peak(program).bytes == 1200
    split = split_program(program, [SplitChoice(chain, 3)])
    assert not {"a", "d"} & set(split.sizes)
    middle = [s for s in split.steps if s.name.endswith("#1")]
    assert [s.name for s in middle] == ["a#a#1", "d#a#1", "y#a#1"]
    # the last operator writes its rows of y itself: no tile of y, no copy
    assert middle[-1].writes == "y" and "y" in middle[-1].reads and "y#a#1" not in split.sizes
    # tile 1: a's rows 1..5 (the depthwise conv's halo around d's rows 2..4), d's rows 2..4, and
    # y (120 bytes), alive from the first tile on, are the peak
    assert split.sizes["a#a#1"] == 4 * 100 and split.sizes["d#a#1"] == 2 * 100
    assert peak(split).bytes == 4 * 100 + 2 * 100 + 120


def test_a_window_copying_its_outside_rows_prices_the_copy_per_tile():
    """An int8 head dequantizes a copy of the rows it reads of ``x`` (30 bytes a row): each tile's copy
    lives until the head has read it, and x stays whole (it is outside the arena here)."""
    program, chain = _stem()
    head = replace(chain.spatial[0], copied_row_bytes=30)
    copying = replace(chain, ops=(head, *chain.spatial[1:]))
    split = split_program(program, [SplitChoice(copying, 3)])
    copies = [s for s in split.steps if s.name.startswith("x#")]
    assert [s.name for s in copies] == ["x#a#0", "x#a#1", "x#a#2"]
    # tile 1: a's rows 1..5 read x's rows 1..10 (stride 2, one row of halo above)
    assert split.sizes["x#a#1"] == 9 * 30
    head_step = next(s for s in split.steps if s.name == "a#a#1")
    assert "x#a#1" in head_step.reads
    # the peak is tile 1's copy, a's tile and y, above the 720 bytes of the tiles without copies
    assert peak(split).bytes == 9 * 30 + 4 * 100 + 120


def test_phased_search_goes_below_the_channel_plan_and_keeps_both_fronts():
    """Channel chains first, then every chain from the plan they gave: never above the channel
    plan, and the front holds the points of both phases."""
    program, spatial = _stem()
    channel = Chain((Branch("a", ("d",), 8, 8),), None, (), "y", 1200)
    cost = {2: 0.01, 3: 0.01, 4: 0.02, 8: 0.04, 16: 0.08}
    plain = search(program, [channel], 1.0, lambda c, n: cost[n], budget=0.2)
    phased = search_phased(program, [channel, spatial], 1.0, lambda c, n: cost[n], budget=0.2)
    assert phased.best.peak_bytes <= plain.best.peak_bytes
    assert phased.best.latency_ms <= 1.2 + 1e-9
    assert phased.original.peak_bytes == peak(program).bytes and phased.original in phased.front
    assert {p.peak_bytes for p in pareto(plain.front + phased.front)} == {p.peak_bytes for p in phased.front}


def test_phased_search_under_a_memory_limit_keeps_the_fastest_fitting_plan():
    """Under a limit the channel phase may already fit; spatial plans that fit still compete on
    latency (the second phase starts unsplit)."""
    program, spatial = _stem()
    channel = Chain((Branch("a", ("d",), 8, 8),), None, (), "y", 1200)
    cost = {2: 0.3, 4: 0.4, 8: 0.5}  # channel tiles dear; row tiles (below) cheap
    limit = peak(split_program(program, [SplitChoice(channel, 2)])).bytes
    assert min(peak(split_program(program, [SplitChoice(spatial, n)])).bytes for n in (2, 4)) <= limit
    plain = search(program, [channel], 1.0, lambda c, n: cost[n], memory_limit=limit)
    phased = search_phased(
        program, [channel, spatial], 1.0, lambda c, n: cost[n] if c is channel else 0.01, memory_limit=limit
    )
    assert plain.best.peak_bytes <= limit and phased.best.peak_bytes <= limit
    assert phased.best.latency_ms < plain.best.latency_ms


def test_a_channel_phase_over_its_time_does_not_take_the_spatial_phases(monkeypatch):
    """A channel chain's timing that starts within the first phase's half of a 120 s search and ends 100 s into
    it: the spatial phase still has its 60 s. Its first move times the stem in 2 tiles, then in 16 (over the
    budget), 30 s each; the 20 s the channel phase left would stop it there, its 60 s time 8 tiles and keep them."""
    from tvm_memplan.split import search as search_module

    program, spatial = _stem(24)
    channel = Chain((Branch("a", ("d",), 2, 8),), None, (), None, 4800)
    clock = [0.0]
    monkeypatch.setattr(search_module.time, "monotonic", lambda: clock[0])
    timed: dict[tuple[Chain, int], float] = {}

    def cost(chain, parts):
        if (chain, parts) not in timed:  # cached, as the measurer's cache answers the second phase
            clock[0] += 100.0 if chain is channel else 30.0
            timed[(chain, parts)] = 0.5 if parts == 16 else 0.01
        return timed[(chain, parts)]

    result = search_phased(program, [channel, spatial], 1.0, cost, budget=0.2, seconds=120.0)
    assert [parts for chain, parts in timed if chain is spatial] == [2, 16, 8]
    assert result.best.choices == (SplitChoice(spatial, 8),)


def test_chain_kinds_name_the_axis_and_the_tail():
    """``plan --json`` reports each split sub-graph's kind from :attr:`Chain.kind`."""
    _, spatial = _stem()
    channel = Chain((Branch("a", ("d",), 8, 8),), None, (), "y", 1200)
    regions = Chain((Branch("a", ("d",), 8, 8),), None, (), None, 600)
    rows = Chain((Branch("a", ("d",), 6, 6),), None, (), None, 600, rows=True)
    assert [c.kind for c in (spatial, channel, regions, rows)] == ["spatial", "temporal", "concat", "rows"]
    assert spatial.name == "a..y (rows)" and replace(spatial, gathered=True).name == "a..y (rows, gathered)"


def test_fused_tiles_on_workers_keep_a_tile_per_worker_live():
    """Fused independent row tiles run two at a time, each worker with its own scratch: the simulator
    holds two tiles' buffers where one tile at a time holds one."""
    program, chain = _stem()
    one = split_program(program, [SplitChoice(chain, 3, fused=True)])
    two = split_program(program, [SplitChoice(chain, 3, fused=True, workers=2)])
    assert SplitChoice(chain, 3, fused=True, workers=2).concurrent_tiles == 2
    assert SplitChoice(chain, 3, workers=2).concurrent_tiles == 1  # per-kernel tiles: one at a time
    assert two.sizes["a#a#1"] == 2 * one.sizes["a#a#1"] and two.sizes["d#a#1"] == 2 * one.sizes["d#a#1"]
    assert peak(two).bytes == 2 * (4 * 100 + 2 * 100) + 120


def test_per_kernel_tiles_with_a_line_buffer_compute_each_row_once_and_take_more_tiles():
    """Per-kernel tiles (not fused) may keep a line buffer too (a microcontroller's way): every row of the
    depthwise input is computed once over the tiles, and with :attr:`line_buffer_parts` the chain is offered in
    more tiles than it recomputes its halos in."""
    program, chain = _stem(rows=24)
    spatial = replace(chain, line_buffer_parts=64)
    assert chain.parts_ladder() == [2, 4, 8, 16] and spatial.parts_ladder() == [2, 4, 8, 16, 24]
    more = replace(_stem(rows=96)[1], line_buffer_parts=64)
    assert more.parts_ladder() == [2, 4, 8, 16, 32, 64]
    assert replace(_stem(rows=28)[1], line_buffer_parts=64).parts_ladder() == [2, 4, 8, 16, 28]  # a tile a row
    assert _stem(rows=28)[1].parts_ladder() == [2, 4, 8, 16]
    rolling = SplitChoice(spatial, 8, rolling=True)
    assert not rolling.fused and rolling.concurrent_tiles == 1
    plan = spatial.rolling_rows(8)
    assert sum(hi - lo for lo, hi in (t["a"].computed for t in plan)) == 24  # each row of a once
    assert sum(hi - lo for lo, hi in (t["a"] for t in spatial.tile_rows(8))) > 24  # recomputed halos
    split = split_program(program, [rolling])
    assert peak(split).bytes < peak(program).bytes
    assert any(s.name.endswith("#kept") for s in split.steps)  # kept rows live between tiles
