"""The split search on hand-built programs with made-up latencies (no TVM)."""

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_memplan.split.search import Point, _fewer_tiles, pareto, search
from tvm_memplan.split.simulate import SplitChoice, peak, split_program

from .programs import inverted_residual


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 12),
    st.integers(1, 16),
    st.integers(1, 64),
    st.lists(st.floats(-0.05, 1.0), min_size=6, max_size=6),
    st.floats(0.0, 0.3),
)
def test_search_never_raises_the_peak_nor_breaks_the_budget(expand, width, rows, costs, budget):
    """Splitting can raise a peak (the chain's input stays live across its tiles); the search
    keeps only moves that lower it, within the budget."""
    program, chain = inverted_residual(expand, width, rows)
    cost = dict(zip(chain.parts_ladder(), costs, strict=False))  # at most 6 rungs: the first costs
    result = search(program, [chain], 1.0, lambda c, n: cost[n], budget=budget)
    assert result.best.peak_bytes <= result.original.peak_bytes
    assert result.best.latency_ms <= 1.0 * (1 + budget) + 1e-9
    if result.best.choices:
        split = split_program(program, list(result.best.choices))
        assert peak(split).bytes == result.best.peak_bytes
        parts = result.best.choices[0].parts
        assert sum(split.sizes[f"h#h#{t}"] for t in range(parts)) >= program.sizes["h"] - parts


def test_search_keeps_the_budget_and_reports_a_front():
    program, chain = inverted_residual()
    cost = {2: 0.01, 4: 0.03, 8: 0.2, 16: 0.5, 32: 1.0}  # ms added by each number of parts
    result = search(program, [chain], 1.0, lambda c, n: cost[n], budget=0.05)
    assert result.best.choices == (SplitChoice(chain, 4),)
    assert result.best.latency_ms <= 1.05
    assert result.best.peak_bytes < result.original.peak_bytes
    front = result.front
    assert all(a.peak_bytes < b.peak_bytes and a.latency_ms > b.latency_ms for a, b in pairwise(front))
    assert result.original in front


def test_search_with_a_memory_limit_takes_the_fastest_plan_that_fits():
    program, chain = inverted_residual()
    cost = {2: 0.01, 4: 0.03, 8: 0.2, 16: 0.5, 32: 1.0}
    limit = peak(split_program(program, [SplitChoice(chain, 8)])).bytes
    result = search(program, [chain], 1.0, lambda c, n: cost[n], memory_limit=limit)
    assert result.best.peak_bytes <= limit
    assert result.best.choices == (SplitChoice(chain, 8),)


def test_search_rejects_a_negative_budget():
    program, chain = inverted_residual()
    with pytest.raises(ValueError):
        search(program, [chain], 1.0, lambda c, n: 0.0, budget=-0.1)


def test_pareto_drops_dominated_points():
    a, b, c = Point((), 10, 1.0), Point((), 5, 2.0), Point((), 7, 3.0)
    assert pareto([a, b, c]) == [b, a]


def test_search_reports_each_timed_candidate_and_the_accepted_peak():
    program, chain = inverted_residual()
    cost = {2: 0.01, 4: 0.03, 8: 0.2, 16: 0.5, 32: 1.0}
    calls = []
    result = search(program, [chain], 1.0, lambda c, n: cost[n], budget=0.05, progress=lambda *a: calls.append(a))
    timed = [count for count, _ in calls]
    assert timed == sorted(timed) and timed[-1] == result.measured > 0
    peaks = [peak_bytes for _, peak_bytes in calls]
    assert peaks[0] == result.original.peak_bytes and peaks[-1] == result.best.peak_bytes
    assert peaks == sorted(peaks, reverse=True)


def test_a_plan_that_fits_gives_back_the_tiles_it_does_not_need():
    """The greedy descent takes the lowest peak (here 32 tiles); under the limit 4 tiles meet, the
    refinement keeps the fewest tiles that fit, the fastest."""
    program, chain = inverted_residual()
    cost = {2: 0.01, 4: 0.03, 8: 0.2, 16: 0.5, 32: 1.0}
    limit = peak(split_program(program, [SplitChoice(chain, 4)])).bytes
    assert peak(split_program(program, [SplitChoice(chain, 2)])).bytes > limit
    state = {chain: 32}
    current = peak(split_program(program, [SplitChoice(chain, 32)]))
    points: list[Point] = []

    def latency_of(s):
        return 1.0 + sum(cost[n] for n in s.values())

    def choices_of(s):
        return tuple(SplitChoice(c, n) for c, n in s.items())

    state, current = _fewer_tiles(program, state, current, limit, latency_of, choices_of, points)
    assert state == {chain: 4} and current.bytes <= limit
    assert all(p.peak_bytes <= limit for p in points) and min(p.latency_ms for p in points) == latency_of(state)
