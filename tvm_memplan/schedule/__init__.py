"""Default CPU schedules: every kernel of the ``llvm``/``c`` pipeline gets a real schedule.

:class:`DefaultCPUSchedule` is a module pass over the PrimFuncs of a Relax module; functions
already marked ``tir.is_scheduled`` (a MetaSchedule database, hand-written kernels) are kept.
"""

from .cpu import CpuSpec, cpu_spec
from .passes import DefaultCPUSchedule, ScheduleReport
from .rules import schedule_function

__all__ = ["CpuSpec", "DefaultCPUSchedule", "ScheduleReport", "cpu_spec", "schedule_function"]
