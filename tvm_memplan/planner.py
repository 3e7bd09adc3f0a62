"""Model-level workflow: import, stage, plan, build, verify — what the CLI and notebooks call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import tvm

from .frontend import LoadedModel, to_relax
from .options import MemplanOptions, current_options
from .relax.extract import extract_plan_input
from .relax.layout import layout_block
from .relax.module import relax_functions
from .relax.passes import ArenaPlanBlockMemory, PlanReport
from .relax.pipeline import order_passes, resolve_target, schedule_passes, stage_passes
from .relax.reorder import OrderReport
from .relax.split.rewrite import windows_in_place
from .relax.stock import stock_planned_bytes


@dataclass
class ModelPlan:
    """A model taken to the planning stage, planned, and compared with TVM's planner."""

    model: LoadedModel
    target: tvm.target.Target
    stock_staged: tvm.IRModule
    """TVM's module right before memory planning, in program order: what stock TVM builds."""
    planned: tvm.IRModule
    """The memplan module: reordered, arena planned, ready for TVM's remaining passes."""
    reports: list[PlanReport]
    order_reports: list[OrderReport]
    program_order_lower_bound_bytes: int
    tvm_default_bytes: int
    options: MemplanOptions
    finalize: list = field(default_factory=list)

    @property
    def main(self) -> PlanReport:
        return next((r for r in self.reports if r.function == "main"), self.reports[0])

    def total(self, key: str) -> Any:
        return sum(getattr(report, key) for report in self.reports)

    def build(self) -> tvm.runtime.Executable:
        """Compile the planned module (kernel schedules, the rest of TVM's pipeline, then codegen)."""
        return _build(self.planned, self.target, self._schedules(None) + self.finalize)

    def build_stock(self, schedule: str | None = None) -> tvm.runtime.Executable:
        """Compile with TVM's own order and planner. The kernels are those of :meth:`build`
        unless ``schedule`` says otherwise (``"none"``: TVM's stock kernels too)."""
        return _build(self.stock_staged, self.target, self._schedules(schedule) + self.finalize)

    def _schedules(self, schedule: str | None) -> list:
        return schedule_passes(self.target, self.options.updated(schedule=schedule))


def _build(mod: tvm.IRModule, target: tvm.target.Target, passes: list) -> tvm.runtime.Executable:
    with target:
        return tvm.compile(mod, target, relax_pipeline=tvm.transform.Sequential(passes))


def _sequential(passes: list, mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    with target:
        return tvm.transform.Sequential(passes)(mod)


def plan_model(
    model: LoadedModel,
    target: Any = None,
    prepare: Callable[[tvm.IRModule], tvm.IRModule] | None = None,
    **options: Any,
) -> ModelPlan:
    """Import ``model``, run TVM's passes up to memory planning, reorder, and plan its arenas.

    The dataflow stage is shared: the stock module continues from it in program order, the
    memplan module after reordering, so both builds use the very same kernels. ``prepare`` (a split
    search's rewrite) runs on the NCHW module; in a blocked layout its tiles read rows through slices
    that the layout pass carries into NCHW[x]c (:func:`~tvm_memplan.relax.split.rewrite.windows_in_place`).
    """
    resolved_target = resolve_target(target)
    resolved = current_options().updated(**options)
    stages = stage_passes(resolved_target, resolved.schedule, resolved.layout)
    imported = to_relax(model)
    if prepare is not None:
        with windows_in_place(layout_block(resolved_target, resolved.layout) is None):
            imported = prepare(imported)
    dataflow = _sequential(stages.dataflow, imported, resolved_target)
    stock_staged = _sequential(stages.lowering, dataflow, resolved_target)

    order_reports: list[OrderReport] = []
    reordered = _sequential(order_passes(resolved, order_reports.append), dataflow, resolved_target)
    staged = _sequential(stages.lowering, reordered, resolved_target)
    reports: list[PlanReport] = []
    planned = _sequential([ArenaPlanBlockMemory(resolved, reports.append)], staged, resolved_target)
    if not reports:
        reports.append(PlanReport("main", 0, 0, 0, 0, 0.0, [], True))
    program_bound = sum(
        arena.problem.lower_bound()
        for _, func in relax_functions(stock_staged)
        for arena in extract_plan_input(func, stock_staged, resolved.alignment).arenas
    )
    return ModelPlan(
        model=model,
        target=resolved_target,
        stock_staged=stock_staged,
        planned=planned,
        reports=reports,
        order_reports=order_reports,
        program_order_lower_bound_bytes=program_bound,
        tvm_default_bytes=stock_planned_bytes(stock_staged, resolved_target),
        options=resolved,
        finalize=stages.finalize,
    )
