"""Run several heap algorithms and keep the smallest validated plan (XLA's heap simulator idea)."""

from __future__ import annotations

import time
from typing import Sequence

from ..problem import Problem
from ..validate import validate_offsets
from .base import Allocator, Plan
from .greedy import GreedyBestFit, by_area, by_lifetime, by_size


def default_allocators() -> list[Allocator]:
    """Cheap greedy orderings first; a stronger search runs only while they miss the bound."""
    return [GreedyBestFit(by_size), GreedyBestFit(by_area), GreedyBestFit(by_lifetime)]


def plan_memory(
    problem: Problem,
    allocators: Sequence[Allocator] | None = None,
    time_budget: float = 10.0,
) -> Plan:
    """Plan ``problem`` with each allocator in turn and keep the smallest arena.

    Stops early once a plan reaches the lower bound (nothing can be smaller). Every plan is
    checked by the independent validator before it can win.
    """
    started = time.monotonic()
    deadline = started + time_budget
    bound = problem.lower_bound()
    best: Plan | None = None
    tried: dict[str, int] = {}
    for allocator in allocators or default_allocators():
        if best is not None and (best.arena_bytes <= bound or time.monotonic() >= deadline):
            break
        plan = allocator.allocate(problem, deadline)
        validate_offsets(problem, plan.offsets, plan.arena_bytes)
        tried[allocator.name] = plan.arena_bytes
        if best is None or plan.arena_bytes < best.arena_bytes:
            best = plan
    assert best is not None, "no allocator ran"
    best.tried = tried
    best.seconds = time.monotonic() - started
    best.optimal = best.optimal or best.arena_bytes <= bound
    return best
