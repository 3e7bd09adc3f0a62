"""Greedy placement with best-fit gaps (Pisarchyk & Lee 2020; docs/design.md, "Offset arena")."""

from __future__ import annotations

from collections.abc import Callable

from ..problem import Problem
from .base import Allocator

OrderKey = Callable[[Problem, int], tuple]


def by_size(problem: Problem, i: int) -> tuple:
    """Largest first; ties by execution order."""
    b = problem.buffers[i]
    return (-problem.padded_size(i), b.start, i)


def by_area(problem: Problem, i: int) -> tuple:
    """Largest size x lifetime first."""
    b = problem.buffers[i]
    return (-problem.padded_size(i) * (b.end - b.start), b.start, i)


def by_lifetime(problem: Problem, i: int) -> tuple:
    """Longest-lived first, then largest."""
    b = problem.buffers[i]
    return (-(b.end - b.start), -problem.padded_size(i), b.start, i)


def conflict_lists(problem: Problem) -> list[list[int]]:
    """For every buffer, the buffers it may not overlap: a sweep over lifetimes, then conflicts."""
    n = len(problem.buffers)
    neighbours: list[list[int]] = [[] for _ in range(n)]
    by_start = sorted(range(n), key=lambda i: problem.buffers[i].start)
    active: list[int] = []
    for i in by_start:
        start = problem.buffers[i].start
        active = [j for j in active if problem.buffers[j].end > start]
        for j in active:
            neighbours[i].append(j)
            neighbours[j].append(i)
        active.append(i)
    for i, j in problem.conflicts:
        if not problem.buffers[i].lives_with(problem.buffers[j]):  # else the sweep listed them
            neighbours[i].append(j)
            neighbours[j].append(i)
    return neighbours


def best_fit_offset(size: int, placed: list[tuple[int, int]], alignment: int) -> int:
    """Lowest offset of the smallest gap between ``placed`` (offset, end) ranges that fits ``size``.

    With no fitting gap, the first free offset above every placed range.
    """
    placed.sort()
    best_offset, best_gap = None, None
    top = 0
    for offset, end in placed:
        if offset > top:
            gap = offset - top
            if size <= gap and (best_gap is None or gap < best_gap):
                best_offset, best_gap = top, gap
        top = max(top, -(-end // alignment) * alignment)
    return top if best_offset is None else best_offset


class GreedyBestFit(Allocator):
    """Place buffers one by one in ``key`` order, each into the smallest gap that fits it."""

    def __init__(self, key: OrderKey = by_size, name: str | None = None) -> None:
        self.key = key
        self.name = name or f"greedy-{key.__name__.removeprefix('by_')}"

    def place(self, problem: Problem, deadline: float | None) -> list[int]:
        sizes = problem.padded_sizes()
        neighbours = conflict_lists(problem)
        offsets = [0] * len(sizes)
        is_placed = [False] * len(sizes)
        for i in sorted(range(len(sizes)), key=lambda i: self.key(problem, i)):
            placed = [(offsets[j], offsets[j] + sizes[j]) for j in neighbours[i] if is_placed[j] and sizes[j]]
            offsets[i] = best_fit_offset(sizes[i], placed, problem.alignment)
            is_placed[i] = True
        return offsets
