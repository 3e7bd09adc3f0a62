"""The module pass that replaces StaticPlanBlockMemory's whole-buffer reuse with an offset arena."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import tvm
from tvm import relax

from ..options import MemplanOptions, current_options
from ..planning import DEFAULT_ALIGNMENT, Buffer, Problem
from ..planning.aliasing import plan_aliased
from .extract import extract_plan_input
from .fusion import GROUPS_ATTR
from .grouping import kernel_groups, layers_from_outputs
from .ir_utils import top_level_bindings
from .module import relax_functions, with_functions
from .offsets import kernels_take_offsets, offset_tensors
from .rewrite import apply_plans

ARENA_PASS_NAME = "tvm_memplan.ArenaPlanBlockMemory"


@dataclass
class PlanReport:
    """What the planner did to one Relax function."""

    function: str
    tensors: int
    naive_bytes: int
    lower_bound_bytes: int
    arena_bytes: int
    plan_seconds: float
    allocators: list[str]
    optimal: bool
    unplanned: dict[str, str] = field(default_factory=dict)
    concats_removed: int = 0
    concats_kept: dict[str, str] = field(default_factory=dict)
    inplace_ops: int = 0
    removable_ops: int = 0
    arenas: list[dict] = field(default_factory=list)
    """Per arena: device, scope, and each tensor's name, size, lifetime, offset and the index of
    the tensor it lives inside (``alias_of``, at ``alias_delta`` bytes) — enough to re-validate."""
    alignment: int = DEFAULT_ALIGNMENT
    kernels: int = 0
    """Kernel launches per call when every kernel is its own launch."""
    layers: int = 0
    """Maxdist layers among the kernels (layer grouping only, else 0)."""
    groups: int = 0
    """Groups the kernels run in (layer grouping only, else 0): one launch each when fused."""
    unconstrained_arena_bytes: int = 0
    """Layer grouping only: the arena of the same order without the F-predicate."""

    def layouts(self) -> list[tuple[Problem, list[int], int]]:
        """Each arena as (problem, offsets, arena bytes), rebuilt from the report alone."""
        result = []
        for arena in self.arenas:
            tensors = arena["tensors"]
            problem = Problem(
                [Buffer(t["name"], t["bytes"], t["start"], t["end"]) for t in tensors],
                alignment=self.alignment,
                aliases={
                    i: (t["alias_of"], t["alias_delta"]) for i, t in enumerate(tensors) if t["alias_of"] is not None
                },
                concurrent=tuple(tuple(r) for r in arena.get("concurrent", ())),
            )
            result.append((problem, [t["offset"] for t in tensors], arena["arena_bytes"]))
        return result


def plan_function(
    func: relax.Function, mod: tvm.IRModule, name: str, options: MemplanOptions
) -> tuple[relax.Function, PlanReport]:
    """Plan one function's statically shaped intermediates into arenas.

    With layer grouping, every group's step range becomes ``concurrent`` in each arena's
    problem (the F-predicate); a group's kernels may run at once, so none overwrites in place
    a tensor another member reads.
    """
    started = time.monotonic()
    grouped = options.groups is not None
    bindings = top_level_bindings(func)
    groups = kernel_groups(bindings, mod, options.groups if grouped else "seq", layers_from_outputs(func))
    concurrent = groups.concurrent_steps() if grouped else ()
    plan_input = extract_plan_input(func, mod, options.alignment, inplace=options.inplace, concurrent=concurrent)
    unconstrained = 0
    if grouped:
        for arena in plan_input.arenas:
            unconstrained += plan_aliased(arena.problem, time_budget=options.time_budget)[0].arena_bytes
            arena.problem = Problem(
                arena.problem.buffers,
                alignment=arena.problem.alignment,
                aliases=arena.problem.aliases,
                concurrent=concurrent,
            )
    planned = [plan_aliased(arena.problem, time_budget=options.time_budget) for arena in plan_input.arenas]
    plans = [plan for plan, _ in planned]
    bounds = [coalesced.lower_bound() for _, coalesced in planned]
    removed_steps = {step for step, b in enumerate(bindings) if b.var in plan_input.decisions.removed_calls}
    at_offset = offset_tensors(func, mod) if kernels_take_offsets(tvm.target.Target.current(allow_none=True)) else set()
    new_func = apply_plans(func, plan_input.arenas, plans, plan_input.decisions.removed_calls, at_offset)
    if grouped:  # for FuseGroupKernels: each remaining kernel call's group, in call order
        group_of = {step: index for index, group in enumerate(groups.groups) for step in group}
        kernel_steps = sorted(step for step in group_of if step not in removed_steps)
        new_func = new_func.with_attr(GROUPS_ATTR, [group_of[step] for step in kernel_steps])
    arenas = []
    for arena, plan, bound in zip(plan_input.arenas, plans, bounds, strict=True):
        alias_of = arena.problem.aliases
        arenas.append(
            {
                "device_index": arena.device_index,
                "scope": arena.scope,
                "arena_bytes": plan.arena_bytes,
                "lower_bound_bytes": bound,
                "allocator": plan.allocator,
                "concurrent": [list(r) for r in arena.problem.concurrent],
                "tensors": [
                    {
                        "name": site.var.name,
                        "bytes": site.nbytes,
                        "shape": list(site.shape),
                        "dtype": site.dtype,
                        "start": buffer.start,
                        "end": buffer.end,
                        "offset": offset,
                        "alias_of": alias_of.get(i, (None, 0))[0],
                        "alias_delta": alias_of.get(i, (None, 0))[1],
                    }
                    for i, (site, buffer, offset) in enumerate(
                        zip(arena.sites, arena.problem.buffers, plan.offsets, strict=True)
                    )
                ],
            }
        )
    report = PlanReport(
        function=name,
        tensors=sum(len(arena.sites) for arena in plan_input.arenas),
        naive_bytes=sum(arena.problem.naive_bytes() for arena in plan_input.arenas),
        lower_bound_bytes=sum(bounds),
        arena_bytes=sum(plan.arena_bytes for plan in plans),
        plan_seconds=time.monotonic() - started,
        allocators=[plan.allocator for plan in plans],
        optimal=all(plan.optimal for plan in plans),
        unplanned=plan_input.unplanned,
        concats_removed=plan_input.decisions.concats_removed,
        concats_kept=plan_input.decisions.concats_kept,
        inplace_ops=plan_input.decisions.inplace_ops,
        removable_ops=plan_input.removable_ops,
        arenas=arenas,
        alignment=options.alignment,
        kernels=groups.kernels - len(removed_steps),
        layers=groups.layers if grouped else 0,
        groups=sum(1 for group in groups.groups if set(group) - removed_steps) if grouped else 0,
        unconstrained_arena_bytes=unconstrained,
    )
    return new_func, report


def ArenaPlanBlockMemory(  # noqa: N802 - named like TVM's passes
    options: MemplanOptions | None = None,
    on_report: Callable[[PlanReport], None] | None = None,
) -> tvm.transform.Pass:
    """Plan every Relax function's intermediates into one offset arena each.

    Run after ``CallTIRRewrite`` and before ``StaticPlanBlockMemory``; tensors it leaves alone
    (symbolic shapes) stay ``R.builtin.alloc_tensor`` for SPBM. Options default to
    :func:`tvm_memplan.config`'s scope at the time the pass runs.
    """

    @tvm.transform.module_pass(opt_level=0, name=ARENA_PASS_NAME)
    def _pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        resolved = options or current_options()
        updates = {}
        for gvar, func in relax_functions(mod):
            new_func, report = plan_function(func, mod, gvar.name_hint, resolved)
            if on_report is not None:
                on_report(report)
            if not new_func.same_as(func):
                updates[gvar] = new_func
        return with_functions(mod, updates)

    return _pass
