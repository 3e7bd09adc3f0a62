"""The GPU pipeline's schedules: tvm_memplan's rule for convolutions and pools, then TVM's default
GPU rules (dlight), each made to try the next rule when one breaks on a kernel.

dlight takes the first rule that returns a schedule, but a rule that raises stops the whole build.
On small inputs that happens to valid kernels: a depthwise convolution whose output is 1x1 (MobileNetV2
at 32x32) makes ``gpu.GEMV`` fail an assertion in its loop normalisation. Trying the next rule
(``Reduction``, ..., ``Fallback``) schedules such kernels as TVM would have if GEMV had declined.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.base import ScheduleRule

from ..schedule.gpu import ThreadPerLoopNest, ThreadPerOutput

APPLY_DEFAULT_SCHEDULE = "ApplyDefaultSchedule"


class DeclineOnError(ScheduleRule):
    """A dlight rule that declines (returns None) where the wrapped rule raises."""

    def __init__(self, rule: ScheduleRule) -> None:
        self.rule = rule

    def apply(self, func: tvm.tirx.PrimFunc, target: tvm.target.Target, tunable: bool):
        try:
            return self.rule.apply(func, target, tunable)
        except (AssertionError, ValueError, IndexError, RuntimeError):  # TVM errors are RuntimeErrors
            return None  # rules schedule a copy: func itself is untouched


def generic_gpu_schedule(schedule: str = "default") -> tvm.transform.Pass:
    """The rules of ``relax.backend.gpu_generic.legalize_passes``, in its order, each declining on
    error (tvm_memplan's own rules are not wrapped: they decline with ``NotApplicable``, and any
    other exception of theirs is a bug); with ``schedule="default"`` tvm_memplan's
    :class:`~tvm_memplan.schedule.gpu.ThreadPerOutput` (convolutions, pools) goes first, ``"none"`` keeps TVM's
    rules alone (for comparison). Either way :class:`~tvm_memplan.schedule.gpu.ThreadPerLoopNest` comes last: a
    kernel every rule declines would otherwise stay host code, which does not run on the GPU."""
    dlight_rules = (dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback())
    rules = (*(DeclineOnError(rule) for rule in dlight_rules), ThreadPerLoopNest())
    if schedule == "default":
        rules = (ThreadPerOutput(), *rules)
    return dl.ApplyDefaultSchedule(*rules)


def with_gpu_schedules(passes: list, backend_name: str, schedule: str = "default") -> list:
    """``passes`` with gpu_generic's ``ApplyDefaultSchedule`` replaced by :func:`generic_gpu_schedule`."""
    if backend_name != "gpu_generic":
        return passes
    return [generic_gpu_schedule(schedule) if p.info.name == APPLY_DEFAULT_SCHEDULE else p for p in passes]
