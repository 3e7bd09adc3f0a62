"""The optimizer of fine-grained splitting: cut the memory bottleneck chain by chain within a latency budget.

Each round finds the peak of the current plan with the simulator, tries every chain that is live
at the peak with more parts, and keeps the move that lowers the peak most among those whose
measured slowdown keeps the whole model within the budget. Every measured plan is a point of the
Pareto front (peak bytes against latency); the search stops when no move helps, the memory limit
is met, or the time is up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

from .chain import Chain, SpatialChain, SplitChoice
from .simulate import Peak, Program, peak, split_program

if TYPE_CHECKING:
    from typing_extensions import Unpack

ChainDelta = Callable[[Chain, int], float]
"""``chain_delta_ms(chain, parts)``: the measured latency change of splitting ``chain`` into ``parts``."""

SEARCH_SECONDS = 60.0
"""The default time limit of a search."""


class SearchOptions(TypedDict, total=False):
    """The keyword arguments :func:`search_phased` passes on to :func:`search`."""

    budget: float
    seconds: float
    memory_limit: int | None
    progress: Callable[[int, int], None] | None


@dataclass(frozen=True)
class Point:
    """One plan the search measured."""

    choices: tuple[SplitChoice, ...]
    peak_bytes: int
    latency_ms: float


@dataclass
class SearchResult:
    best: Point
    original: Point
    front: list[Point]
    """Pareto-optimal points (no other point is both smaller and faster), by peak."""
    evaluated: int
    """Plans simulated."""
    measured: int
    """(chain, parts) latencies asked of the measurer."""
    seconds: float
    stopped: str
    """Why the search ended."""
    bottleneck: Peak = field(default=None)  # type: ignore[assignment]
    """The peak of the kept plan: what limits it now."""
    fallback: Point | None = None
    """A plan to confirm when the front's points miss the budget as a whole model: the channel
    phase's (:func:`search_phased`), which the spatial phase's points may dominate by estimate."""


def pareto(points: list[Point]) -> list[Point]:
    front: list[Point] = []
    for p in sorted(points, key=lambda p: (p.peak_bytes, p.latency_ms)):
        if not front or p.latency_ms < front[-1].latency_ms:
            front.append(p)
    return front


def _with_original(front: list[Point], original: Point) -> list[Point]:
    """The front with the unsplit plan kept as its last point, the reference every split is read
    against (chains timed a little faster split than whole, within noise, would drop it)."""
    return front if original in front else [p for p in front if p.peak_bytes < original.peak_bytes] + [original]


def _fastest_fitting(front: list[Point], memory_limit: int | None, otherwise: Point) -> Point:
    """Under a memory limit, the fastest point of the front that fits (``otherwise`` when none does
    or there is no limit)."""
    fitting = [p for p in front if memory_limit is not None and p.peak_bytes <= memory_limit]
    return min(fitting, key=lambda p: p.latency_ms) if fitting else otherwise


def search(
    program: Program,
    chains: list[Chain],
    base_latency_ms: float,
    chain_delta_ms: ChainDelta,
    budget: float = 0.05,
    seconds: float = SEARCH_SECONDS,
    memory_limit: int | None = None,
    start_from: tuple[SplitChoice, ...] = (),
    progress: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """Greedy descent on the simulated peak from the plan ``start_from`` (none: unsplit);
    ``chain_delta_ms(chain, parts)`` is the measured latency change of splitting ``chain`` into
    ``parts`` (cached by the caller). ``progress(latencies measured, lowest accepted peak)`` is called
    after each measurement and each accepted move."""
    if budget < 0:
        raise ValueError("latency budget must not be negative")
    start = time.monotonic()
    allowed = base_latency_ms * (1 + budget)
    state: dict[Chain, int] = {c.chain: c.parts for c in start_from}
    deltas: dict[tuple[Chain, int], float] = {}
    evaluated = measured = 0

    def delta(chain: Chain, parts: int) -> float:
        nonlocal measured
        if (chain, parts) not in deltas:
            deltas[(chain, parts)] = chain_delta_ms(chain, parts)
            measured += 1
            report()
        return deltas[(chain, parts)]

    def report() -> None:
        if progress is not None:
            progress(measured, current.bytes)

    # how a measured split runs (fused tiles where those were faster): its peak is simulated as it runs
    choose: Callable[[Chain, int], SplitChoice] = getattr(chain_delta_ms, "choice", SplitChoice)

    def choices_of(s: dict[Chain, int]) -> tuple[SplitChoice, ...]:
        return tuple(choose(c, p) if (c, p) in deltas else SplitChoice(c, p) for c, p in s.items())

    def latency_of(s: dict[Chain, int]) -> float:
        return base_latency_ms + sum(delta(c, p) for c, p in s.items())

    original = Point((), peak(program).bytes, base_latency_ms)
    current = peak(split_program(program, list(start_from)))
    points = [original] + ([Point(tuple(start_from), current.bytes, latency_of(state))] if start_from else [])
    stopped = "no split lowers the peak within the budget"
    while True:
        if memory_limit is not None and current.bytes <= memory_limit:
            stopped = "memory limit met"
            break
        if time.monotonic() - start > seconds:
            stopped = "search time limit"
            break
        moves: list[tuple[int, dict[Chain, int], Peak]] = []
        for chain in chains:
            # a chain that overlaps chosen ones replaces them (a pool branch's chain and its
            # inception module's): the simulator says whether the exchange lowers the peak
            kept = {c: p for c, p in state.items() if c == chain or not set(c.bindings) & set(chain.bindings)}
            for parts in chain.parts_ladder():
                if parts <= state.get(chain, 1):
                    continue
                trial = {**kept, chain: parts}
                p = peak(split_program(program, list(choices_of(trial))))
                evaluated += 1
                if (p.bytes, p.steps_at_peak) < (current.bytes, current.steps_at_peak):
                    moves.append((p.bytes, trial, p))
        # Lowest peak first; of equal peaks, the fewest tiles (the cheapest).
        moves.sort(key=lambda m: (m[0], m[2].steps_at_peak, sum(m[1].values())))
        accepted = False
        fitting = [m for m in moves if memory_limit is not None and m[0] <= memory_limit]
        if fitting:
            # the limit is in reach: of the moves that reach it, the fastest
            timed = []
            for _, trial, _ in fitting[:8]:
                latency = latency_of(trial)
                p = peak(split_program(program, list(choices_of(trial))))
                bytes_ = p.bytes
                points.append(Point(choices_of(trial), bytes_, latency))
                timed.append((latency, bytes_, trial, p))
            _, _, state, current = min(timed, key=lambda t: (t[0], t[1]))
            accepted = True
            moves = []
        for bytes_, trial, p in moves:
            if time.monotonic() - start > seconds:
                break
            latency = latency_of(trial)
            p = peak(split_program(program, list(choices_of(trial))))  # as measured: fused workers' scratch
            if (p.bytes, p.steps_at_peak) >= (current.bytes, current.steps_at_peak):
                continue
            bytes_ = p.bytes
            points.append(Point(choices_of(trial), bytes_, latency))
            if latency <= allowed or memory_limit is not None:
                state, current, accepted = trial, p, True
                break
        if not accepted:
            break
        report()
    if memory_limit is not None and current.bytes <= memory_limit and state:
        state, current = _fewer_tiles(program, state, current, memory_limit, latency_of, choices_of, points)
    front = _with_original(pareto(points), original)
    final = _fastest_fitting(front, memory_limit, Point(choices_of(state), current.bytes, latency_of(state)))
    return SearchResult(
        final,
        original,
        front,
        evaluated,
        measured,
        time.monotonic() - start,
        stopped,
        peak(split_program(program, list(final.choices))),
    )


def _fewer_tiles(
    program: Program,
    state: dict[Chain, int],
    current: Peak,
    memory_limit: int,
    latency_of: Callable[[dict[Chain, int]], float],
    choices_of: Callable[[dict[Chain, int]], tuple[SplitChoice, ...]],
    points: list[Point],
) -> tuple[dict[Chain, int], Peak]:
    """The greedy descent takes the lowest peak at each step, whatever it costs; once the limit is met,
    give back tiles where that is cheaper and still fits (fewer parts of a chosen chain, or none), the
    fastest such change at a time, until none is faster (as MCUNetV2 picks the fewest patches that fit)."""
    while True:
        best = (latency_of(state), state, current)
        for chain, parts in state.items():
            for fewer in [1, *(p for p in chain.parts_ladder() if p < parts)]:
                trial = {c: p for c, p in state.items() if c != chain} | ({chain: fewer} if fewer > 1 else {})
                p = peak(split_program(program, list(choices_of(trial))))
                if p.bytes > memory_limit:
                    continue
                latency = latency_of(trial)
                points.append(Point(choices_of(trial), p.bytes, latency))
                if latency < best[0]:
                    best = (latency, trial, p)
        if best[1] is state:
            return state, current
        state, current = best[1], best[2]


def search_phased(
    program: Program,
    chains: list[Chain],
    base_latency_ms: float,
    chain_delta_ms: ChainDelta,
    **options: Unpack[SearchOptions],
) -> SearchResult:
    """:func:`search` over the channel and row chains first, then over every chain from the plan
    it kept. Spatial chains reach across blocks, so a greedy search that takes one first can be
    left where no other move lowers the peak, above what channel tiles reach alone (MobileNetV2-1.0's
    simulated floor: 3.47x greedy over all chains, 4.90x over channel chains); from the channel
    plan, spatial chains only go lower. Under a memory limit both phases start unsplit and the
    fastest plan that fits on either front is kept."""
    plain = [c for c in chains if not isinstance(c, SpatialChain)]
    if not plain or len(plain) == len(chains):
        return search(program, chains, base_latency_ms, chain_delta_ms, **options)
    seconds = options.get("seconds", SEARCH_SECONDS)
    memory_limit, progress = options.get("memory_limit"), options.get("progress")
    started = time.monotonic()
    first = search(program, plain, base_latency_ms, chain_delta_ms, **{**options, "seconds": seconds / 2})

    def second_progress(measured: int, peak_bytes: int) -> None:
        """The second phase counts on from the first; its peak is compared with the first's."""
        if progress is not None:
            progress(first.measured + measured, min(peak_bytes, first.best.peak_bytes))

    left = max(seconds - (time.monotonic() - started), 0.0)
    # under a memory limit the channel plan may already fit: the second phase then starts unsplit,
    # so that spatial plans that fit compete on latency with it
    start_from = () if memory_limit is not None else first.best.choices
    phase = {**options, "seconds": left, "progress": second_progress}
    second = search(program, chains, base_latency_ms, chain_delta_ms, start_from=start_from, **phase)
    front = _with_original(pareto(first.front + second.front), first.original)
    best = _fastest_fitting(front, memory_limit, second.best)
    return SearchResult(
        best,
        first.original,
        front,
        first.evaluated + second.evaluated,
        first.measured + second.measured,
        time.monotonic() - started,
        second.stopped,
        peak(split_program(program, list(best.choices))),
        first.best,
    )
