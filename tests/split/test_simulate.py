"""The memory simulator and the split search on hand-built programs (no TVM)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_memplan.split.search import pareto, Point, search
from tvm_memplan.split.simulate import Branch, Chain, Program, SplitChoice, Step, peak, split_program


def _block(expand: int = 6, width: int = 8, rows: int = 1000) -> tuple[Program, Chain]:
    """x -> expand (head) -> dw (mid) -> project (tail, reduces the chain's channels) -> y."""
    c, e = width, width * expand
    sizes = {"x": c * rows, "h": e * rows, "d": e * rows, "y": c * rows}
    steps = [Step("x", "x", ()), Step("h", "h", ("x",)), Step("d", "d", ("h",)), Step("y", "y", ("d",)),
             Step("out", "out", ("y",))]
    return Program(steps, sizes), Chain((Branch("h", ("d",), e, e),), None, (), "y", sizes["h"] + sizes["d"])


def test_peak_is_the_largest_live_set():
    program, _ = _block()
    p = peak(program)
    assert p.bytes == 6 * 8 * 1000 * 2  # h and d live together
    assert set(p.live) == {"h", "d"}


def test_split_program_runs_tiles_and_keeps_outside_tensors():
    program, chain = _block()
    split = split_program(program, [SplitChoice(chain, 4)])
    names = [s.name for s in split.steps]
    assert names[:2] == ["x", "h#h#0"] and "h" not in split.sizes and "d" not in split.sizes
    assert sum(split.sizes[f"h#h#{t}"] for t in range(4)) == program.sizes["h"]
    # x (the chain's input) and y (the running sum) stay whole; a tile pair is live at a time
    assert peak(split).bytes == program.sizes["x"] + program.sizes["y"] + 2 * program.sizes["h"] // 4


def test_concat_tail_writes_the_last_tensor_in_regions():
    program, _ = _block()
    chain = Chain((Branch("h", ("d",), 48, 48),), None, (), None, program.sizes["h"])
    split = split_program(program, [SplitChoice(chain, 2)])
    assert "d" in split.sizes and "h" not in split.sizes
    assert peak(split).bytes == program.sizes["x"] + program.sizes["d"] + program.sizes["h"] // 2


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(1, 16), st.integers(1, 64), st.lists(st.floats(-0.05, 1.0), min_size=6, max_size=6),
       st.floats(0.0, 0.3))
def test_search_never_raises_the_peak_nor_breaks_the_budget(expand, width, rows, costs, budget):
    """Splitting can raise a peak (the chain's input stays live across its tiles); the search
    keeps only moves that lower it, within the budget."""
    program, chain = _block(expand, width, rows)
    cost = dict(zip(chain.parts_ladder(), costs))
    result = search(program, [chain], 1.0, lambda c, n: cost[n], budget=budget)
    assert result.best.peak_bytes <= result.original.peak_bytes
    assert result.best.latency_ms <= 1.0 * (1 + budget) + 1e-9
    if result.best.choices:
        split = split_program(program, list(result.best.choices))
        assert peak(split).bytes == result.best.peak_bytes
        parts = result.best.choices[0].parts
        assert sum(split.sizes[f"h#h#{t}"] for t in range(parts)) >= program.sizes["h"] - parts


def test_search_keeps_the_budget_and_reports_a_front():
    program, chain = _block()
    cost = {2: 0.01, 4: 0.03, 8: 0.2, 16: 0.5, 32: 1.0}  # ms added by each number of parts
    result = search(program, [chain], 1.0, lambda c, n: cost[n], budget=0.05)
    assert result.best.choices == (SplitChoice(chain, 4),)
    assert result.best.latency_ms <= 1.05
    assert result.best.peak_bytes < result.original.peak_bytes
    front = result.front
    assert all(a.peak_bytes < b.peak_bytes and a.latency_ms > b.latency_ms for a, b in zip(front, front[1:]))
    assert result.original in front


def test_search_with_a_memory_limit_takes_the_fastest_plan_that_fits():
    program, chain = _block()
    cost = {2: 0.01, 4: 0.03, 8: 0.2, 16: 0.5, 32: 1.0}
    limit = peak(split_program(program, [SplitChoice(chain, 8)])).bytes
    result = search(program, [chain], 1.0, lambda c, n: cost[n], memory_limit=limit)
    assert result.best.peak_bytes <= limit
    assert result.best.choices == (SplitChoice(chain, 8),)


def test_search_rejects_a_negative_budget():
    program, chain = _block()
    with pytest.raises(ValueError):
        search(program, [chain], 1.0, lambda c, n: 0.0, budget=-0.1)


def test_pareto_drops_dominated_points():
    a, b, c = Point((), 10, 1.0), Point((), 5, 2.0), Point((), 7, 3.0)
    assert pareto([a, b, c]) == [b, a]


def test_branches_joined_by_a_concat_never_materialize_it():
    """Two branches (a, b) concatenated into c (concat elimination: one tensor), pooled into p,
    reduced by the next convolution into y: split, c exists one branch tile at a time."""
    sizes = {"x": 100, "c": 1600, "p": 400, "y": 100}
    steps = [Step("x", "x", ()), Step("a", "c", ("x",)), Step("b", "c", ("x",)), Step("cat", "c", ()),
             Step("p", "p", ("c",)), Step("y", "y", ("p",)), Step("out", "out", ("y",))]
    program = Program(steps, sizes, {"a": "c", "b": "c", "cat": "c"})
    chain = Chain((Branch("a", (), 8, 8), Branch("b", (), 24, 24)), "cat", ("p",), "y", 2000)
    assert peak(program).bytes == 1600 + 400  # c and p
    split = split_program(program, [SplitChoice(chain, 4)])
    assert "c" not in split.sizes and "p" not in split.sizes
    # branch b's share of c is 3/4, a quarter of it per tile: 300; its share of p per tile: 75
    assert split.sizes["c#b#0"] == 300 and split.sizes["p#b#0"] == 75
    assert peak(split).bytes == 100 + 300 + 75 + 100
