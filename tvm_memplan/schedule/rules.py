"""Default CPU schedules for the PrimFuncs TVM's Relax pipeline legalizes and fuses.

TVM 0.27's ``cpu_generic`` pipeline leaves convolutions, matmuls and pools as plain loop nests.
Three rules cover what the fused kernels of CNNs and transformers contain, tried in order:

* :func:`tiled_reduction` — one reduction block (conv, depthwise/grouped conv, matmul, dense,
  pooling) with injective producers and an elementwise epilogue. A register tile of output
  elements, vectorized along the output's contiguous axis and unrolled along an axis whose
  operand is reused across the vector (output channels of a conv, rows of a matmul), stays in
  vector registers for the whole reduction. Tasks run rows or channel tiles outermost, whichever
  rereads fewer bytes; padding is computed per row (zero fill plus copy), an input read with a
  stride is stored de-interleaved, a width no vector divides gets tail loops of its own, and the
  epilogue (bias, activation, residual add) runs on the tile before it is stored.
* :func:`spatial` — injective kernels (elementwise, transpose, concat, pad): everything inlined
  into the outputs, innermost loop vectorized, outer loops parallel.
* :func:`generic` — anything else with reductions (softmax, layer norm, global pooling):
  parallel over the leading spatial loops, vectorized spatial blocks.

A rule either schedules the whole function or raises; :func:`schedule_function` then tries the
next one, and leaves a function it cannot schedule as TVM produced it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import tvm
from tvm import s_tir, tirx
from tvm.sym.pattern import detect_linear_equation

from .cpu import CpuSpec

_DATA_PAR = 0
_REDUCE = 2
PARALLEL_MIN_WORK = 1 << 18
"""Loop iterations (multiply-adds for a reduction) below which a kernel stays serial: waking the
thread pool costs a few µs (much more while another process holds a core), about what a vectorized
kernel of this size takes on one core. At 1M, the tiles of a split chain (a 24-channel depthwise
tile of MobileNetV2 at 56x56 is 677K) ran on one thread, 1.7x slower than on two."""
LOAD_BOUND_FACTOR = 4
"""How much more a multiply-add costs in a reduction without register reuse (depthwise
convolutions, pools) than in a register-tiled one, for the serial/parallel decision: a
12-channel depthwise tile (140K multiply-adds) ran 29 µs on one thread and 17 µs on two."""

_FAILURES = (s_tir.ScheduleError, RuntimeError, ValueError, TypeError, IndexError, AttributeError)


class NotApplicable(Exception):
    """The rule does not fit this function's structure."""


def schedule_function(func: tirx.PrimFunc, spec: CpuSpec) -> tuple[tirx.PrimFunc, str] | None:
    """``func`` scheduled by the first rule that applies, with the rule's name, or None."""
    for rule in RULES:
        sch = s_tir.Schedule(func)
        try:
            rule(sch, spec)
        except (NotApplicable, *_FAILURES):
            continue
        return sch.mod["main"].with_attr("tir.is_scheduled", True), rule.__name__
    return None


# ---------------------------------------------------------------------------------------------
# Block structure


@dataclass
class _Axes:
    """The roles of a reduction block's loops in the register tile."""

    vector: int
    """Spatial iterator of the output's contiguous (last) axis."""
    reuse: int | None
    """Spatial iterator some operand does not depend on while the vector operand does: unrolled,
    so that operand's vector load is reused (a conv's output channels, a matmul's rows)."""
    extra: int | None
    """Another spatial iterator unrolled for independent accumulators (output rows)."""


def _blocks(sch: s_tir.Schedule) -> list:
    """The function's blocks, which must all sit directly under the root block."""
    blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    for block in blocks:
        if sch.get_child_blocks(block):
            raise NotApplicable("nested blocks")
    return blocks


def _is_reduction(block: s_tir.SBlock) -> bool:
    return any(int(iv.iter_type) == _REDUCE for iv in block.iter_vars)


def _uses(expr: tirx.PrimExpr, var: tirx.Var) -> bool:
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr, []))


def _region_uses(region, var: tirx.Var) -> bool:
    return any(_uses(r.min, var) for r in region)


def the_reduction(sch: s_tir.Schedule, blocks: list):
    """The function's one reduction block (the rules that tile a reduction need exactly one)."""
    reductions = [b for b in blocks if _is_reduction(sch.get(b))]
    if len(reductions) != 1:
        raise NotApplicable("needs exactly one reduction block")
    return reductions[0]


def _is_padding(block: s_tir.SBlock) -> bool:
    """A block whose value is selected by a bounds check (``pad``): inlining it would put the
    check into the innermost loop of its consumer."""
    value = block.body.value if isinstance(block.body, tirx.BufferStore) else None
    return isinstance(value, tvm.ir.Call) and "if_then_else" in str(value.op)


def _is_output(sch: s_tir.Schedule, block_rv) -> bool:
    return not sch.get_consumers(block_rv)


def _fuse_parallel(sch: s_tir.Schedule, loops: list, work: int, spec: CpuSpec):
    """Fuse ``loops`` into one and run it in parallel when the kernel is big enough."""
    if not loops:
        return None
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if spec.threads > 1 and work >= PARALLEL_MIN_WORK:
        sch.parallel(fused)
    return fused


def _vectorize(sch: s_tir.Schedule, loop, spec: CpuSpec) -> None:
    if spec.vector_codegen:
        sch.vectorize(loop)
    else:
        sch.unroll(loop)


def _extent(sch: s_tir.Schedule, loop) -> int:
    return int(sch.get(loop).extent)


# ---------------------------------------------------------------------------------------------
# Rules


def _reduction_axes(block: s_tir.SBlock, extents: list[int]) -> _Axes:
    ivs = list(block.iter_vars)
    spatial = [i for i, iv in enumerate(ivs) if int(iv.iter_type) == _DATA_PAR]
    last = block.writes[0].region[-1].min
    vector = [i for i in spatial if _uses(last, ivs[i].var)]
    if len(vector) != 1 or extents[vector[0]] < 2:
        raise NotApplicable("no contiguous output axis to vectorize")
    v = vector[0]
    reads = list(block.reads)
    # the vector operand: read along the vectorized axis in its own last dimension
    if not any(_uses(r.region[-1].min, ivs[v].var) for r in reads):
        raise NotApplicable("no operand is contiguous along the output's last axis")

    def reuse_score(i: int) -> bool:
        var = ivs[i].var
        reused = any(_region_uses(r.region, ivs[v].var) and not _region_uses(r.region, var) for r in reads)
        broadcast = any(_region_uses(r.region, var) and not _region_uses(r.region, ivs[v].var) for r in reads)
        return reused and broadcast

    candidates = [i for i in spatial if i != v and extents[i] > 1]
    reuse = max((i for i in candidates if reuse_score(i)), key=lambda i: extents[i], default=None)
    # the extra axis: the nearest outer spatial loop of the vector axis that is not the reuse axis
    extra = next((i for i in reversed(candidates) if i != reuse and i < v), None)
    return _Axes(v, reuse, extra)


def tiled_reduction(sch: s_tir.Schedule, spec: CpuSpec) -> None:
    """Register-tiled reduction with fused producers and epilogue (see the module docstring)."""
    blocks = _blocks(sch)
    main = the_reduction(sch, blocks)
    position = [sch.get(b).name_hint for b in blocks].index(sch.get(main).name_hint)
    block = sch.get(main)
    extents = [int(iv.dom.extent) for iv in block.iter_vars]
    axes = _reduction_axes(block, extents)
    rows_first = _rows_first(block, axes, extents)
    # Producers are inlined, except paddings, and, when a row's input serves every channel
    # tile, inputs read with a stride along the vector axis: those are staged per row, a
    # strided one stored de-interleaved (staged per channel tile, the copies cost more than
    # the strided loads they save).
    strides = _vector_strides(block, axes.vector) if rows_first else {}
    staged = []
    for producer in reversed(blocks[:position]):
        stride = strides.get(sch.get(producer).writes[0].source.name, 1)
        if _is_padding(sch.get(producer)) or stride > 1:
            staged.append((producer, stride))
        else:
            sch.compute_inline(producer)
    for index, read in enumerate(sch.get(main).reads):
        stride = strides.get(read.source.name, 1)
        if stride > 1 and not any(sch.get(p).writes[0].source.same_as(read.source) for p, _ in staged):
            staged.append((sch.cache_read(main, index, "global"), stride))
    consumers = blocks[position + 1:]
    for consumer in consumers[:-1]:
        sch.compute_inline(consumer)
    epilogue = consumers[-1] if consumers else sch.cache_write(main, 0, "global")
    if not _is_output(sch, epilogue):
        raise NotApplicable("the last block is not the output")

    block = sch.get(main)
    loops = list(sch.get_loops(main))
    if [_extent(sch, loop) for loop in loops] != extents:
        raise NotApplicable("loops do not match the block's iterators")
    kinds = [int(iv.iter_type) for iv in block.iter_vars]

    vector_tile, parts = _vector_parts(extents[axes.vector], spec.lanes)
    vectors = -(-vector_tile // spec.lanes)
    unrolled = []
    for axis, tile in zip((axes.reuse, axes.extra), _register_tile(extents, axes, vectors, spec)):
        if axis is None:
            continue
        outer_loop, inner_loop = sch.split(loops[axis], [None, tile])
        loops[axis] = outer_loop
        unrolled.append(inner_loop)
    # Task order: rows first when a staged input (padding) serves every channel tile of a row and
    # the weights stay in cache; channel tiles first otherwise, so that each weight panel comes
    # from memory once for all rows (rows first streamed 8 MB of weights per row in ResNeXt).
    spatial_order = [i for i in range(len(loops)) if kinds[i] == _DATA_PAR and i != axes.vector]
    if rows_first:
        spatial_order.remove(axes.extra)
        spatial_order.insert(spatial_order.index(axes.reuse), axes.extra)
    task_loops = [loops[i] for i in spatial_order]
    reduce_loops = [loop for i, loop in enumerate(loops) if kinds[i] == _REDUCE]
    vector_loop = loops[axes.vector]
    sch.reorder(*task_loops, vector_loop, *reduce_loops, *unrolled)

    work = 1
    for extent in extents:
        work *= extent
    if axes.reuse is None:
        # No operand stays in registers across the tile (depthwise convolutions, pools): every
        # multiply-add loads, so such a kernel takes several times longer per multiply-add.
        work *= LOAD_BOUND_FACTOR
    parallel_count = 1
    for count, loop in enumerate(task_loops, 1):
        parallel_count = count
        if _product(sch, task_loops[:count]) >= 4 * spec.threads:
            break
    if staged and rows_first:  # a row's stage is computed once, not once per channel tile
        parallel_count = min(parallel_count, spatial_order.index(axes.extra) + 1)
    task = _fuse_parallel(sch, task_loops[:parallel_count], work, spec)
    if task is None:
        raise NotApplicable("no loop to run tasks over")
    innermost_task = task_loops[-1] if len(task_loops) > parallel_count else task
    row_position = spatial_order.index(axes.extra) if rows_first else len(task_loops) - 1
    stage_at = task if row_position < parallel_count else task_loops[row_position]
    # accumulators local to the task: compacted, and promoted to registers inside the reduction
    sch.set_scope(main, 0, "local")
    for producer, stride in staged:
        sch.compute_at(producer, stage_at)
        _schedule_stage(sch, producer, stage_at, stride, spec)
    if len(parts) == 1:
        vector_outer, vector_inner = sch.split(vector_loop, [None, vector_tile])
        sch.reorder(vector_outer, *reduce_loops, *unrolled, vector_inner)
        _tile_body(sch, unrolled, vector_inner, spec)
        sch.reverse_compute_at(epilogue, vector_outer)
        _vectorize(sch, sch.get_loops(epilogue)[-1], spec)
        sch.decompose_reduction(main, reduce_loops[0])
        return
    # A width that no vector tile divides: full tiles, then narrower tails, each its own loop
    # (TVM cannot vectorize a predicated tail without a build option the pipeline cannot set).
    sch.reverse_compute_at(epilogue, innermost_task)
    _vectorize_parts(sch, sch.get_loops(epilogue)[-1], parts, spec)
    for part in sch.loop_partition(vector_loop, parts[:-1] + [None]):
        (block,) = sch.get_child_blocks(part)
        part_loops = list(sch.get_loops(block))
        at = [str(sch.get(loop).loop_var) for loop in part_loops].index(str(sch.get(part).loop_var))
        reduce_part, unrolled_part = part_loops[at + 1:at + 1 + len(reduce_loops)], part_loops[at + 1 + len(reduce_loops):]
        width = _extent(sch, part)
        if width > vector_tile:
            part_outer, part_inner = sch.split(part, [None, vector_tile])
            sch.reorder(part_outer, *reduce_part, *unrolled_part, part_inner)
        else:
            part_inner = part
            sch.reorder(*reduce_part, *unrolled_part, part_inner)
        _tile_body(sch, unrolled_part, part_inner, spec)
        sch.decompose_reduction(block, reduce_part[0])


def _register_tile(extents: list[int], axes: _Axes, vectors: int, spec: CpuSpec) -> tuple[int, int]:
    """(reuse, extra) tile sizes: divisors of their extents whose accumulators and operands fit
    the registers, with the most multiply-adds per load (each step loads one broadcast per
    reuse row and one vector per extra row)."""
    reuse_options = _divisors(extents[axes.reuse]) if axes.reuse is not None else [1]
    extra_options = _divisors(extents[axes.extra]) if axes.extra is not None else [1]
    best, best_score = (1, 1), (0.0, 0)
    for reuse in reuse_options:
        for extra in extra_options:
            accumulators = reuse * extra * vectors
            if accumulators > spec.accumulators or accumulators + extra * vectors + 1 > spec.registers:
                continue
            loads = (reuse if axes.reuse is not None else 0) + extra * vectors
            score = (accumulators / loads, accumulators)
            if score > best_score:
                best, best_score = (reuse, extra), score
    return best


def _divisors(extent: int) -> list[int]:
    return [d for d in range(1, extent + 1) if extent % d == 0]


def _rows_first(block: s_tir.SBlock, axes: _Axes, extents: list[int]) -> bool:
    """Whether tasks should run output rows outermost (each row task rereads all weights)
    rather than channel tiles (each channel task rereads all inputs): whichever rereads fewer
    bytes from beyond the core's caches."""
    if axes.reuse is None or axes.extra is None:
        return False
    reuse_var, vector_var = block.iter_vars[axes.reuse].var, block.iter_vars[axes.vector].var
    weights = inputs = 0
    for read in block.reads:
        nbytes = read.source.dtype.bits // 8
        for dim in read.source.shape:
            nbytes *= int(dim)
        if _region_uses(read.region, reuse_var) and not _region_uses(read.region, vector_var):
            weights += nbytes
        elif _region_uses(read.region, vector_var) and not _region_uses(read.region, reuse_var):
            inputs += nbytes
    return extents[axes.extra] * weights <= extents[axes.reuse] * inputs


def _tile_body(sch: s_tir.Schedule, unrolled: list, vector_loop, spec: CpuSpec) -> None:
    for loop in unrolled:
        sch.unroll(loop)
    _vectorize(sch, vector_loop, spec)


def _vector_parts(extent: int, lanes: int) -> tuple[int, list[int]]:
    """The vector tile of an axis and how the axis splits into loops: full tiles, then tails of
    at most one vector each. Measured on AVX2: a vector of an odd width above one register
    (14 lanes) ran 3x slower than 16 masked lanes, and TVM scalarizes predicated tails."""
    if extent <= lanes:
        return extent, [extent]
    tile = 2 * lanes if extent >= 2 * lanes else lanes
    main, tail = extent - extent % tile, extent % tile
    parts = [main] + [lanes] * (tail // lanes) + ([tail % lanes] if tail % lanes else [])
    return tile, [p for p in parts if p]


def _vectorize_parts(sch: s_tir.Schedule, loop, parts: list[int], spec: CpuSpec) -> None:
    """Vectorize a loop whose extent no vector divides as the reduction's parts: full vectors,
    then the tails, each a loop of its own (a residual add at width 36 ran scalar, doubling the
    time of a split chain's partial-sum kernel)."""
    for part in sch.loop_partition(loop, parts[:-1] + [None]) if len(parts) > 1 else [loop]:
        width = _extent(sch, part)
        if width <= spec.lanes:
            _vectorize(sch, part, spec)
        elif width % spec.lanes == 0:
            _, inner = sch.split(part, [None, spec.lanes])
            _vectorize(sch, inner, spec)


def _deinterleave(ndim: int, stride: int) -> tirx.IndexMap:
    """``[..., x] -> [..., x % stride, x // stride]``."""
    return tirx.IndexMap.from_func(lambda *index: (*index[:-1], index[-1] % stride, index[-1] // stride), ndim=ndim)


def _vector_strides(block: s_tir.SBlock, vector: int) -> dict[str, int]:
    """Buffer name → stride of its innermost index along the vector iterator (1 if unit or none)."""
    var = block.iter_vars[vector].var
    strides = {}
    for read in block.reads:
        coefficients = detect_linear_equation(read.region[-1].min, [var])
        if coefficients and isinstance(coefficients[0], tirx.IntImm) and int(coefficients[0]) > 1:
            strides[read.source.name] = int(coefficients[0])
    return strides


def _schedule_stage(sch: s_tir.Schedule, block, task, stride: int, spec: CpuSpec) -> None:
    """A producer computed per task. Padding becomes a zero fill plus a copy of the valid
    region (both vectorize; the bounds-checked original runs element by element); a buffer read
    with stride s is stored as ``[..., x % s, x // s]`` so the vector loads are contiguous."""
    loops = list(sch.get_loops(block))
    task_stmt = sch.get(task)
    first = next(i for i, loop in enumerate(loops) if sch.get(loop).same_as(task_stmt)) + 1
    copies = [block]
    if first < len(loops) and _is_padding(sch.get(block)) and sch.can_decompose_padding(block, loops[first]):
        copies.insert(0, sch.decompose_padding(block, loops[first]))
    width = int(sch.get(block).writes[0].source.shape[-1])
    deinterleaved = stride > 1 and width % stride == 0
    if deinterleaved:
        sch.transform_layout(block, ("write", 0), _deinterleave(len(sch.get(block).writes[0].source.shape), stride))
    for copy in copies:
        innermost = sch.get_loops(copy)[-1]
        extent = _extent(sch, innermost)
        if deinterleaved and extent % stride == 0 and extent >= 2 * stride:
            # iterate in the stored order: contiguous vector stores from strided loads (which
            # LLVM turns into loads and shuffles); the source order needs scatters AVX2 lacks
            column, phase = sch.split(innermost, [None, stride])
            sch.reorder(phase, column)
            innermost = column
        if _extent(sch, innermost) >= 2:
            _vectorize(sch, innermost, spec)


def _product(sch: s_tir.Schedule, loops: list) -> int:
    result = 1
    for loop in loops:
        result *= _extent(sch, loop)
    return result


def spatial(sch: s_tir.Schedule, spec: CpuSpec) -> None:
    """Injective kernels: inline into the outputs, vectorize the innermost loop, parallel outer."""
    blocks = _blocks(sch)
    if any(_is_reduction(sch.get(b)) for b in blocks):
        raise NotApplicable("has reductions")
    for block in blocks:
        if not _is_output(sch, block):
            sch.compute_inline(block)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        _schedule_loop_nest(sch, block, spec)


def generic(sch: s_tir.Schedule, spec: CpuSpec) -> None:
    """Reductions that do not tile (softmax, norms, global pools): parallel spatial loops."""
    blocks = _blocks(sch)
    for block in blocks:
        if not _is_output(sch, block) and not _is_reduction(sch.get(block)):
            try:
                sch.compute_inline(block)
            except _FAILURES:
                pass
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if _is_reduction(sch.get(block)):
            loops = list(sch.get_loops(block))
            kinds = [int(iv.iter_type) for iv in sch.get(block).iter_vars]
            if len(loops) != len(kinds):
                continue
            leading = []
            for loop, kind in zip(loops, kinds):
                if kind != _DATA_PAR:
                    break
                leading.append(loop)
            work = 1
            for loop in loops:
                work *= _extent(sch, loop)
            _fuse_parallel(sch, leading, work, spec)
        else:
            _schedule_loop_nest(sch, block, spec)


def _schedule_loop_nest(sch: s_tir.Schedule, block, spec: CpuSpec) -> None:
    loops = list(sch.get_loops(block))
    if not loops:
        return
    work = 1
    for loop in loops:
        work *= _extent(sch, loop)
    innermost = loops[-1]
    extent = _extent(sch, innermost)
    if extent >= 2 * spec.lanes and extent % spec.lanes == 0:
        outer, vector = sch.split(innermost, [None, spec.lanes])
        _vectorize(sch, vector, spec)
        _fuse_parallel(sch, loops[:-1] + [outer], work, spec)
    elif 2 <= extent <= 4 * spec.lanes:
        _vectorize(sch, innermost, spec)
        _fuse_parallel(sch, loops[:-1], work, spec)
    else:
        _fuse_parallel(sch, loops[:-1] or loops, work, spec)


RULES: tuple[Callable[[s_tir.Schedule, CpuSpec], None], ...] = (tiled_reduction, spatial, generic)
