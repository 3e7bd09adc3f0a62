"""The module pass that applies the default CPU schedules."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import tvm
from tvm import tirx

from .cpu import DEFAULT_RULES, CPUScheduleRule, CpuSpec, cpu_spec


@dataclass
class ScheduleReport:
    """Which rule scheduled each kernel, and which kernels kept TVM's loops."""

    rules: dict[str, str] = field(default_factory=dict)
    """Kernel name → rule name."""
    kept: list[str] = field(default_factory=list)
    """Kernels already scheduled (tuned) before the pass ran."""
    unscheduled: list[str] = field(default_factory=list)
    """Kernels no rule fits: they run as TVM emitted them."""


def schedule_function(
    func: tirx.PrimFunc, spec: CpuSpec, rules: Sequence[CPUScheduleRule] = DEFAULT_RULES
) -> tuple[tirx.PrimFunc, str] | None:
    """``func`` scheduled by the first rule that applies, with the rule's name, or None (as dlight's
    ``ApplyDefaultSchedule`` tries its rules)."""
    for rule in rules:
        sch = rule.schedule(func, spec)
        if sch is not None:
            return sch.mod["main"].with_attr("tir.is_scheduled", True), rule.name
    return None


def DefaultCPUSchedule(
    target: tvm.target.Target, on_report: Callable[[ScheduleReport], None] | None = None
) -> tvm.transform.Pass:
    """Schedule every unscheduled PrimFunc for ``target`` (an ``llvm`` or ``c`` target)."""
    spec = cpu_spec(target)

    @tvm.transform.module_pass(opt_level=0, name="tvm_memplan.DefaultCPUSchedule")
    def _pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        report = ScheduleReport()
        updates = {}
        for gvar, func in mod.functions.items():
            if not isinstance(func, tirx.PrimFunc):
                continue
            name = gvar.name_hint
            if func.attrs is not None and func.attrs.get("tir.is_scheduled"):
                report.kept.append(name)
                continue
            scheduled = schedule_function(func, spec)
            if scheduled is None:
                report.unscheduled.append(name)
                continue
            updates[gvar], report.rules[name] = scheduled
        if on_report is not None:
            on_report(report)
        if not updates:
            return mod
        new_mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)  # never mutate the caller's module
        for gvar, func in updates.items():
            new_mod[gvar] = func
        return new_mod

    return _pass
