"""The CPU rule for kernels with one reduction: convolutions of every kind, matmuls, dense layers, pools.

A register tile of output elements, vectorized along the output's contiguous axis and unrolled
along an axis whose operand is reused across the vector (output channels of a conv, rows of a
matmul), stays in vector registers for the whole reduction (the micro-kernel of BLIS and oneDNN).
Tasks run rows or channel tiles outermost, whichever rereads fewer bytes; padding is computed per
row (zero fill plus copy; a blocked depthwise convolution reads it in place), an input read with a
stride is stored de-interleaved, a width no vector divides gets tail loops of its own, and the
epilogue (bias, activation, residual add) runs on the tile before it is stored. A dense layer at
batch 1 reads its weight rows in memory order instead. Rows that no good tile divides (a ViT's 197
tokens) are padded to whole tiles, and a grouped convolution's output channels are split into groups
and channels within a group, which share their input and so make the tile's reuse axis.
"""

from __future__ import annotations

import dataclasses

import tvm
from tvm import s_tir, tirx
from tvm.sym.pattern import detect_linear_equation

from ..blocks import (
    DATA_PAR,
    REDUCE,
    NotApplicable,
    ReductionAxes,
    constant,
    inline_into_epilogue,
    is_output,
    is_padding,
    iter_extents,
    iterator_loops,
    loop_extent,
    reduction_axes,
    region_uses,
    the_reduction,
    top_level_blocks,
)
from .base import PARALLEL_MIN_WORK, CPUScheduleRule, fuse_parallel, product, schedule_loop_nest, vectorize
from .spec import CpuSpec

IN_PLACE_REGISTERS = 16
"""The register budget of a tile that reads a padded input in place (:func:`_reads_padding_in_place`)."""

LOAD_BOUND_FACTOR = 4
"""How much more a multiply-add costs in a reduction without register reuse (depthwise
convolutions, pools) than in a register-tiled one, for the serial/parallel decision: a
12-channel depthwise tile (140K multiply-adds) ran 29 µs on one thread and 17 µs on two."""

RAGGED_TILE_GAIN = 1.25
"""How many more multiply-adds per load a reuse tile that does not divide its extent must do than the best divisor
before the rows are padded to it (:func:`_pad_to_register_tiles`): the padding is a copy per task."""


class TiledReduction(CPUScheduleRule):
    """One reduction block (conv, depthwise/grouped conv, matmul, dense, pooling) with injective
    producers and an elementwise epilogue, register-tiled as the module docstring describes."""

    name = "tiled_reduction"

    def schedule(self, func: tirx.PrimFunc, spec: CpuSpec) -> s_tir.Schedule | None:
        return super().schedule(_split_groups(func) if spec.vector_codegen else func, spec)

    def transform(self, sch: s_tir.Schedule, spec: CpuSpec) -> None:
        _tile(sch, spec)


def _split_groups(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """A grouped convolution with its output channels ``f`` split into groups and channels within a group,
    ``(f // k, f % k)``, where its input is read at ``f // k``: no operand then varies with all of ``f``, so no
    axis could keep a register tile's weights or inputs (each multiply-add loaded both, as in a depthwise
    convolution); split, the channels within a group are the tile's reuse axis, as a regular convolution's output
    channels. RegNetY-400MF's first grouped convolution (48 channels, 8 a group, 3x3 stride 2 at 112x112): 1,825 ->
    324 us on two Zen 5 cores. The function as it was where no iterator is read that way."""
    sch = s_tir.Schedule(func)
    try:
        main = the_reduction(sch, top_level_blocks(sch))
    except NotApplicable:
        return func
    block = sch.get(main)
    for position, iter_var in enumerate(block.iter_vars):
        extent = iter_var.dom.extent
        if int(iter_var.iter_type) != DATA_PAR or not isinstance(extent, tirx.IntImm):
            continue
        group = _group_size(block, iter_var.var)
        if group is None or not 1 < group < int(extent) or int(extent) % group:
            continue
        sch.transform_block_layout(main, _split_map(len(block.iter_vars), position, group))
        # the reads' ``(g * k + j) // k`` become ``g`` only once simplified with the iterators' ranges
        split = tvm.s_tir.transform.StmtSimplify()(sch.mod)["main"]
        grouped = s_tir.Schedule(split)
        reduction = grouped.get(the_reduction(grouped, top_level_blocks(grouped)))
        axes = reduction_axes(reduction, iter_extents(reduction))
        return split if axes.reuse == position + 1 else func
    return func


def _split_map(ndim: int, at: int, k: int) -> tirx.IndexMap:
    """``[..., f, ...] -> [..., f // k, f % k, ...]`` over ``ndim`` iterators, ``f`` the one at ``at``."""

    def split(*index):
        return (*index[:at], index[at] // k, index[at] % k, *index[at + 1 :])

    return tirx.IndexMap.from_func(split, ndim=ndim)


def _group_size(block: s_tir.SBlock, var: tirx.Var) -> int | None:
    """``k`` where a read's index divides ``var`` by the constant ``k`` (``f // k * c + r``), else None."""

    def divisor(expr: tirx.PrimExpr) -> int | None:
        if isinstance(expr, tirx.FloorDiv) and expr.a.same_as(var) and isinstance(expr.b, tirx.IntImm):
            return int(expr.b)
        if isinstance(expr, (tirx.Add, tirx.Sub, tirx.Mul, tirx.FloorDiv, tirx.FloorMod)):
            return divisor(expr.a) or divisor(expr.b)
        return None

    return next((k for read in block.reads for dim in read.region if (k := divisor(dim.min))), None)


def _tile(sch: s_tir.Schedule, spec: CpuSpec) -> None:
    blocks = top_level_blocks(sch)
    main = the_reduction(sch, blocks)
    extents = iter_extents(sch.get(main))
    axes = reduction_axes(sch.get(main), extents)
    padded_rows = _pad_to_register_tiles(sch, main, extents, axes, spec)
    if padded_rows:
        blocks = top_level_blocks(sch)
        main = the_reduction(sch, blocks)
        extents = iter_extents(sch.get(main))
    position = [sch.get(b).name_hint for b in blocks].index(sch.get(main).name_hint)
    block = sch.get(main)
    rows_first = _rows_first(block, axes, extents)
    # Producers are inlined, except paddings (but a blocked depthwise convolution reads its padding
    # in place: _reads_padding_in_place), and, when a row's input serves every channel
    # tile, inputs read with a stride along the vector axis: those are staged per row, a
    # strided one stored de-interleaved (staged per channel tile, the copies cost more than
    # the strided loads they save).
    strides = _vector_strides(block, axes.vector) if rows_first else {}
    staged = []
    in_place = False  # a padding read in place, its bounds checked per channel vector
    for producer in reversed(blocks[:position]):
        if rows_first and sch.get(producer).name_hint in padded_rows:
            # every task (a panel of columns) reads all the padded rows: one copy before the tasks
            schedule_loop_nest(sch, producer, spec)
            continue
        stride = strides.get(sch.get(producer).writes[0].source.name, 1)
        padding = is_padding(sch.get(producer))
        if padding and not _pads_innermost(sch.get(producer)) and _reads_padding_in_place(block, axes):
            padding, in_place = False, True
        if padding or stride > 1:
            staged.append((producer, stride))
        else:
            sch.compute_inline(producer)
    for index, read in enumerate(sch.get(main).reads):
        stride = strides.get(read.source.name, 1)
        if stride > 1 and not any(sch.get(p).writes[0].source.same_as(read.source) for p, _ in staged):
            staged.append((sch.cache_read(main, index, "global"), stride))
    epilogue = inline_into_epilogue(sch, main, blocks[position + 1 :], "global")

    block = sch.get(main)
    loops = iterator_loops(sch, main, extents)
    kinds = [int(iv.iter_type) for iv in block.iter_vars]
    if _is_matrix_vector(extents, kinds, axes, staged, spec):
        _stream_rows(sch, main, epilogue, loops, kinds, axes.vector, spec)
        return

    vector_tile, parts = vector_parts(extents[axes.vector], spec.lanes)
    vectors = -(-vector_tile // spec.lanes)
    unrolled = []
    # an in-place padded read keeps the tile to 16 registers' worth of accumulators (see _reads_padding_in_place)
    tile_spec = dataclasses.replace(spec, registers=min(spec.registers, IN_PLACE_REGISTERS)) if in_place else spec
    for axis, tile in zip((axes.reuse, axes.extra), _register_tile(extents, axes, vectors, tile_spec), strict=True):
        if axis is None:
            continue
        outer_loop, inner_loop = sch.split(loops[axis], [None, tile])
        loops[axis] = outer_loop
        unrolled.append(inner_loop)
    # Task order: rows first when a staged input (padding) serves every channel tile of a row and
    # the weights stay in cache; channel tiles first otherwise, so that each weight panel comes
    # from memory once for all rows (rows first streamed 8 MB of weights per row in ResNeXt).
    spatial_order = [i for i in range(len(loops)) if kinds[i] == DATA_PAR and i != axes.vector]
    if rows_first:
        spatial_order.remove(axes.extra)
        spatial_order.insert(spatial_order.index(axes.reuse), axes.extra)
    task_loops = [loops[i] for i in spatial_order]
    reduce_loops = [loop for i, loop in enumerate(loops) if kinds[i] == REDUCE]
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
    for count in range(1, len(task_loops) + 1):
        parallel_count = count
        if product(sch, task_loops[:count]) >= 4 * spec.threads:
            break
    if staged and rows_first:  # a row's stage is computed once, not once per channel tile
        parallel_count = min(parallel_count, spatial_order.index(axes.extra) + 1)
    task = fuse_parallel(sch, task_loops[:parallel_count], work, spec)
    if task is None:
        raise NotApplicable("no loop to run tasks over")
    innermost_task = task_loops[-1] if len(task_loops) > parallel_count else task
    row_position = spatial_order.index(axes.extra) if rows_first else len(task_loops) - 1
    stage_at = task if row_position < parallel_count else task_loops[row_position]
    # accumulators local to the task: compacted, and promoted to registers inside the reduction.
    # For the C target they are "global": TVM's LowerTVMBuiltin keeps only global-scope buffers under
    # 1 KiB on the stack and turns "local" ones into TVMBackendAllocWorkspace calls, memory a C
    # compiler cannot keep in registers (it may alias the kernel's tensors): every multiply-add then
    # stored its accumulator back (a float conv on the Cortex-M7: 1.7x the instructions).
    sch.set_scope(main, 0, "local" if spec.vector_codegen else "global")
    for producer, stride in staged:
        sch.compute_at(producer, stage_at)
        _schedule_stage(sch, producer, stage_at, stride, spec)
    if len(parts) == 1:
        vector_outer, vector_inner = sch.split(vector_loop, [None, vector_tile])
        sch.reorder(vector_outer, *reduce_loops, *unrolled, vector_inner)
        _tile_body(sch, unrolled, vector_inner, spec)
        sch.reverse_compute_at(epilogue, vector_outer)
        vectorize(sch, sch.get_loops(epilogue)[-1], spec)
        sch.decompose_reduction(main, reduce_loops[0])
        return
    # A width that no vector tile divides: full tiles, then narrower tails, each its own loop
    # (TVM cannot vectorize a predicated tail without a build option the pipeline cannot set).
    sch.reverse_compute_at(epilogue, innermost_task)
    vectorize_parts(sch, sch.get_loops(epilogue)[-1], parts, spec)
    for part in sch.loop_partition(vector_loop, parts[:-1] + [None]):
        (block,) = sch.get_child_blocks(part)
        part_loops = list(sch.get_loops(block))
        at = [str(sch.get(loop).loop_var) for loop in part_loops].index(str(sch.get(part).loop_var))
        reduce_part, unrolled_part = (
            part_loops[at + 1 : at + 1 + len(reduce_loops)],
            part_loops[at + 1 + len(reduce_loops) :],
        )
        width = loop_extent(sch, part)
        if width > vector_tile:
            part_outer, part_inner = sch.split(part, [None, vector_tile])
            sch.reorder(part_outer, *reduce_part, *unrolled_part, part_inner)
        else:
            part_inner = part
            sch.reorder(*reduce_part, *unrolled_part, part_inner)
        _tile_body(sch, unrolled_part, part_inner, spec)
        sch.decompose_reduction(block, reduce_part[0])


def _reads_padding_in_place(block: s_tir.SBlock, axes: ReductionAxes) -> bool:
    """Whether a padded input is better read in place, bounds-checked per load, than staged (a copy of the
    input rows per task): in a depthwise convolution (no register reuse, a weight operand: not a pool). In a
    blocked layout the check selects whole channel vectors. Its register tile then holds at most
    :data:`IN_PLACE_REGISTERS` registers' worth of accumulators (7 columns, not 14, at AVX-512). One Zen 4 core,
    MnasNet's depthwise convolutions at AVX-512, staged -> in place with 14 columns -> in place with 7: 3x3/2 48
    channels at 112 to 56 77 -> 55 -> 39 µs, 3x3 32 at 112x112 134 -> 117 -> 85 µs, 5x5 120 at 28x28
    76 -> 101 -> 55 µs, 5x5/2 72 at 56 to 28 70 -> 78 -> 28 µs; at AVX2 (16 registers) 3x3/2 48 at 112 to 56
    72 -> 43 µs, 5x5 120 at 28x28 66 -> 49 µs."""
    return axes.reuse is None and len({r.source.name for r in block.reads}) >= 2


def _is_matrix_vector(extents: list[int], kinds: list[int], axes: ReductionAxes, staged: list, spec: CpuSpec) -> bool:
    """One output row (every spatial axis but the vector's of extent 1) and one reduction axis: a classifier's
    dense layer at batch 1, whose weights no register tile reuses."""
    spatial = [e for i, (e, k) in enumerate(zip(extents, kinds, strict=True)) if k == DATA_PAR and i != axes.vector]
    return (
        spec.vector_codegen
        and not staged
        and kinds.count(REDUCE) == 1
        and all(e == 1 for e in spatial)
        and extents[axes.vector] >= 2 * spec.lanes
    )


def _stream_rows(
    sch: s_tir.Schedule, main, epilogue, loops: list, kinds: list[int], vector: int, spec: CpuSpec
) -> None:
    """A matrix-vector product with the weight matrix read row after row, in memory order: the reduction
    outermost, every output a vector accumulator in L1 updated once per row. A register tile of a few output
    vectors per task read each weight row in pieces of 2-8 cache lines, one stream per row, and a cold
    MnasNet classifier (1280 x 1000, 5 MB) ran 387 µs on one Zen 4 core at AVX-512, 441 µs at AVX2; in row
    order 230-250 µs at both, onnxruntime's Gemm 265 µs. With threads the rows are split between them
    (``rfactor``), each summing its own rows, and the partial sums are added at the end."""
    reduce_at = kinds.index(REDUCE)
    reduce_loop, vector_loop = loops[reduce_at], loops[vector]
    _, parts = vector_parts(loop_extent(sch, vector_loop), spec.lanes)
    rows = loop_extent(sch, reduce_loop)
    if spec.threads > 1 and product(sch, loops) >= PARALLEL_MIN_WORK and rows % spec.threads == 0:
        task, _ = sch.split(reduce_loop, [spec.threads, None])
        partial = sch.rfactor(task, 0)
        partial_loops = list(sch.get_loops(partial))  # main's, the reduction split in two
        task, vector_loop = partial_loops[reduce_at], partial_loops[vector if vector < reduce_at else vector + 1]
        sch.reorder(task, vector_loop)
        sch.parallel(task)
        _vector_rows(sch, partial, vector_loop, parts, spec)
        # the threads' partial sums: a reduction over the task axis, vectorized along the output
        _vector_rows(sch, main, sch.get_loops(main)[vector], parts, spec)
    else:
        sch.set_scope(main, 0, "local")
        _vector_rows(sch, main, vector_loop, parts, spec)
    vectorize_parts(sch, sch.get_loops(epilogue)[-1], parts, spec)


def _vector_rows(sch: s_tir.Schedule, block, vector_loop, parts: list[int], spec: CpuSpec) -> None:
    """``block``'s ``vector_loop`` (outside its innermost loop, the reduction) moved inside the reduction, in
    vectors (tails their own loops), the initialization of its accumulators split off before the reduction."""
    pieces = sch.loop_partition(vector_loop, parts[:-1] + [None]) if len(parts) > 1 else [vector_loop]
    for piece in pieces:
        (part_block,) = sch.get_child_blocks(piece) if len(parts) > 1 else (block,)
        reduction = sch.get_loops(part_block)[-1]
        sch.reorder(reduction, piece)
        width = loop_extent(sch, piece)
        vectorize(sch, sch.split(piece, [None, spec.lanes])[1] if width > spec.lanes else piece, spec)
        sch.decompose_reduction(part_block, reduction)


def _pad_to_register_tiles(
    sch: s_tir.Schedule, main, extents: list[int], axes: ReductionAxes, spec: CpuSpec
) -> set[str]:
    """Pad the reuse axis up to whole register tiles where no divisor of its extent makes a good tile (a ViT's
    197 tokens, a prime, left tiles of one token: its 197 x 768 x 3072 matmul ran 19.2 ms on two Zen 5 cores,
    the same at 196 tokens 1.9 ms). TVM's ``pad_einsum`` computes over a padded copy of the row operand, which
    each task stages for its rows like a convolution's padding, and the epilogue stores the real rows only; a
    tile that did not divide its extent instead masked each row's multiply-adds, which LLVM compiled into
    branches within the reduction for some tiles (11 tokens: 1.4x the time of 14). Whether it pays: the tile's
    multiply-adds per load, counting the padded rows as work, beat the best divisor's by
    :data:`RAGGED_TILE_GAIN`. Returns the names of the padded copies' blocks (none where it does not pad)."""
    if axes.reuse is None or not spec.vector_codegen:
        return set()
    vectors = -(-vector_parts(extents[axes.vector], spec.lanes)[0] // spec.lanes)
    rows = extents[axes.reuse]
    score = _best_register_tile(extents, axes, vectors, spec, _divisors(rows))[1]
    candidates = range(1, min(rows, spec.accumulators) + 1)
    (tile, _), padded_score = _best_register_tile(extents, axes, vectors, spec, candidates)
    if rows % tile == 0 or padded_score <= RAGGED_TILE_GAIN * score:
        return set()
    multiples = [tile if i == axes.reuse else 1 for i in range(len(extents))]
    producers = {sch.get(b).name_hint for b in sch.get_producers(main)}
    try:
        sch.pad_einsum(main, multiples)
    except s_tir.ScheduleError:  # not an einsum TVM can pad (its operands' indices): keep the divisor
        return set()
    # the padded result's copy into the real rows: inlined into the epilogue, or the epilogue itself
    for consumer in sch.get_consumers(main):
        if not is_output(sch, consumer):
            sch.compute_inline(consumer)
    return {sch.get(b).name_hint for b in sch.get_producers(main)} - producers


def _register_tile(extents: list[int], axes: ReductionAxes, vectors: int, spec: CpuSpec) -> tuple[int, int]:
    """(reuse, extra) tile sizes: divisors of their extents whose accumulators and operands fit
    the registers, with the most multiply-adds per load (each step loads one broadcast per
    reuse row and one vector per extra row)."""
    reuse_options = _divisors(extents[axes.reuse]) if axes.reuse is not None else [1]
    return _best_register_tile(extents, axes, vectors, spec, reuse_options)[0]


def _best_register_tile(
    extents: list[int], axes: ReductionAxes, vectors: int, spec: CpuSpec, reuse_options
) -> tuple[tuple[int, int], float]:
    """The (reuse, extra) tile of :func:`_register_tile` among ``reuse_options``, and its multiply-adds per
    load, scaled by the share of real rows where a reuse tile does not divide its extent."""
    extra_options = _divisors(extents[axes.extra]) if axes.extra is not None else [1]
    best, best_score = (1, 1), (0.0, 0)
    for reuse in reuse_options:
        used = extents[axes.reuse] / (-(-extents[axes.reuse] // reuse) * reuse) if axes.reuse is not None else 1.0
        for extra in extra_options:
            accumulators = reuse * extra * vectors
            if accumulators > spec.accumulators or accumulators + extra * vectors + 1 > spec.registers:
                continue
            loads = (reuse if axes.reuse is not None else 0) + extra * vectors
            score = (accumulators / loads * used, accumulators)
            if score > best_score:
                best, best_score = (reuse, extra), score
    return best, best_score[0]


def _divisors(extent: int) -> list[int]:
    return [d for d in range(1, extent + 1) if extent % d == 0]


def _rows_first(block: s_tir.SBlock, axes: ReductionAxes, extents: list[int]) -> bool:
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
            nbytes *= constant(dim)
        if region_uses(read.region, reuse_var) and not region_uses(read.region, vector_var):
            weights += nbytes
        elif region_uses(read.region, vector_var) and not region_uses(read.region, reuse_var):
            inputs += nbytes
    return extents[axes.extra] * weights <= extents[axes.reuse] * inputs


def _tile_body(sch: s_tir.Schedule, unrolled: list, vector_loop, spec: CpuSpec) -> None:
    for loop in unrolled:
        sch.unroll(loop)
    vectorize(sch, vector_loop, spec)


def vector_parts(extent: int, lanes: int) -> tuple[int, list[int]]:
    """The vector tile of an axis and how the axis splits into loops: full tiles, then tails of
    at most one vector each. Measured on AVX2: a vector of an odd width above one register
    (14 lanes) ran 3x slower than 16 masked lanes, and TVM scalarizes predicated tails."""
    if extent <= lanes:
        return extent, [extent]
    tile = 2 * lanes if extent >= 2 * lanes else lanes
    main, tail = extent - extent % tile, extent % tile
    parts = [main] + [lanes] * (tail // lanes) + ([tail % lanes] if tail % lanes else [])
    return tile, [p for p in parts if p]


def vectorize_parts(sch: s_tir.Schedule, loop, parts: list[int], spec: CpuSpec, lanes: int | None = None) -> None:
    """Vectorize a loop whose extent no vector divides as the reduction's parts: full vectors
    (of ``lanes`` elements, the spec's float32 lanes unless given), then the tails, each a loop
    of its own (a residual add at width 36 ran scalar, doubling the time of a split chain's
    partial-sum kernel)."""
    lanes = lanes or spec.lanes
    for part in sch.loop_partition(loop, parts[:-1] + [None]) if len(parts) > 1 else [loop]:
        width = loop_extent(sch, part)
        if width <= lanes:
            vectorize(sch, part, spec)
        elif width % lanes == 0:
            _, inner = sch.split(part, [None, lanes])
            vectorize(sch, inner, spec)


def _pads_innermost(block: s_tir.SBlock) -> bool:
    """Whether a padding pads its innermost axis, so that its bounds check varies within a vector. Where it
    does not (a blocked NCHW[x]c input, its vectors channel blocks), the bounds-checked copy selects whole
    vectors and beats a zero fill plus a predicated copy, whose stores AVX-512 masks (one thread, Zen 4:
    3x3 depthwise convolutions at 56x56 0.6-0.7x the time at AVX-512 and AVX2, 5x5 0.7-0.8x)."""
    written, read = block.writes[0].source, block.reads[0].source
    return constant(written.shape[-1]) != constant(read.shape[-1])


def _deinterleave(ndim: int, stride: int) -> tirx.IndexMap:
    """``[..., x] -> [..., x % stride, x // stride]``."""
    return tirx.IndexMap.from_func(lambda *index: (*index[:-1], index[-1] % stride, index[-1] // stride), ndim=ndim)


def _vector_strides(block: s_tir.SBlock, vector: int) -> dict[str, int]:
    """Buffer name → stride of its innermost index along the vector iterator (1 if unit or none)."""
    var = block.iter_vars[vector].var
    strides = {}
    for read in block.reads:
        if not read.region:  # a scalar operand
            continue
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
    if (
        first < len(loops)
        and is_padding(sch.get(block))
        and _pads_innermost(sch.get(block))
        and sch.can_decompose_padding(block, loops[first])
    ):
        copies.insert(0, sch.decompose_padding(block, loops[first]))
    width = constant(sch.get(block).writes[0].source.shape[-1])
    deinterleaved = stride > 1 and width % stride == 0
    if deinterleaved:
        try:
            sch.transform_layout(block, ("write", 0), _deinterleave(len(sch.get(block).writes[0].source.shape), stride))
        except tvm.error.InternalError:
            # TVM cannot invert the map over some staged regions (a 3x3 stride-2 int8 conv of 128
            # channels at 56x56): the stage keeps its layout, and the vector loads their stride
            deinterleaved = False
    for copy in copies:
        innermost = sch.get_loops(copy)[-1]
        extent = loop_extent(sch, innermost)
        if deinterleaved and extent % stride == 0 and extent >= 2 * stride:
            # iterate in the stored order: contiguous vector stores from strided loads (which
            # LLVM turns into loads and shuffles); the source order needs scatters AVX2 lacks
            column, phase = sch.split(innermost, [None, stride])
            sch.reorder(phase, column)
            innermost = column
        if loop_extent(sch, innermost) >= 2:
            vectorize(sch, innermost, spec)
