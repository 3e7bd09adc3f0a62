"""The last CPU rule: kernels with reductions that do not tile (softmax, layer norm, global pooling)."""

from __future__ import annotations

from tvm import s_tir

from ..blocks import DATA_PAR, is_output, is_reduction, top_level_blocks
from .base import CPUScheduleRule, fuse_parallel, product, schedule_loop_nest
from .spec import CpuSpec


class Generic(CPUScheduleRule):
    """Producers inlined where TVM allows it; each reduction parallel over its leading spatial
    loops, each other block a vectorized, parallel loop nest."""

    name = "generic"

    def transform(self, sch: s_tir.Schedule, spec: CpuSpec) -> None:
        blocks = top_level_blocks(sch)
        for block in blocks:
            if not is_output(sch, block) and not is_reduction(sch.get(block)):
                try:
                    sch.compute_inline(block)
                except s_tir.ScheduleError:
                    pass  # TVM cannot inline it (e.g. into a reduction's init): it keeps its own loop nest
        for block in sch.get_child_blocks(sch.get_sblock("root")):
            if not is_reduction(sch.get(block)):
                schedule_loop_nest(sch, block, spec)
                continue
            loops = list(sch.get_loops(block))
            kinds = [int(iv.iter_type) for iv in sch.get(block).iter_vars]
            if len(loops) != len(kinds):
                continue
            leading = []
            for loop, kind in zip(loops, kinds, strict=True):
                if kind != DATA_PAR:
                    break
                leading.append(loop)
            fuse_parallel(sch, leading, product(sch, loops), spec)
