"""Branch-and-bound over canonical placements, after MiniMalloc (Moffitt, ASPLOS 2023).

Why: best-fit greedies leave 25-40% of the arena unused on hard instances (MiniMalloc's
"challenging" set), and no greedy order closes that gap. A depth-first search that only
builds *canonical* placements does: buffers go in non-decreasing offset order, each at the
lowest offset its already-placed neighbours leave free, so every placement that cannot be
pushed down is enumerated exactly once. Four rules prune the tree without losing a solution:

* dominance: skip a buffer whose offset is at or above the top some other buffer could reach
  beneath it (that gap would be filled in a gravity-normalised solution);
* hatless: a buffer with no unplaced neighbours is placed once, never re-tried;
* section inference: in every maximal clique of lifetimes ("section") the unplaced buffers
  must stack between their lowest possible offset and the capacity;
* decomposition: once no unplaced buffer (nor conflict pair) spans a section boundary, the two
  sides are solved independently.

The search answers "does a placement fit in ``capacity``?". :class:`CanonicalSearch` turns it
into an anytime minimiser: a binary search over capacities between the lower bound and the best
greedy arena, each probe running a portfolio of preorders (MiniMalloc's three, with doubling
node limits, interleaved with randomised restarts that break its heavy-tailed runs).
"""

from __future__ import annotations

import bisect
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from ..problem import Problem
from .base import Allocator, arena_bytes
from .greedy import GreedyBestFit, by_area, by_lifetime, by_size

_UNREACHABLE = 1 << 60
"""Minimum offset of a placed buffer: never the lowest in a section."""

PREORDERS = ("WAT", "TAW", "TWA")
"""MiniMalloc's static preorders: descending (W)idth of lifetime, (A)rea, section (T)otal."""


class SearchStopped(Exception):
    """A search run hit its node limit or deadline before deciding."""


@dataclass
class SearchStructure:
    """The problem as the search sees it: sizes in alignment units, neighbours and sections.

    Only buffers with a non-zero size take part (``index`` maps back to the problem).
    The first ``time_sections`` sections are the maximal cliques of the lifetime-interval
    graph, in time order: buffer ``i`` lives in sections ``first[i] <= s < end[i]``. Each
    declared conflict between buffers that never live together adds one more section (the pair
    and every buffer alive with both), listed per buffer in ``conflict_sections``, so the
    section inference sees conflicts too.
    """

    index: list[int]
    sizes: list[int]
    neighbours: list[list[int]]
    first: list[int]
    end: list[int]
    time_sections: int
    conflict_sections: list[list[int]]
    section_members: np.ndarray
    """(sections, widest section) buffer indices, padded with ``len(sizes)``."""
    section_totals: list[int]
    spans: list[tuple[int, int]]
    """Time-section boundaries ``[lo, hi)`` each buffer (then each conflict pair) holds together."""
    spans_of: list[list[int]]
    """Span ids a buffer releases when placed: its own, then its conflict pairs'."""
    preorder_keys: dict[str, list[int]]
    """Per-buffer keys of the static preorders (larger goes first)."""
    twins: list[list[int]]
    """Groups of interchangeable buffers (same size, lifetime and conflicts), placed in rank order."""

    @classmethod
    def build(cls, problem: Problem) -> SearchStructure:
        padded = problem.padded_sizes()
        index = [i for i, size in enumerate(padded) if size > 0]
        local = {original: i for i, original in enumerate(index)}
        sizes = [padded[i] // problem.alignment for i in index]
        lifetimes = [(problem.buffers[i].start, problem.buffers[i].end) for i in index]
        n = len(index)
        events = sorted(
            [(start, 1, i) for i, (start, _) in enumerate(lifetimes)]
            + [(end, 0, i) for i, (_, end) in enumerate(lifetimes)]
        )
        # At equal times ends (0) sort before starts (1): lifetimes are half-open.
        neighbours: list[list[int]] = [[] for _ in range(n)]
        first, end = [0] * n, [0] * n
        sections: list[list[int]] = []
        active: set[int] = set()
        grew = False
        for _, is_start, i in events:
            if is_start:
                for j in active:
                    neighbours[i].append(j)
                    neighbours[j].append(i)
                active.add(i)
                first[i] = len(sections)
                grew = True
            else:
                if grew:  # the active set just before a buffer ends is a maximal clique
                    sections.append(sorted(active))
                    grew = False
                active.discard(i)
                end[i] = len(sections)
        time_sections = len(sections)
        spans = [(first[i], end[i] - 1) for i in range(n)]
        spans_of = [[i] for i in range(n)]
        lives_with = [set(nb) for nb in neighbours]
        declared: list[set[int]] = [set() for _ in range(n)]
        conflict_sections: list[list[int]] = [[] for _ in range(n)]
        for a, b in sorted(problem.conflicts):
            if a not in local or b not in local:
                continue  # a zero-size buffer shares no bytes
            i, j = local[a], local[b]
            declared[i].add(j)
            declared[j].add(i)
            if j in lives_with[i]:
                continue
            neighbours[i].append(j)
            neighbours[j].append(i)
            spans_of[i].append(len(spans))
            spans_of[j].append(len(spans))
            spans.append((min(first[i], first[j]), max(end[i], end[j]) - 1))
            clique = sorted({i, j} | (lives_with[i] & lives_with[j]))
            for k in clique:
                conflict_sections[k].append(len(sections))
            sections.append(clique)
        widest = max((len(s) for s in sections), default=0)
        members = np.full((len(sections), widest), n, dtype=np.int64)
        for s, section in enumerate(sections):
            members[s, : len(section)] = section
        totals = [sum(sizes[i] for i in section) for section in sections]
        width = [end - start for start, end in lifetimes]
        keys = {
            "W": width,
            "A": [w * s for w, s in zip(width, sizes, strict=True)],
            "T": [max(totals[s] for s in (*range(first[i], end[i]), *conflict_sections[i])) for i in range(n)],
        }
        groups: dict[tuple, list[int]] = {}
        for i in range(n):
            groups.setdefault((sizes[i], lifetimes[i], frozenset(declared[i])), []).append(i)
        twins = [group for group in groups.values() if len(group) > 1]
        return cls(
            index,
            sizes,
            neighbours,
            first,
            end,
            time_sections,
            conflict_sections,
            members,
            totals,
            spans,
            spans_of,
            keys,
            twins,
        )

    def __len__(self) -> int:
        return len(self.sizes)

    def rank(self, preorder: str, rng: random.Random | None = None, noise: float = 0.0) -> list[int]:
        """Position of every buffer in ``preorder``; ``noise`` scales keys by up to ``1 + noise``."""
        columns = [self.preorder_keys[letter] for letter in preorder]
        if rng is not None and noise:
            columns = [[k * (1.0 + noise * rng.random()) for k in column] for column in columns]
        order = sorted(range(len(self)), key=lambda i: tuple(-column[i] for column in columns) + (i,))
        rank = [0] * len(self)
        for position, i in enumerate(order):
            rank[i] = position
        return rank


def fits_within(
    structure: SearchStructure,
    capacity: int,
    rank: Sequence[int],
    node_limit: int,
    deadline: float,
) -> list[int] | None:
    """Offsets (in units) of a placement within ``capacity`` units, or None when none exists.

    Raises :class:`SearchStopped` when ``node_limit`` nodes or the ``deadline`` pass first. ``rank``
    breaks ties between buffers at the same offset; any rank gives a complete search. Twins go
    in rank order: swapping two of them changes no byte, so only one of the swaps is explored.
    """
    n = len(structure)
    sizes, neighbours = structure.sizes, structure.neighbours
    first, end = structure.first, structure.end
    conflict_sections = structure.conflict_sections
    has_conflict_sections = len(structure.section_totals) > structure.time_sections
    members = structure.section_members
    if n == 0:
        return []
    if max(sizes) > capacity or max(structure.section_totals) > capacity:
        return None
    totals = np.array(structure.section_totals, dtype=np.int64)
    boundary_count = max(structure.time_sections - 1, 0)
    cuts = np.zeros(boundary_count + 1, dtype=np.int64)  # one spare slot keeps slices valid
    for lo, hi in structure.spans:
        cuts[lo:hi] += 1
    span_open = [True] * len(structure.spans)
    min_offset = [0] * n
    lowest = np.zeros(n + 1, dtype=np.int64)  # min_offset of unplaced buffers, for sections
    lowest[n] = _UNREACHABLE
    placed = [False] * n
    offsets = [0] * n
    waits_for = [-1] * n  # the twin that must be placed first
    for group in structure.twins:
        in_rank_order = sorted(group, key=rank.__getitem__)
        for before, after in pairwise(in_rank_order):
            waits_for[after] = before
    nodes = 0
    monotonic = time.monotonic

    def release_spans(i: int) -> list[int]:
        released = [s for s in structure.spans_of[i] if span_open[s]]
        for s in released:
            span_open[s] = False
            lo, hi = structure.spans[s]
            cuts[lo:hi] -= 1
        return released

    def restore_spans(released: list[int]) -> None:
        for s in released:
            span_open[s] = True
            lo, hi = structure.spans[s]
            cuts[lo:hi] += 1

    def splits(released: list[int]) -> bool:
        """Whether releasing these spans left a section boundary that nothing unplaced crosses."""
        for s in released:
            lo, hi = structure.spans[s]
            if hi > lo and not cuts[lo:hi].all():
                return True
        return False

    def solve_parts(unplaced: set[int], s_lo: int, s_hi: int) -> bool:
        """Split at boundaries no unplaced buffer spans and solve each part on its own."""
        cut_at = [s_lo + 1 + int(b) for b in np.flatnonzero(cuts[s_lo : s_hi - 1] == 0)]
        if not cut_at:
            return dive(unplaced, s_lo, s_hi, -1, -1)
        bounds = [s_lo, *cut_at, s_hi]
        parts: list[set[int]] = [set() for _ in range(len(bounds) - 1)]
        for j in unplaced:
            parts[bisect.bisect_right(bounds, first[j]) - 1].add(j)
        for k, part in enumerate(parts):
            if part and not dive(part, bounds[k], bounds[k + 1], -1, -1):
                return False
        return True

    def dive(unplaced: set[int], s_lo: int, s_hi: int, last_offset: int, last_rank: int) -> bool:
        """Place ``unplaced`` (all living in sections ``[s_lo, s_hi)``) canonically after (last_offset, last_rank)."""
        nonlocal nodes
        nodes += 1
        if nodes > node_limit or monotonic() > deadline:
            raise SearchStopped
        if not unplaced:
            return True
        min_height = min(min_offset[j] + sizes[j] for j in unplaced)
        # Every unplaced buffer goes at or above the next offset: sections bound that offset.
        offset_limit = capacity - int(totals[s_lo:s_hi].max())
        candidates = sorted(
            (min_offset[j], rank[j], j)
            for j in unplaced
            if min_offset[j] < min_height
            and (min_offset[j] > last_offset or (min_offset[j] == last_offset and rank[j] > last_rank))
            and (waits_for[j] < 0 or placed[waits_for[j]])
        )
        for offset, r, i in candidates:
            if offset > offset_limit:
                break
            top = offset + sizes[i]
            placed[i] = True
            offsets[i] = offset
            lowest[i] = _UNREACHABLE
            unplaced.discard(i)
            raised = []
            hatless = True
            feasible = True
            a, b = first[i], end[i]  # sections whose lowest unplaced offset may have risen
            for j in neighbours[i]:
                if placed[j]:
                    continue
                hatless = False
                if min_offset[j] < top:
                    raised.append((j, min_offset[j]))
                    min_offset[j] = top
                    lowest[j] = top
                    if top + sizes[j] > capacity:
                        feasible = False
                    if first[j] < a:
                        a = first[j]
                    if end[j] > b:
                        b = end[j]
            totals[first[i] : end[i]] -= sizes[i]
            for v in conflict_sections[i]:
                totals[v] -= sizes[i]
            released = release_spans(i)
            if feasible:
                floors = np.minimum(lowest[members[a:b]].min(axis=1), capacity)
                feasible = int((floors + totals[a:b]).max()) <= capacity
            if feasible and has_conflict_sections:
                touched = [v for j in (i, *(j for j, _ in raised)) for v in conflict_sections[j]]
                if touched:
                    floors = np.minimum(lowest[members[touched]].min(axis=1), capacity)
                    feasible = int((floors + totals[touched]).max()) <= capacity
            found = False
            if feasible:
                if splits(released):
                    found = solve_parts(unplaced, s_lo, s_hi)
                else:
                    found = dive(unplaced, s_lo, s_hi, offset, r)
            restore_spans(released)
            totals[first[i] : end[i]] += sizes[i]
            for v in conflict_sections[i]:
                totals[v] += sizes[i]
            for j, previous in reversed(raised):
                min_offset[j] = previous
                lowest[j] = previous
            placed[i] = False
            lowest[i] = min_offset[i]
            unplaced.add(i)
            if found:
                return True
            if hatless:
                break
        return False

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * n + 1000))
    try:
        found = solve_parts(set(range(n)), 0, structure.time_sections)
    finally:
        sys.setrecursionlimit(limit)
    return list(offsets) if found else None


class CanonicalSearch(Allocator):
    """Anytime arena minimiser: binary search over capacities, each probe a canonical search.

    Starts from the best greedy plan and first probes the lower bound itself (8 of MiniMalloc's
    11 challenging instances reach it). A probe that proves a capacity infeasible raises the
    floor; :attr:`Plan.optimal` is set only when the arena meets that proven floor.
    """

    def __init__(
        self,
        name: str = "search-minimalloc",
        seconds_without_deadline: float = 10.0,
        first_probe_share: float = 0.4,
        restart_noise: float = 0.3,
        seed: int = 0,
    ) -> None:
        self.name = name
        self.seconds_without_deadline = seconds_without_deadline
        self.first_probe_share = first_probe_share
        self.restart_noise = restart_noise
        self.seed = seed

    def place(self, problem: Problem, deadline: float | None) -> list[int]:
        return self.place_proven(problem, deadline)[0]

    def place_proven(self, problem: Problem, deadline: float | None) -> tuple[list[int], bool]:
        now = time.monotonic()
        deadline = now + self.seconds_without_deadline if deadline is None else deadline
        unit = problem.alignment
        best = min(
            (GreedyBestFit(key).place(problem, None) for key in (by_size, by_area, by_lifetime)),
            key=lambda offsets: arena_bytes(problem, offsets),
        )
        structure = SearchStructure.build(problem)
        best_units = arena_bytes(problem, best) // unit
        # Every capacity below ``proven`` units is known to be infeasible.
        proven = max([-(-problem.lower_bound() // unit), *structure.section_totals])
        lo, hi = proven, best_units - 1
        rng = random.Random(self.seed)
        next_limit: dict[int, int] = {}
        first_probe = True
        while proven <= hi and time.monotonic() < deadline:
            if lo > hi:  # every capacity tried: retry the undecided ones with fresh restarts
                lo = proven
            target = lo if first_probe else (lo + hi) // 2
            share = self.first_probe_share if first_probe else 1 / 3
            first_probe = False
            now = time.monotonic()
            offsets, infeasible = self._probe(structure, target, now + share * (deadline - now), rng, next_limit)
            if offsets is not None:
                best = self._to_bytes(problem, structure, offsets)
                best_units = arena_bytes(problem, best) // unit
                hi = best_units - 1
            else:
                lo = target + 1
                if infeasible:
                    proven = max(proven, target + 1)
        return best, best_units <= proven

    def _probe(
        self,
        structure: SearchStructure,
        capacity: int,
        deadline: float,
        rng: random.Random,
        next_limit: dict[int, int],
    ) -> tuple[list[int] | None, bool]:
        """Offsets within ``capacity`` units (or None) and whether None is a proof.

        Alternates MiniMalloc's round robin (each static preorder with a doubling node limit,
        remembered per capacity across probes) with as many nodes of short randomised restarts.
        """
        n = len(structure)
        restart_nodes = 4 * n
        static_ranks = [structure.rank(preorder) for preorder in PREORDERS]
        while time.monotonic() < deadline:
            limit = next_limit.get(capacity, 2 * n)
            for rank in static_ranks:
                try:
                    offsets = fits_within(structure, capacity, rank, limit, deadline)
                except SearchStopped:
                    continue
                return offsets, offsets is None
            next_limit[capacity] = 2 * limit
            spent = 0
            while spent < len(static_ranks) * limit and time.monotonic() < deadline:
                rank = structure.rank(rng.choice(PREORDERS), rng, self.restart_noise)
                try:
                    offsets = fits_within(structure, capacity, rank, restart_nodes, deadline)
                except SearchStopped:
                    spent += restart_nodes
                    continue
                return offsets, offsets is None
        return None, False

    @staticmethod
    def _to_bytes(problem: Problem, structure: SearchStructure, offsets: list[int]) -> list[int]:
        """Offsets in bytes for every problem buffer; zero-size buffers sit at 0."""
        result = [0] * len(problem.buffers)
        for i, offset in zip(structure.index, offsets, strict=True):
            result[i] = offset * problem.alignment
        return result
