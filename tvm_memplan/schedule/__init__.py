"""Default schedules: every kernel of the ``llvm``/``c`` pipeline gets a real schedule.

:class:`DefaultCPUSchedule` is a module pass over the PrimFuncs of a Relax module; functions
already marked ``tir.is_scheduled`` (a MetaSchedule database, hand-written kernels) are kept. The
rules, CPU (:mod:`.cpu`) and GPU (:mod:`.gpu`), are dlight ``ScheduleRule`` classes built on the
block helpers of :mod:`.blocks`.
"""

from .blocks import NotApplicable
from .cpu import DEFAULT_RULES, CPUScheduleRule, CpuSpec, cpu_spec
from .passes import DefaultCPUSchedule, ScheduleReport, schedule_function

__all__ = [
    "DEFAULT_RULES",
    "CPUScheduleRule",
    "CpuSpec",
    "DefaultCPUSchedule",
    "NotApplicable",
    "ScheduleReport",
    "cpu_spec",
    "schedule_function",
]
