"""The CPU rule for injective kernels (elementwise, transpose, concat, pad)."""

from __future__ import annotations

from tvm import s_tir

from ..blocks import NotApplicable, is_output, is_reduction, top_level_blocks
from .base import CPUScheduleRule, schedule_loop_nest
from .spec import CpuSpec


class Spatial(CPUScheduleRule):
    """Injective kernels: everything inlined into the outputs, innermost loop vectorized, outer
    loops parallel. Declines kernels with reductions."""

    name = "spatial"

    def transform(self, sch: s_tir.Schedule, spec: CpuSpec) -> None:
        blocks = top_level_blocks(sch)
        if any(is_reduction(sch.get(b)) for b in blocks):
            raise NotApplicable("has reductions")
        for block in blocks:
            if not is_output(sch, block):
                sch.compute_inline(block)
        for block in sch.get_child_blocks(sch.get_sblock("root")):
            schedule_loop_nest(sch, block, spec)
