"""The interface of the CPU rules, dlight's :class:`ScheduleRule`, and the loop helpers they share."""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight.base import ScheduleRule

from ..blocks import NotApplicable, loop_extent
from .spec import CpuSpec, cpu_spec

PARALLEL_MIN_WORK = 1 << 18
"""Loop iterations (multiply-adds for a reduction) below which a kernel stays serial: waking the
thread pool costs a few µs (much more while another process holds a core), about what a vectorized
kernel of this size takes on one core. At 1M, the tiles of a split chain (a 24-channel depthwise
tile of MobileNetV2 at 56x56 is 677K) ran on one thread, 1.7x slower than on two."""


class CPUScheduleRule(ScheduleRule):
    """A default schedule for ``llvm`` and ``c`` targets.

    ``apply`` follows dlight's contract: a schedule of the whole function, or None where the rule
    does not fit it. A subclass implements :meth:`transform`, which raises :class:`NotApplicable`
    to decline; any other exception propagates, since it is a bug in the rule.
    """

    name: str
    """The rule's name in :class:`~tvm_memplan.schedule.ScheduleReport`."""

    def transform(self, sch: s_tir.Schedule, spec: CpuSpec) -> None:
        """Schedule ``sch``'s function in place, or raise :class:`NotApplicable`."""
        raise NotImplementedError

    def schedule(self, func: tirx.PrimFunc, spec: CpuSpec) -> s_tir.Schedule | None:
        """``func`` scheduled for a CPU with ``spec``, or None where the rule does not apply."""
        sch = s_tir.Schedule(func)
        try:
            self.transform(sch, spec)
        except NotApplicable:
            return None
        return sch

    def apply(self, func: tirx.PrimFunc, target: tvm.target.Target, _tunable: bool = False) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        return self.schedule(func, cpu_spec(target))

    def is_target_available(self, target: tvm.target.Target) -> bool:
        return target.kind.name in ("llvm", "c")


def fuse_parallel(sch: s_tir.Schedule, loops: list, work: int, spec: CpuSpec):
    """Fuse ``loops`` into one and run it in parallel when the kernel is big enough."""
    if not loops:
        return None
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if spec.threads > 1 and work >= PARALLEL_MIN_WORK:
        sch.parallel(fused)
    return fused


def vectorize(sch: s_tir.Schedule, loop, spec: CpuSpec) -> None:
    """Vectorize ``loop`` where the code generator emits vectors; unroll it for the C compiler."""
    if spec.vector_codegen:
        sch.vectorize(loop)
    else:
        sch.unroll(loop)


def product(sch: s_tir.Schedule, loops: list) -> int:
    """The iterations of a nest of ``loops``."""
    result = 1
    for loop in loops:
        result *= loop_extent(sch, loop)
    return result


def schedule_loop_nest(sch: s_tir.Schedule, block, spec: CpuSpec) -> None:
    """A block's loops: the innermost vectorized (split into vectors where it is long), the outer
    ones fused and parallel."""
    loops = list(sch.get_loops(block))
    if not loops:
        return
    work = product(sch, loops)
    innermost = loops[-1]
    extent = loop_extent(sch, innermost)
    if extent >= 2 * spec.lanes and extent % spec.lanes == 0:
        outer, vector = sch.split(innermost, [None, spec.lanes])
        vectorize(sch, vector, spec)
        fuse_parallel(sch, loops[:-1] + [outer], work, spec)
    elif 2 <= extent <= 4 * spec.lanes:
        vectorize(sch, innermost, spec)
        fuse_parallel(sch, loops[:-1], work, spec)
    else:
        fuse_parallel(sch, loops[:-1] or loops, work, spec)
