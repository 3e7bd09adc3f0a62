"""Model-level workflow: import, stage, plan, build, verify — what the CLI and notebooks call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import tvm

from .frontend import LoadedModel, to_relax
from .options import MemplanOptions, current_options
from .relax.passes import ArenaPlanBlockMemory, PlanReport
from .relax.pipeline import resolve_target, stage_passes
from .relax.stock import stock_planned_bytes


@dataclass
class ModelPlan:
    """A model taken to the planning stage, planned, and compared with TVM's planner."""

    model: LoadedModel
    target: tvm.target.Target
    staged: tvm.IRModule
    """The module right before memory planning: shared by the stock and memplan builds."""
    planned: tvm.IRModule
    reports: list[PlanReport]
    tvm_default_bytes: int
    options: MemplanOptions
    finalize: list = field(default_factory=list)

    @property
    def main(self) -> PlanReport:
        return next((r for r in self.reports if r.function == "main"), self.reports[0])

    def total(self, key: str) -> Any:
        return sum(getattr(report, key) for report in self.reports)

    def build(self) -> "tvm.runtime.Executable":
        """Compile the planned module (the rest of TVM's pipeline, then codegen)."""
        return _build(self.planned, self.target, self.finalize)

    def build_stock(self) -> "tvm.runtime.Executable":
        """Compile the same staged module with TVM's own planner: identical kernels."""
        return _build(self.staged, self.target, self.finalize)


def _build(mod: tvm.IRModule, target: tvm.target.Target, passes: list) -> "tvm.runtime.Executable":
    with target:
        return tvm.compile(mod, target, relax_pipeline=tvm.transform.Sequential(passes))


def plan_model(model: LoadedModel, target: Any = None, **options: Any) -> ModelPlan:
    """Import ``model``, run TVM's passes up to memory planning, and plan its arenas."""
    resolved_target = resolve_target(target)
    resolved = current_options().updated(**options)
    mod = to_relax(model)
    before, finalize = stage_passes(resolved_target)
    with resolved_target:
        staged = tvm.transform.Sequential(before)(mod)
    reports: list[PlanReport] = []
    with resolved_target:
        planned = ArenaPlanBlockMemory(resolved, reports.append)(staged)
    if not reports:
        reports.append(PlanReport("main", 0, 0, 0, 0, 0.0, [], True))
    return ModelPlan(
        model=model,
        target=resolved_target,
        staged=staged,
        planned=planned,
        reports=reports,
        tvm_default_bytes=stock_planned_bytes(staged, resolved_target),
        options=resolved,
        finalize=finalize,
    )
