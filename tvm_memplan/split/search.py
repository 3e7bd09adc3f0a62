"""The optimizer of fine-grained splitting: cut the memory bottleneck chain by chain within a latency budget.

Each round finds the peak of the current plan with the simulator, tries every chain that is live
at the peak with more parts, and keeps the move that lowers the peak most among those whose
measured slowdown keeps the whole model within the budget. A move is a chain, a number of parts and
a way to run the tiles (the measurer's variants: per-kernel tiles, fused tiles with halos recomputed
or kept in a line buffer), each simulated as it runs before anything is timed: a variant whose peak
does not beat the current plan's is never timed, and of a move's variants with the same peak the
fastest as measured is kept. A timing that decides the budget (a tenth of it or more, either way) is
the median of three independent ones (:data:`RETIMES`): one timing disturbed by load would otherwise
charge the budget with a cost the chain does not have, or turn a cheap move away, and two searches
with fresh caches would part there. Every measured plan is a point of the Pareto front (peak bytes against
latency); the search stops when no move helps, the memory limit is met, or the time is up.

Guided by the floor (:func:`simulated_floor`, the lowest peak the simulator finds with every split free), the
moves the floor plan makes are timed before the others: a greedy descent that times the lowest peak first
spends its time compiling dear variants of chains the floor plan leaves alone (SqueezeNet in NCHW16c stopped
at its time limit at 2.73x, compiling 16-tile fire-module chains, while the chain holding its 7.73x floor
cost +1 % fused).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypedDict

from .chain import Chain, SpatialChain, SplitChoice
from .simulate import Peak, Program, peak, split_program

if TYPE_CHECKING:
    from typing_extensions import Unpack

ChainDelta = Callable[[Chain, int], float]
"""``chain_delta_ms(chain, parts)``: the measured latency change of splitting ``chain`` into ``parts``.
A measurer with variants also answers ``splits(chain, parts)`` (the :class:`SplitChoice` it can time,
without timing them) and ``split_delta(choice)`` (the latency change of one of them); one that can time a split
again answers ``retime(choice, attempt)`` (an independent timing, the same for the same attempt: cached)."""

SEARCH_SECONDS = 60.0
"""The default time limit of a search."""

RETIMES = 2
"""Further independent timings of a split whose first timing is decisive (:data:`DECISIVE_SHARE`); the
search charges the median of all of them."""

DECISIVE_SHARE = 0.1
"""A split's timing is decisive when it adds or saves this share of the latency budget (in ms) or more:
smaller ones cannot mislead the search much, and timing again costs runs, not compiles."""


NOTHING_WITHIN = "no split lowers the peak within the budget"
"""Why a search ended that had time left."""


class SearchOptions(TypedDict, total=False):
    """The keyword arguments :func:`search_phased` passes on to :func:`search`."""

    budget: float
    seconds: float
    memory_limit: int | None
    progress: Callable[[int, int], None] | None
    toward: tuple[SplitChoice, ...]


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
    pruned: int = 0
    """Variants not timed because a cheaper split of their chain, run the same way, missed the budget."""
    retimed: int = 0
    """Splits timed again because their first timing was decisive (:data:`DECISIVE_SHARE`)."""
    fallback: Point | None = None
    """A plan to confirm when the front's points miss the budget as a whole model: the channel
    phase's (:func:`search_phased`), which the spatial phase's points may dominate by estimate."""


def pareto(points: list[Point]) -> list[Point]:
    front: list[Point] = []
    for p in sorted(points, key=lambda p: (p.peak_bytes, p.latency_ms)):
        if not front or p.latency_ms < front[-1].latency_ms:
            front.append(p)
    return front


def with_original(front: list[Point], original: Point) -> list[Point]:
    """The front with the unsplit plan kept as its last point, the reference every split is read
    against (chains timed a little faster split than whole, within noise, would drop it)."""
    return front if original in front else [p for p in front if p.peak_bytes < original.peak_bytes] + [original]


def _fastest_fitting(front: list[Point], memory_limit: int | None, otherwise: Point) -> Point:
    """Under a memory limit, the fastest point of the front that fits (``otherwise`` when none does
    or there is no limit)."""
    fitting = [p for p in front if memory_limit is not None and p.peak_bytes <= memory_limit]
    return min(fitting, key=lambda p: p.latency_ms) if fitting else otherwise


def _variants(
    chain_delta_ms: ChainDelta,
) -> tuple[Callable[[Chain, int], list[SplitChoice]], Callable[[SplitChoice], float]]:
    """The measurer's variants of a split and the timing of one (a plain callable: per-kernel tiles)."""
    splits = getattr(chain_delta_ms, "splits", None)
    split_delta = getattr(chain_delta_ms, "split_delta", None)
    if splits is None or split_delta is None:
        return (lambda chain, parts: [SplitChoice(chain, parts)]), (lambda c: chain_delta_ms(c.chain, c.parts))
    return splits, split_delta


def robust_delta(
    first: float, retime: Callable[[int], float] | None, decisive: float, retimes: int = RETIMES
) -> tuple[float, int]:
    """The latency change to charge for a split timed ``first``, and how many more timings it took: a
    decisive timing (``abs(first) >= decisive``) is timed ``retimes`` times more (``retime(attempt)``)
    and the median of all is charged, so that one timing disturbed by load, dear or cheap, is outvoted."""
    if retime is None or abs(first) < decisive:
        return first, 0
    samples = [first, *(retime(attempt) for attempt in range(1, retimes + 1))]
    return statistics.median(samples), retimes


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
    toward: tuple[SplitChoice, ...] = (),
) -> SearchResult:
    """Greedy descent on the simulated peak from the plan ``start_from`` (none: unsplit);
    ``chain_delta_ms`` measures the latency change of a split (:data:`ChainDelta`, cached by the caller).
    ``progress(latencies measured, lowest accepted peak)`` is called after each measurement and each
    accepted move.

    Before timing, moves are pruned by the simulator: a variant is timed only when its simulated peak
    beats the current plan's, and not when a variant of the same chain run the same way with fewer
    parts has been timed over the budget (tiles only add launches and halos), which is why the fewest
    parts of a chain that lower the peak are timed before its more parts. Moves that split a chain into
    as many parts as the plan ``toward`` does (the floor's) are timed before all others."""
    if budget < 0:
        raise ValueError("latency budget must not be negative")
    start = time.monotonic()
    allowed = base_latency_ms * (1 + budget)
    splits_of, split_delta = _variants(chain_delta_ms)
    retime = getattr(chain_delta_ms, "retime", None)
    decisive = DECISIVE_SHARE * budget * base_latency_ms
    state: dict[Chain, SplitChoice] = {c.chain: c for c in start_from}
    deltas: dict[SplitChoice, float] = {}
    evaluated = measured = pruned = retimed = 0

    def delta(choice: SplitChoice) -> float:
        nonlocal measured, retimed
        if choice not in deltas:
            again = (lambda attempt: retime(choice, attempt)) if retime is not None else None
            deltas[choice], more = robust_delta(split_delta(choice), again, decisive)
            measured += 1
            retimed += more > 0
            report()
        return deltas[choice]

    def report() -> None:
        if progress is not None:
            progress(measured, current.bytes)

    def latency_of(s: dict[Chain, SplitChoice]) -> float:
        return base_latency_ms + sum(delta(c) for c in s.values())

    def over_budget(choice: SplitChoice, rest: float) -> bool:
        """Already known to miss: the same chain, run the same way, in no more parts, timed over."""
        return memory_limit is None and any(
            c.chain == choice.chain and c.variant == choice.variant and c.parts <= choice.parts and rest + d > allowed
            for c, d in deltas.items()
        )

    by_bindings = {_shape_key(c, c.bindings): c for c in chains}
    floor_moves = {(c.chain, c.parts) for c in toward}
    original = Point((), peak(program).bytes, base_latency_ms)
    current = peak(split_program(program, list(start_from)))
    points = [original] + ([Point(tuple(start_from), current.bytes, latency_of(state))] if start_from else [])
    stopped = NOTHING_WITHIN
    while True:
        if memory_limit is not None and current.bytes <= memory_limit:
            stopped = "memory limit met"
            break
        if time.monotonic() - start > seconds:
            stopped = "search time limit"
            break
        # (chain, parts, peak) → the variants of that move that reach this peak
        moves: dict[tuple[Chain, int, int, int], list[tuple[Chain, dict[Chain, SplitChoice], Peak]]] = {}
        for chain in chains:
            # a chain that overlaps chosen ones replaces them (a pool branch's chain and its
            # inception module's), which keep their bindings outside it where a chain holds exactly
            # those: the simulator says whether the exchange lowers the peak
            kept = {c: s for c, s in state.items() if c == chain or not set(c.bindings) & set(chain.bindings)}
            kept |= _remainders(state, chain, by_bindings)
            for parts in chain.parts_ladder():
                if chain in state and parts <= state[chain].parts:
                    continue
                for split in splits_of(chain, parts):
                    trial = {**kept, chain: split}
                    p = peak(split_program(program, list(trial.values())))
                    evaluated += 1
                    if (p.bytes, p.steps_at_peak) < (current.bytes, current.steps_at_peak):
                        moves.setdefault((chain, parts, p.bytes, p.steps_at_peak), []).append((chain, trial, p))
        # The floor plan's moves first; then lowest peak first; of equal peaks, the fewest tiles (the cheapest).
        ordered = sorted(
            moves.values(),
            key=lambda m: (
                _chain_parts(m) not in floor_moves,
                m[0][2].bytes,
                m[0][2].steps_at_peak,
                sum(s.parts for s in m[0][1].values()),
            ),
        )
        # per chain and way of running its tiles, the move with the fewest tiles (timed first)
        cheapest: dict[tuple[Chain, str], tuple[dict[Chain, SplitChoice], Peak]] = {}
        for variants in moves.values():
            for chain, trial, p in variants:
                key = (chain, trial[chain].variant)
                if key not in cheapest or trial[chain].parts < cheapest[key][0][chain].parts:
                    cheapest[key] = (trial, p)
        accepted = regroup = False
        fitting = [m for m in ordered if memory_limit is not None and m[0][2].bytes <= memory_limit]
        if fitting:
            # the limit is in reach: of the moves that reach it, the fastest
            timed = []
            for variants in fitting[:8]:
                for _, trial, p in variants:
                    latency = latency_of(trial)
                    points.append(Point(tuple(trial.values()), p.bytes, latency))
                    timed.append((latency, p.bytes, trial, p))
            _, _, state, current = min(timed, key=lambda t: (t[0], t[1]))
            accepted = True
            ordered = []
        for variants in ordered:
            if time.monotonic() - start > seconds:
                stopped = "search time limit"
                break
            best = None
            for chain, trial, p in variants:
                if time.monotonic() - start > seconds:
                    # a move's variants can each take a minute to compile (fused tiles of a long spatial
                    # chain at 16 parts on a loaded 2-core machine): of those timed, the best
                    stopped = "search time limit"
                    break
                rest = latency_of({c: s for c, s in trial.items() if c != chain})
                probe, probe_peak = cheapest[(chain, trial[chain].variant)]
                if probe[chain] not in deltas and probe[chain].parts < trial[chain].parts:
                    # its fewest tiles first: if those miss, no more tiles are timed
                    points.append(Point(tuple(probe.values()), probe_peak.bytes, latency_of(probe)))
                if trial[chain] not in deltas and over_budget(trial[chain], rest):
                    pruned += 1
                    continue
                latency = latency_of(trial)
                points.append(Point(tuple(trial.values()), p.bytes, latency))
                if (latency <= allowed or memory_limit is not None) and (best is None or latency < best[0]):
                    best = (latency, trial, p)
            if best is not None:
                _, state, current = best
                accepted = True
                break
            if _chain_parts(variants) in floor_moves:
                # a move of the floor plan missed the budget: the floor is out of reach, and the lowest peaks
                # first are the better guide from here (MobileNetV2's floor splits two long chains gathered,
                # per kernel, +15 % each: followed on, the search spent its time compiling them, 2.14x
                # against 4.04x unguided)
                floor_moves = set()
                regroup = True
                break
        if regroup and not accepted:
            continue
        if not accepted:
            break
        report()
    if memory_limit is not None and current.bytes <= memory_limit and state:
        state, current = _fewer_tiles(program, state, current, memory_limit, latency_of, points)
    front = with_original(pareto(points), original)
    final = _fastest_fitting(front, memory_limit, Point(tuple(state.values()), current.bytes, latency_of(state)))
    return SearchResult(
        final,
        original,
        front,
        evaluated,
        measured,
        time.monotonic() - start,
        stopped,
        peak(split_program(program, list(final.choices))),
        pruned=pruned,
        retimed=retimed,
    )


class _FreeSplits:
    """Every way a chain's tiles can run one tile at a time, each costing nothing: per kernel and, where the
    tiles can be one kernel (``fused``), fused with halos recomputed or kept in a line buffer (a spatial
    chain's line buffer can hold fewer rows than its recomputed halos: mcu_cnn's stem chain in NCHW16c, 3.81x
    against 3.48x per kernel)."""

    def __init__(self, fused: bool) -> None:
        self.fused = fused

    def __call__(self, chain: Chain, parts: int) -> float:
        return 0.0

    def splits(self, chain: Chain, parts: int) -> list[SplitChoice]:
        ways = [SplitChoice(chain, parts)]
        if self.fused and chain.fusable:
            ways.append(SplitChoice(chain, parts, fused=True))
            if isinstance(chain, SpatialChain) and chain.has_halo(parts):
                ways.append(SplitChoice(chain, parts, fused=True, rolling=True))
        return ways

    def split_delta(self, choice: SplitChoice) -> float:
        return 0.0


def simulated_floor(program: Program, chains: list[Chain], seconds: float, fused: bool = False) -> Point:
    """The simulator's lowest peak with every chain free to split (each split costing nothing), one tile at a
    time, per kernel or (with ``fused``) also as one kernel: the greedy descent without a latency budget, stopped
    after ``seconds`` if it has not ended by then. With ``fused`` a second descent, with the fused ways, runs in
    the time the per-kernel one left, and the lower peak is kept, as XLA's heap simulator keeps the best of its
    algorithms: more ways can lead a greedy descent elsewhere (MobileNetV2 in NCHW16c: 6.89x per kernel, 5.44x
    with fused ways), and they triple the plans each step simulates (MobileNetV2-0.35: 16 s per kernel, 37 s
    with them; given half of 12 s each, the per-kernel floor fell from 6.26x to 3.49x)."""
    started = time.monotonic()
    floor = search_phased(program, chains, 1.0, _FreeSplits(False), budget=1e9, seconds=seconds).best
    left = seconds - (time.monotonic() - started)
    if fused and left > 0:
        with_fused = search_phased(program, chains, 1.0, _FreeSplits(True), budget=1e9, seconds=left).best
        floor = min(floor, with_fused, key=lambda point: point.peak_bytes)
    return floor


def _chain_parts(variants: list[tuple[Chain, dict[Chain, SplitChoice], Peak]]) -> tuple[Chain, int]:
    """The chain a move splits and into how many parts (what a floor plan's move is matched on)."""
    chain, trial, _ = variants[0]
    return chain, trial[chain].parts


def _shape_key(chain: Chain, bindings: tuple[str, ...]) -> tuple:
    """What a chain holding ``bindings`` must share with ``chain`` to take its split: kind and gathering."""
    return type(chain), getattr(chain, "gathered", False), frozenset(bindings)


def _remainders(
    state: dict[Chain, SplitChoice], chain: Chain, by_bindings: dict[tuple, Chain]
) -> dict[Chain, SplitChoice]:
    """For each chosen chain that ``chain`` overlaps, the chain of the same kind holding exactly its other
    bindings, split the same way (where that chain takes as many parts and runs its tiles so). A greedy
    descent that drops an overlapped chain whole cannot move a chain's border: MobileNetV2-1.0 in NCHW16c
    stopped at 3.47x with the stem split up to ``lv20`` and the next block from ``lv21``, where the stem
    chain to ``lv41`` and the block from ``lv42`` reach 7.78x (the simulator's floor, latency ignored)."""
    covered = set(chain.bindings)
    found: dict[Chain, SplitChoice] = {}
    for other, split in state.items():
        if other == chain or not covered & set(other.bindings):
            continue
        rest = tuple(b for b in other.bindings if b not in covered)
        remainder = by_bindings.get(_shape_key(other, rest)) if rest else None
        if remainder is None or split.parts not in remainder.parts_ladder():
            continue
        if split.fused and not remainder.fusable:
            continue
        found[remainder] = replace(split, chain=remainder)
    return found


def _fewer_tiles(
    program: Program,
    state: dict[Chain, SplitChoice],
    current: Peak,
    memory_limit: int,
    latency_of: Callable[[dict[Chain, SplitChoice]], float],
    points: list[Point],
) -> tuple[dict[Chain, SplitChoice], Peak]:
    """The greedy descent takes the lowest peak at each step, whatever it costs; once the limit is met,
    give back tiles where that is cheaper and still fits (fewer parts of a chosen chain, run the same
    way, or none), the fastest such change at a time, until none is faster (as MCUNetV2 picks the
    fewest patches that fit)."""
    while True:
        best = (latency_of(state), state, current)
        for chain, split in state.items():
            for fewer in [1, *(p for p in chain.parts_ladder() if p < split.parts)]:
                others = {c: s for c, s in state.items() if c != chain}
                trial = others | ({chain: replace(split, parts=fewer)} if fewer > 1 else {})
                p = peak(split_program(program, list(trial.values())))
                if p.bytes > memory_limit:
                    continue
                latency = latency_of(trial)
                points.append(Point(tuple(trial.values()), p.bytes, latency))
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
    plan, spatial chains only go lower. Each phase has half of ``seconds`` at least (the second
    what the first left, when more). Under a memory limit both phases start unsplit and the
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

    # a timing started before the channel phase's half ends after it (a chain compiled and timed three times,
    # 20-30 s on a loaded 2-core machine): the overrun is not taken from the spatial phase, which holds the
    # lowest peaks (MobileNetV2-0.35 in NCHW16c: 33 s left after an 87 s channel phase, 2.72x against 3.89x)
    left = max(seconds - (time.monotonic() - started), seconds / 2)
    # under a memory limit the channel plan may already fit: the second phase then starts unsplit,
    # so that spatial plans that fit compete on latency with it
    start_from = () if memory_limit is not None else first.best.choices
    phase = {**options, "seconds": left, "progress": second_progress}
    second = search(program, chains, base_latency_ms, chain_delta_ms, start_from=start_from, **phase)
    front = with_original(pareto(first.front + second.front), first.original)
    best = _fastest_fitting(front, memory_limit, second.best)
    return SearchResult(
        best,
        first.original,
        front,
        first.evaluated + second.evaluated,
        first.measured + second.measured,
        time.monotonic() - started,
        second.stopped
        if first.stopped != "search time limit"
        else f"{second.stopped} (channel phase: search time limit)",
        peak(split_program(program, list(best.choices))),
        first.pruned + second.pruned,
        first.retimed + second.retimed,
        first.best,
    )
