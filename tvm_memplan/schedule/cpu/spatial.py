"""The CPU rule for injective kernels (elementwise, transpose, concat, pad)."""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ..blocks import NotApplicable, is_output, is_reduction, top_level_blocks
from .base import CPUScheduleRule, schedule_loop_nest
from .spec import CpuSpec


class Spatial(CPUScheduleRule):
    """Injective kernels: everything inlined into the outputs, innermost loop vectorized, outer
    loops parallel; layout transforms between ranks iterate over their outputs. Declines kernels
    with reductions."""

    name = "spatial"

    def transform(self, sch: s_tir.Schedule, spec: CpuSpec) -> None:
        blocks = top_level_blocks(sch)
        if any(is_reduction(sch.get(b)) for b in blocks):
            raise NotApplicable("has reductions")
        for block in blocks:
            if not is_output(sch, block):
                sch.compute_inline(block)
        for block in sch.get_child_blocks(sch.get_sblock("root")):
            _iterate_over_output(sch, block)
            schedule_loop_nest(sch, block, spec)


def _iterate_over_output(sch: s_tir.Schedule, block) -> None:
    """A layout transform between ranks (NCHW and NCHW[x]c) iterates over its input and scatters its
    stores; iterating over its output makes the stores contiguous and the loads gathers (NCHW to
    NCHW16c of 1x32x112x112 on Zen 4: 0.08 ms instead of 0.83 ms)."""
    stmt = sch.get(block)
    store = stmt.body
    if not isinstance(store, tirx.BufferStore) or len(store.indices) == len(stmt.iter_vars):
        return
    try:
        sch.transform_block_layout(block, tirx.IndexMap([iv.var for iv in stmt.iter_vars], list(store.indices), None))
    except s_tir.schedule.ScheduleError:  # not a bijective affine map of the iterators (a gather, a broadcast)
        return
    except tvm.error.InternalError:  # stores into a range that does not start at 0 (a tile written into place)
        return
