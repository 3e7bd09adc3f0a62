"""Alias groups: buffers pinned inside other buffers are planned as one block.

In-place outputs share their input's bytes and concat inputs are slices of the concat output
(docs/design.md, "In-place kernels and concat elimination"). Such a group is coalesced into one buffer — its
lifetime the hull of the members', its size the furthest member end — planned by any allocator, then expanded back.
"""

from __future__ import annotations

from .allocators import Plan, plan_memory
from .problem import Buffer, Problem, align_up
from .validate import validate_offsets


def coalesce(problem: Problem) -> tuple[Problem, list[tuple[int, int]]]:
    """One buffer per alias group; returns it and, per original buffer, (group index, offset in group)."""
    groups = problem.alias_groups()
    placement: list[tuple[int, int]] = [(0, 0)] * len(problem.buffers)
    buffers = []
    for g, group in enumerate(groups):
        for member, delta in zip(group.members, group.deltas, strict=True):
            placement[member] = (g, delta)
        first = group.members[group.deltas.index(min(group.deltas))]
        buffers.append(Buffer(problem.buffers[first].name, group.size, group.start, group.end))
    conflicts = set()
    for i, j in problem.conflicts:
        gi, gj = placement[i][0], placement[j][0]
        if gi == gj:
            raise ValueError(f"buffers {i} and {j} must not share memory but are aliased")
        conflicts.add((gi, gj))
    return Problem(buffers, frozenset(conflicts), problem.alignment, concurrent=problem.concurrent), placement


def plan_aliased(problem: Problem, time_budget: float = 10.0) -> tuple[Plan, Problem]:
    """Plan a problem with alias groups; returns the expanded plan and the coalesced problem.

    The expanded offsets are checked against the original problem by the validator, which
    also proves every alias is honoured.
    """
    if not problem.aliases:
        return plan_memory(problem, time_budget=time_budget), problem
    coalesced, placement = coalesce(problem)
    group_plan = plan_memory(coalesced, time_budget=time_budget)
    offsets = [group_plan.offsets[group] + delta for group, delta in placement]
    arena = validate_offsets(problem, offsets)
    plan = Plan(
        offsets=offsets,
        arena_bytes=max(group_plan.arena_bytes, align_up(arena, problem.alignment)),
        allocator=group_plan.allocator,
        seconds=group_plan.seconds,
        optimal=group_plan.optimal,
        tried=group_plan.tried,
        tried_seconds=group_plan.tried_seconds,
    )
    return plan, coalesced
