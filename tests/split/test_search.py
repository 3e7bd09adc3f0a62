"""The split search on hand-built programs with made-up latencies (no TVM)."""

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_memplan.split.search import Point, _fewer_tiles, pareto, search, simulated_floor
from tvm_memplan.split.simulate import Branch, Chain, Program, SplitChoice, Step, peak, split_program

from .programs import inverted_residual, row_pipeline


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
    state = {chain: SplitChoice(chain, 32)}
    current = peak(split_program(program, [SplitChoice(chain, 32)]))
    points: list[Point] = []

    def latency_of(s):
        return 1.0 + sum(cost[c.parts] for c in s.values())

    state, current = _fewer_tiles(program, state, current, limit, latency_of, points)
    assert state == {chain: SplitChoice(chain, 4)} and current.bytes <= limit
    assert all(p.peak_bytes <= limit for p in points) and min(p.latency_ms for p in points) == latency_of(state)


class _Variants:
    """A measurer with variants: per-kernel tiles, fused tiles on two workers, and fused tiles with a
    line buffer, each adding its own made-up ms; records what it was asked to time."""

    def __init__(self, chain, added):
        self.chain, self.added, self.timed = chain, added, []

    def splits(self, chain, parts):
        return [
            SplitChoice(chain, parts),
            SplitChoice(chain, parts, fused=True, workers=2),
            SplitChoice(chain, parts, fused=True, workers=2, rolling=True),
        ]

    def split_delta(self, choice):
        self.timed.append(choice)
        return self.added[(choice.variant, choice.parts)]

    def __call__(self, chain, parts):
        return min(self.split_delta(c) for c in self.splits(chain, parts))


def _stem():
    from .test_spatial import _stem

    return _stem()


def test_a_fused_variant_that_misses_is_retried_with_per_kernel_tiles():
    """Fused tiles on two workers hold two tiles at once: where that does not lower the peak, the
    per-kernel tiles of the same move are timed and kept; the fused variant is never timed."""
    program, chain = _stem()
    base = peak(program).bytes
    on_workers = peak(split_program(program, [SplitChoice(chain, 2, fused=True, workers=2)])).bytes
    per_kernel = peak(split_program(program, [SplitChoice(chain, 2)])).bytes
    assert per_kernel < base <= on_workers  # the premise: only the per-kernel tiles lower it
    added = {
        (v, n): cost
        for n in chain.parts_ladder()
        for v, cost in (("per-kernel", 0.04), ("fused", 0.0), ("fused, line buffer", 0.0))
    }
    measurer = _Variants(chain, added)
    result = search(program, [chain], 1.0, measurer, budget=0.05)
    assert result.best.choices and result.best.choices[0].variant == "per-kernel"
    assert result.best.peak_bytes < base
    for choice in measurer.timed:  # nothing timed whose simulated peak could not beat the plan it extended
        assert peak(split_program(program, [choice])).bytes < base


def test_of_a_moves_variants_with_the_same_peak_the_fastest_is_kept_and_recorded():
    program, chain = _stem()
    added = {
        (v, n): cost
        for n in chain.parts_ladder()
        for v, cost in (("per-kernel", 0.03), ("fused", 0.02), ("fused, line buffer", 0.01))
    }
    measurer = _Variants(chain, added)
    result = search(program, [chain], 1.0, lambda c, n: 0.0, budget=0.05)  # a plain measurer: per-kernel tiles
    assert all(c.variant == "per-kernel" for c in result.best.choices)
    result = search(program, [chain], 1.0, measurer, budget=0.05)
    (choice,) = result.best.choices
    same_peak = [
        c
        for c in measurer.splits(chain, choice.parts)
        if peak(split_program(program, [c])).bytes == result.best.peak_bytes
    ]
    assert choice == min(same_peak, key=lambda c: added[(c.variant, c.parts)])
    assert result.best.latency_ms == pytest.approx(1.0 + added[(choice.variant, choice.parts)])


def test_more_tiles_of_a_chain_that_missed_the_budget_are_never_timed():
    program, chain = inverted_residual()
    timed = []

    def cost(c, n):
        timed.append(n)
        return {2: 0.2, 4: 0.3, 8: 0.5, 16: 0.6, 32: 1.0}[n]

    result = search(program, [chain], 1.0, cost, budget=0.05)
    assert not result.best.choices and timed == [2]  # each larger split has its own, lower peak
    assert result.pruned == len(chain.parts_ladder()) - 1


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-0.02, 0.3), min_size=15, max_size=15), st.floats(0.0, 0.2))
def test_two_searches_with_the_same_measurements_return_the_same_plan(costs, budget):
    """The search is a function of the simulator and the measurements: with the same (cached)
    latencies it keeps the same plan and front."""
    program, chain = _stem()
    variants = ("per-kernel", "fused", "fused, line buffer")
    added = {(v, n): costs[3 * i + j] for i, n in enumerate(chain.parts_ladder()) for j, v in enumerate(variants)}
    first = search(program, [chain], 1.0, _Variants(chain, added), budget=budget)
    second = search(program, [chain], 1.0, _Variants(chain, added), budget=budget)
    assert first.best == second.best and first.front == second.front


def test_the_time_limit_stops_timing_a_moves_variants(monkeypatch):
    """A move's variants can each take a minute to compile: once the limit has passed, the search
    times no further variant, and keeps the best of those it timed."""
    from tvm_memplan.split import search as search_module

    program, chain = _stem()
    clock = [0.0]
    monkeypatch.setattr(search_module.time, "monotonic", lambda: clock[0])
    timed = []

    class OneWorker(_Variants):
        """Per-kernel and fused tiles on one worker: the same peak, so one move with two variants."""

        def splits(self, chain, parts):
            return [SplitChoice(chain, parts), SplitChoice(chain, parts, fused=True, workers=1)]

        def split_delta(self, choice):
            clock[0] += 60.0  # each variant a minute
            timed.append(choice)
            return 0.01

    result = search(program, [chain], 1.0, OneWorker(chain, {}), budget=0.05, seconds=90.0)
    # the first move (a tile per row, the lowest peak): its fewest tiles (2) probed, then one variant, then the limit
    assert [(c.parts, c.variant) for c in timed] == [(2, "per-kernel"), (chain.parts_ladder()[-1], "per-kernel")]
    assert result.stopped == "search time limit" and result.best.choices == (timed[-1],)


class _Noisy:
    """A plain measurer (per-kernel tiles) whose splits add ``true`` ms, but whose first timing of some
    (``first``: chain head and parts → ms) was disturbed by load; every timing again (``retime``) reads the
    true cost. Records the attempts it timed."""

    def __init__(self, true, first=None):
        self.true, self.first, self.timed = true, first or {}, []

    def splits(self, chain, parts):
        return [SplitChoice(chain, parts)]

    def split_delta(self, choice):
        self.timed.append((choice.chain.head, choice.parts, 0))
        return self.first.get((choice.chain.head, choice.parts), self.true(choice))

    def retime(self, choice, attempt):
        self.timed.append((choice.chain.head, choice.parts, attempt))
        return self.true(choice)


def test_a_decisive_timing_is_the_median_of_three_and_a_small_one_is_charged_as_timed():
    from tvm_memplan.split.search import robust_delta

    again = iter([0.01, 0.02])
    assert robust_delta(0.3, lambda attempt: next(again), decisive=0.005) == (0.02, 2)  # the outlier outvoted
    assert robust_delta(-0.3, lambda attempt: 0.01, decisive=0.005) == (0.01, 2)
    assert robust_delta(0.004, lambda attempt: pytest.fail("timed again"), decisive=0.005) == (0.004, 0)
    assert robust_delta(0.3, None, decisive=0.005) == (0.3, 0)  # a measurer that cannot time again


def test_a_cheap_split_whose_first_timing_was_an_outlier_is_still_taken():
    """Its fewest tiles timed dear once (a load spike) would have turned the whole chain away (more tiles
    are never timed after fewer missed): timed again, its true cost is charged."""
    program, chain = inverted_residual()
    measurer = _Noisy(lambda c: 0.01, first={("h", 2): 0.3})
    result = search(program, [chain], 1.0, measurer, budget=0.05)
    assert result.best.choices and result.best.latency_ms == pytest.approx(1.01)
    assert ("h", 2, 1) in measurer.timed and result.retimed >= 1


def test_a_dear_split_timed_cheap_once_does_not_get_in():
    program, chain = inverted_residual()
    measurer = _Noisy(lambda c: 0.5, first={("h", n): -0.3 for n in chain.parts_ladder()})
    result = search(program, [chain], 1.0, measurer, budget=0.05)
    assert not result.best.choices and result.best == result.original


def _two_blocks():
    """Two inverted residuals one after the other, the second larger: the search splits it first, then the first."""
    a_rows, b_rows = 1000, 2000
    sizes = {"x": 8 * a_rows, "h1": 48 * a_rows, "d1": 48 * a_rows, "y1": 8 * a_rows}
    sizes |= {"h2": 48 * b_rows, "d2": 48 * b_rows, "y2": 8 * b_rows}
    names = ["x", "h1", "d1", "y1", "h2", "d2", "y2"]
    steps = [Step(n, n, (p,) if p else ()) for p, n in zip([None, *names], names, strict=False)]
    steps.append(Step("out", "out", ("y2",)))
    first = Chain((Branch("h1", ("d1",), 48, 48),), None, (), "y1", sizes["h1"] + sizes["d1"])
    second = Chain((Branch("h2", ("d2",), 48, 48),), None, (), "y2", sizes["h2"] + sizes["d2"])
    return Program(steps, sizes), first, second


def test_a_split_timed_dear_once_does_not_use_up_the_budget_of_the_next():
    """The second block's split costs 0.005 ms but was timed at 0.04 once: charged as timed, it would leave
    too little of the 0.05 ms budget for the first block's split (0.02 ms)."""
    program, first, second = _two_blocks()
    measurer = _Noisy(lambda c: 0.005 if c.chain == second else 0.02, first={("h2", n): 0.04 for n in (2, 4, 6, 8)})
    result = search(program, [first, second], 1.0, measurer, budget=0.05)
    assert {c.chain for c in result.best.choices} == {first, second}
    assert result.best.latency_ms <= 1.05


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-0.1, 0.3), min_size=15, max_size=15), st.floats(0.0, 0.2))
def test_two_searches_that_read_the_same_retimings_return_the_same_plan(firsts, budget):
    """Timings again are cached per attempt: a second search with the same cache charges the same medians."""
    program, first, second = _two_blocks()
    ladder = [(h, n) for h in ("h1", "h2") for n in (2, 4, 8, 16, 32)][:15]
    disturbed = dict(zip(ladder, firsts, strict=False))

    def runs():
        measurer = _Noisy(lambda c: 0.01 * c.parts / 8, first=disturbed)
        return search(program, [first, second], 1.0, measurer, budget=budget)

    one, two = runs(), runs()
    assert one.best == two.best and one.front == two.front and one.retimed == two.retimed


def test_a_chain_that_moves_a_border_leaves_the_chain_it_cuts_into_its_other_bindings():
    """Chosen: a..b and c..f in 4 row tiles each, b whole between them. a..d alone (c..f dropped leaves e
    whole) and e..f alone (c whole beside b) each raise the peak; a..d with the rest of c..f, e..f, split
    as c..f was, lowers it: the border moves from b to d in one step."""
    program, chains = row_pipeline({"a": 64, "b": 24, "c": 64, "d": 4, "e": 96, "f": 4})
    chosen = (SplitChoice(chains["a", "b"], 4), SplitChoice(chains["c", "f"], 4))
    now = peak(split_program(program, list(chosen))).bytes
    for alone in ([SplitChoice(chains["a", "d"], 4)], [chosen[0], SplitChoice(chains["e", "f"], 4)]):
        assert peak(split_program(program, alone)).bytes > now
    moved = [SplitChoice(chains["a", "d"], 4), SplitChoice(chains["e", "f"], 4)]
    assert peak(split_program(program, moved)).bytes < now
    candidates = [chains["a", "b"], chains["c", "f"], chains["a", "d"], chains["e", "f"]]
    result = search(program, candidates, 1.0, lambda chain, parts: 0.0, budget=1e9, start_from=chosen)
    assert {c.chain for c in result.best.choices} == {chains["a", "d"], chains["e", "f"]}
    assert result.best.peak_bytes <= peak(split_program(program, moved)).bytes


def _guided_and_not(program, chains, floor, cost):
    """Searches toward ``floor`` and unguided, with the same made-up costs: their results and what each timed."""
    results, timed = {}, {}
    for guided in (True, False):
        calls = timed[guided] = []

        def recorded(chain, parts, calls=calls):
            calls.append((chain.tail, parts))
            return cost(chain, parts)

        toward = floor.choices if guided else ()
        results[guided] = search(program, chains, 1.0, recorded, budget=0.05, toward=toward)
    return results, timed


def test_a_search_toward_the_floor_times_the_floor_plans_moves_first():
    """Guided by the simulator's floor, the search takes the floor plan's splits without timing the tiles
    on the way to them (which may each take a minute to compile), and keeps the same plan."""
    program, first, second = _two_blocks()
    floor = simulated_floor(program, [first, second], 10.0)
    results, timed = _guided_and_not(program, [first, second], floor, lambda chain, parts: 0.01)
    assert results[True].best == results[False].best and results[True].best.peak_bytes == floor.peak_bytes
    assert set(timed[True]) < set(timed[False])
    # after the cheapest probe, the floor's parts of the second block before any other of its ladder
    (floor_parts,) = [c.parts for c in floor.choices if c.chain == second]
    assert timed[True][:2] == [("y2", 2), ("y2", floor_parts)] and floor_parts > 4


def test_once_a_floor_move_misses_the_budget_the_search_takes_the_lowest_peaks_first_again():
    """The floor plan is out of reach once one of its moves misses the budget: from there the search times
    moves as unguided does, lowest peak first (the floor's other moves would each be compiled first otherwise)."""
    program, first, second = _two_blocks()
    floor = simulated_floor(program, [first, second], 10.0)
    parts = {c.chain: c.parts for c in floor.choices}
    # each floor move misses the 5 % budget
    results, timed = _guided_and_not(program, [first, second], floor, lambda c, n: 0.2 if n == parts[c] else 0.001)
    assert results[True].best == results[False].best
    missed = ("y2", parts[second])
    assert timed[True][:2] == [("y2", 2), missed]  # the cheapest probe, then the floor's move, which misses
    assert timed[True][2:] == [t for t in timed[False] if t not in timed[True][:2]]


def test_the_floor_with_fused_ways_keeps_a_line_buffer_where_it_holds_less_than_recomputed_halos():
    """Three 3x3 convolutions recompute their halos in every per-kernel tile; fused one tile at a time with a
    line buffer, each keeps two rows instead: the floor with fused ways is lower and runs the chain that way.
    It is never above the per-kernel floor (two descents, the lower kept)."""
    program, chains = row_pipeline({"a": 100, "b": 100, "c": 100, "d": 10}, rows=32)
    per_kernel = simulated_floor(program, list(chains.values()), 5.0)
    fused = simulated_floor(program, list(chains.values()), 5.0, fused=True)
    assert fused.peak_bytes < per_kernel.peak_bytes < peak(program).bytes
    assert [c.variant for c in per_kernel.choices] == ["per-kernel"]
    (choice,) = fused.choices
    assert choice.rolling and choice.fused and choice.concurrent_tiles == 1
    assert peak(split_program(program, [choice])).bytes == fused.peak_bytes
