"""Run several heap algorithms and keep the smallest validated plan (XLA's heap simulator idea)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..problem import Problem
from ..validate import validate_offsets
from .base import Allocator, Plan
from .greedy import GreedyBestFit, by_area, by_lifetime, by_size
from .search import CanonicalSearch


def greedy_allocators() -> list[Allocator]:
    """The cheap best-fit orderings: milliseconds for thousands of buffers."""
    return [GreedyBestFit(by_size), GreedyBestFit(by_area), GreedyBestFit(by_lifetime)]


def default_allocators() -> list[Allocator]:
    """Cheap greedy orderings first; the canonical search runs only while they miss the bound."""
    return [*greedy_allocators(), CanonicalSearch()]


def plan_memory(
    problem: Problem,
    allocators: Sequence[Allocator] | None = None,
    time_budget: float = 10.0,
) -> Plan:
    """Plan ``problem`` with each allocator in turn and keep the smallest arena.

    Stops early once a plan is proven optimal (it reached the lower bound, or a search proved
    nothing smaller fits); later allocators get what is left of ``time_budget``. Every plan is
    checked by the independent validator before it can win.
    """
    if problem.aliases:
        raise ValueError("problem has aliased buffers: plan it with plan_aliased(), which coalesces them")
    started = time.monotonic()
    deadline = started + time_budget
    best: Plan | None = None
    tried: dict[str, int] = {}
    tried_seconds: dict[str, float] = {}
    for allocator in allocators or default_allocators():
        if best is not None and (best.optimal or time.monotonic() >= deadline):
            break
        plan = allocator.allocate(problem, deadline)
        validate_offsets(problem, plan.offsets, plan.arena_bytes)
        tried[allocator.name] = plan.arena_bytes
        tried_seconds[allocator.name] = plan.seconds
        if (
            best is None
            or plan.arena_bytes < best.arena_bytes
            or (plan.arena_bytes == best.arena_bytes and plan.optimal and not best.optimal)
        ):
            best = plan
    assert best is not None, "no allocator ran"
    best.tried = tried
    best.tried_seconds = tried_seconds
    best.seconds = time.monotonic() - started
    return best
