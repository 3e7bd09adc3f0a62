"""Block structure the CPU and GPU schedule rules share: which blocks a function has, which one
reduces, which ones pad or write the output, and the roles of a reduction's iterators.

A helper that finds a structure a rule cannot schedule raises :class:`NotApplicable`; the rule's
``apply`` turns that into None, dlight's "does not apply". Any other exception is a bug.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx

DATA_PAR = 0
"""``IterVar.iter_type`` of a spatial (data-parallel) iterator."""
REDUCE = 2
"""``IterVar.iter_type`` of a reduction iterator."""


class NotApplicable(Exception):
    """The rule does not fit this function's structure."""


def top_level_blocks(sch: s_tir.Schedule) -> list:
    """The function's blocks, which must all sit directly under the root block."""
    blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    for block in blocks:
        if sch.get_child_blocks(block):
            raise NotApplicable("nested blocks")
    return blocks


def is_reduction(block: s_tir.SBlock) -> bool:
    return any(int(iv.iter_type) == REDUCE for iv in block.iter_vars)


def uses(expr: tirx.PrimExpr, var: tirx.Var) -> bool:
    """Whether ``expr`` reads ``var``."""
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr, []))


def region_uses(region, var: tirx.Var) -> bool:
    """Whether any dimension of a buffer region starts at an index that reads ``var``."""
    return any(uses(r.min, var) for r in region)


def the_reduction(sch: s_tir.Schedule, blocks: list):
    """The function's one reduction block (the rules that tile a reduction need exactly one)."""
    reductions = [b for b in blocks if is_reduction(sch.get(b))]
    if len(reductions) != 1:
        raise NotApplicable("needs exactly one reduction block")
    return reductions[0]


def is_padding(block: s_tir.SBlock) -> bool:
    """A block whose value is selected by a bounds check (``pad``): inlining it would put the
    check into the innermost loop of its consumer."""
    value = block.body.value if isinstance(block.body, tirx.BufferStore) else None
    return isinstance(value, tvm.ir.Call) and "if_then_else" in str(value.op)


def is_output(sch: s_tir.Schedule, block_rv) -> bool:
    return not sch.get_consumers(block_rv)


def inline_into_epilogue(sch: s_tir.Schedule, main, consumers: list, scope: str):
    """The block that stores the reduction ``main``'s result: its ``consumers`` but the last are
    inlined into the last, the epilogue (bias, activation, residual add); without consumers, a copy
    out of a ``scope`` cache of main's output. NotApplicable unless it writes the function's output."""
    for consumer in consumers[:-1]:
        sch.compute_inline(consumer)
    epilogue = consumers[-1] if consumers else sch.cache_write(main, 0, scope)
    if not is_output(sch, epilogue):
        raise NotApplicable("the last block is not the output")
    return epilogue


def constant(extent: tirx.PrimExpr) -> int:
    """A loop or iterator extent as an int; a symbolic one (a dynamic shape) is not scheduled."""
    if not isinstance(extent, tirx.IntImm):
        raise NotApplicable(f"symbolic extent {extent}")
    return int(extent)


def loop_extent(sch: s_tir.Schedule, loop) -> int:
    return constant(sch.get(loop).extent)


def iterator_loops(sch: s_tir.Schedule, block_rv, extents: list[int]) -> list:
    """The block's loops, one per iterator in iterator order (``extents``: :func:`iter_extents`);
    NotApplicable where they do not match."""
    loops = list(sch.get_loops(block_rv))
    if [loop_extent(sch, loop) for loop in loops] != extents:
        raise NotApplicable("loops do not match the block's iterators")
    return loops


def iter_extents(block: s_tir.SBlock) -> list[int]:
    """The extents of the block's iterators."""
    return [constant(iv.dom.extent) for iv in block.iter_vars]


@dataclass
class ReductionAxes:
    """The roles of a reduction block's iterators in a tile of outputs."""

    vector: int
    """Spatial iterator of the output's contiguous (last) axis."""
    reuse: int | None
    """Spatial iterator some operand does not depend on while the vector operand does: one load of
    that operand serves a tile along it (a conv's output channels, a matmul's rows)."""
    extra: int | None
    """Another spatial iterator, the nearest outer one of the vector axis (output rows)."""


def reduction_axes(block: s_tir.SBlock, extents: list[int]) -> ReductionAxes:
    """The :class:`ReductionAxes` of a reduction block whose iterators have ``extents``."""
    ivs = list(block.iter_vars)
    spatial = [i for i, iv in enumerate(ivs) if int(iv.iter_type) == DATA_PAR]
    if not block.writes[0].region:
        raise NotApplicable("a scalar output (a full reduction)")
    last = block.writes[0].region[-1].min
    vector = [i for i in spatial if uses(last, ivs[i].var)]
    if len(vector) != 1 or extents[vector[0]] < 2:
        raise NotApplicable("no contiguous output axis to vectorize")
    v = vector[0]
    reads = list(block.reads)
    # the vector operand: read along the vectorized axis in its own last dimension
    if not any(r.region and uses(r.region[-1].min, ivs[v].var) for r in reads):
        raise NotApplicable("no operand is contiguous along the output's last axis")

    def reuse_score(i: int) -> bool:
        var = ivs[i].var
        reused = any(region_uses(r.region, ivs[v].var) and not region_uses(r.region, var) for r in reads)
        broadcast = any(region_uses(r.region, var) and not region_uses(r.region, ivs[v].var) for r in reads)
        return reused and broadcast

    candidates = [i for i in spatial if i != v and extents[i] > 1]
    reuse = max((i for i in candidates if reuse_score(i)), key=lambda i: extents[i], default=None)
    # the extra axis: the nearest outer spatial loop of the vector axis that is not the reuse axis
    extra = next((i for i in reversed(candidates) if i != reuse and i < v), None)
    return ReductionAxes(v, reuse, extra)
