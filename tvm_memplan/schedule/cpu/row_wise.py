"""The CPU rule for row-wise normalizations with an elementwise step along the rows: softmax.

TVM's legalized softmax is four loop nests over the whole tensor (row max, ``exp``, row sum,
division); the generic rule inlines ``exp`` into both of its readers, so every element's ``exp``
is computed twice, in scalar code. Here every block runs per row instead, as onnxruntime's MLAS
softmax does: the row loop is fused and parallel, the row's reductions and elementwise steps are
computed at it (``exp`` once per element into a row-sized buffer, which TVM's buffer compaction
shrinks to one row), and the elementwise steps along the row are vectorized. TVM's layer norm has
no such step (its mean is one value per row) and stays with the generic rule.
"""

from __future__ import annotations

from tvm import s_tir

from ..blocks import REDUCE, NotApplicable, is_output, is_reduction, top_level_blocks
from .base import CPUScheduleRule, fuse_parallel, product, vectorize
from .spec import CpuSpec


class RowWise(CPUScheduleRule):
    """One output block after reductions along its last axis only and an elementwise step along the
    rows (softmax), all per row."""

    name = "row_wise"

    def transform(self, sch: s_tir.Schedule, spec: CpuSpec) -> None:
        if not spec.vector_codegen:
            raise NotApplicable("no vector code generator (the c target would unroll whole rows)")
        blocks = top_level_blocks(sch)
        *producers, output = blocks
        reductions = [b for b in producers if is_reduction(sch.get(b))]
        if not reductions or is_reduction(sch.get(output)) or not is_output(sch, output):
            raise NotApplicable("not reductions followed by one elementwise output")
        if any(sum(int(iv.iter_type) == REDUCE for iv in sch.get(b).iter_vars) != 1 for b in reductions):
            raise NotApplicable("a reduction over more than one axis (a pooling)")
        loops = list(sch.get_loops(output))
        if len(loops) < 2 or product(sch, loops[-1:]) < spec.lanes:
            raise NotApplicable("rows shorter than a vector")
        steps = [b for b in producers if not is_reduction(sch.get(b)) and len(sch.get_loops(b)) == len(loops)]
        if not steps:
            raise NotApplicable("no elementwise step along the rows (a layer norm): nothing computed twice")
        try:
            row = fuse_parallel(sch, loops[:-1], product(sch, loops), spec)
            for block in reversed(producers):
                sch.compute_at(block, row)
            for block in [*steps, output]:
                vectorize(sch, sch.get_loops(block)[-1], spec)
        except s_tir.ScheduleError as error:
            raise NotApplicable(f"its blocks do not run per row: {error}") from None
