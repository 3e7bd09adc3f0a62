"""The CPU rule for convolutions in blocked channel layouts (NCHW[x]c, :mod:`tvm_memplan.relax.layout`).

The micro-kernel of onnxruntime's MLAS NCHWc convolutions and of NeoCPU: a tile of ``oc`` channel blocks by
``ow`` output columns stays in vector registers (one register per block and column, its lanes the block's
channels) for the whole reduction; each step loads one weight vector per channel block and broadcasts one
input value per column, so every broadcast serves ``oc`` multiply-adds and every weight vector ``ow`` (on
AVX-512 the broadcast folds into the FMA's memory operand). Tasks are output rows, or channel tiles where the
weights outweigh the inputs (whichever rereads fewer bytes, as in :mod:`.tiled_reduction`); a row whose width
no good tile divides ends in a narrower tile, a loop nest of its own, and rows too narrow for a good tile run
as one run of positions across rows; padding is its own vectorized pass and the epilogue (bias, activation,
residual add) runs on the tile before it is stored.
"""

from __future__ import annotations

import math

import tvm
from tvm import s_tir

from ..blocks import (
    NotApplicable,
    constant,
    inline_into_epilogue,
    is_padding,
    iter_extents,
    iterator_loops,
    loop_extent,
    the_reduction,
    top_level_blocks,
)
from .base import CPUScheduleRule, fuse_parallel, product, schedule_loop_nest, vectorize
from .spec import CpuSpec

BLOCKED_CONV = "conv2d_NCHWc"
"""The reduction block's name in :func:`tvm_memplan.relax.layout.conv2d_nchwc`."""
MAX_CHANNEL_TILE = 4
"""Channel blocks per register tile (MLAS's AVX-512 kernel holds up to 4 filter blocks)."""
WIDE_TILE_REGISTERS = 32
"""Vector registers from which a block count that no tile of 2 to :data:`MAX_CHANNEL_TILE` blocks divides (5, 7,
13, 29 ...) may take a tile of its smallest divisor's blocks instead of one block (:func:`channel_tiles`)."""
TAIL_VECTOR_CYCLES = 7.0
"""Cycles a row with a narrower last tile spends per output vector beyond its tiles' multiply-adds: its own
loop nest and a row-wide accumulator buffer that the epilogue reloads. Fitted to one thread on Zen 4 at AVX2
(2 x 6 plus a tail against 2 x 4 on ResNet-50's kernels; MobileNetV3-small's and SqueezeNet's short
reductions): the tail paid off from 256 reduction steps at 56 columns and 512 at 28 (3 to 8 % less time),
cost 2 to 12 % with 64 to 128 steps at 28 and 56 columns, and still paid off at 32 to 48 steps where the
dividing tile was latency-bound (3 x 2 or 4 x 2 at 14 columns: 10 to 20 %)."""


FMA_LATENCY = 4
"""Cycles of a vector multiply-add's latency (Zen 2 to 4, Skylake and later)."""
FMA_PIPES = 2
"""Vector multiply-adds issued a cycle."""
LATENCY_BOUND_CYCLES = 0.5
"""Cycles a reduction step loses where a tile's accumulators only just cover the multiply-add's latency
(no more than ``FMA_PIPES * FMA_LATENCY`` of them): one late operand stalls both pipes. At AVX2 on Zen 4 the
2 x 4 tile (8 accumulators) ran at about 90 % of the peak, the 2 x 6 tile at 95 %."""


class BlockedConv(CPUScheduleRule):
    """A blocked convolution (``conv2d_NCHWc``: spatial ``n, oc, oh, ow, o``, reduction ``ic, kh, kw,
    i``) with padding and an elementwise epilogue, register-tiled as the module docstring describes."""

    name = "blocked_conv"

    def transform(self, sch: s_tir.Schedule, spec: CpuSpec) -> None:
        blocks = top_level_blocks(sch)
        main = the_reduction(sch, blocks)
        block = sch.get(main)
        if block.name_hint != BLOCKED_CONV or len(block.iter_vars) != 9:
            raise NotApplicable("not a blocked convolution")
        extents = iter_extents(block)
        _, channels, rows, columns, lanes = extents[:5]
        position = [sch.get(b).name_hint for b in blocks].index(BLOCKED_CONV)
        padding = []
        for producer in reversed(blocks[:position]):
            if is_padding(sch.get(producer)):
                padding.append(producer)
            else:
                sch.compute_inline(producer)
        epilogue = inline_into_epilogue(sch, main, blocks[position + 1 :], "global")
        vectors = -(-lanes // spec.lanes)
        # with a tail of columns the columns are partitioned below the tasks, which must then be enough
        tails = extents[0] * rows * -(-channels // MAX_CHANNEL_TILE) >= 4 * spec.threads
        reduction = math.prod(extents[5:])
        channel_tile, column_tile = register_tile(channels, columns, vectors, spec, tails=tails, reduction=reduction)
        if iter_extents(sch.get(epilogue)) == extents[:5]:
            flat = register_tile(channels, rows * columns, vectors, spec, tails=True, reduction=reduction)
            tasks = extents[0] * (channels // flat[0])  # with a tail, only channel tiles are tasks
            if (rows * columns % flat[1] == 0 or balanced(tasks, spec.threads)) and _flattens(
                channels, rows, columns, (channel_tile, column_tile), flat, vectors, reduction, spec
            ):
                _flatten_positions(sch, main, epilogue, columns)
                rows, columns = 1, rows * columns
                extents = extents[:2] + [columns] + extents[4:]
                channel_tile, column_tile = flat
        loops = iterator_loops(sch, main, extents)
        if len(loops) == 8:
            loops.insert(2, None)
        batch, oc, oh, ow, o, *reduce_loops = loops
        oc_outer, oc_inner = sch.split(oc, [None, channel_tile])
        column_parts = [columns - columns % column_tile] + ([columns % column_tile] if columns % column_tile else [])
        weights_first = _weights_first(block, rows)
        if len(column_parts) == 1:
            ow_outer, ow_inner = sch.split(ow, [None, column_tile])
            # within a row, channel tiles outermost: a tile's weights stay in L1 across the row, whose input
            # is reread per tile (columns outermost reread every weight per column tile: a 1x1 convolution of
            # 64 to 256 channels at 56x56 with a residual add, one thread, Zen 4, 0.94x the time at AVX-512,
            # 0.88x at AVX2; 3x3 ones unchanged)
            task_loops = [batch, oc_outer, oh, ow_outer] if weights_first else [batch, oh, oc_outer, ow_outer]
            task_loops = [loop for loop in task_loops if loop is not None]
            sch.reorder(*task_loops, *reduce_loops, ow_inner, oc_inner, o)
        else:
            task_loops = [batch, oc_outer, oh] if weights_first else [batch, oh, oc_outer]
            task_loops = [loop for loop in task_loops if loop is not None]
            sch.reorder(*task_loops, ow, *reduce_loops, oc_inner, o)
        work = 1
        for extent in extents:
            work *= extent
        parallel = 1
        while parallel < len(task_loops) and not balanced(product(sch, task_loops[:parallel]), spec.threads):
            parallel += 1
        task = fuse_parallel(sch, task_loops[:parallel], work, spec)
        tile_loop = task_loops[-1] if parallel < len(task_loops) else task
        sch.set_scope(main, 0, "local")  # accumulators, promoted to registers inside the tile
        sch.reverse_compute_at(epilogue, tile_loop)
        vectorize(sch, sch.get_loops(epilogue)[-1], spec)
        sch.unroll(oc_inner)
        vectorize(sch, o, spec)
        if len(column_parts) == 1:
            sch.unroll(ow_inner)
            sch.decompose_reduction(main, reduce_loops[0])
        else:
            try:
                _column_tiles(sch, ow, column_parts, column_tile, len(reduce_loops))
            except tvm.error.InternalError as error:
                # TVM's loop_partition fails on some partial-sum convolutions of a split chain (SqueezeNet's
                # classifier in 2 tiles: 8 input blocks, 63 output blocks at 13x13, "Buffer rank and region
                # dimension mismatch"): the next rule schedules them
                raise NotApplicable(f"columns not partitioned: {error}") from error
        for pad in padding:
            _schedule_padding(sch, pad, spec)


BALANCED_TASKS = 8
"""Tasks per thread from which an uneven share (a thread with one task more) is left as it is (at most 1/16 of
the time idle at 2 threads): joining the next loop into the tasks cost 3 to 4 % of a kernel's time at one thread
(AVX2: SqueezeNet's 1x1 convolutions at 27x27 and 13x13), more than 27 or 35 rows leave idle (4 or 3 %)."""


def balanced(tasks: int, threads: int) -> bool:
    """Whether ``tasks`` keep ``threads`` busy alike. A parallel loop is split statically, each thread a run of
    ``ceil(tasks / threads)``: 13 rows on 2 threads give one 7 and the other 6, 8 % of the kernel's time idle. So
    at least 4 tasks each, and as many for each or so many that one more is little."""
    return tasks >= 4 * threads and (tasks % threads == 0 or tasks >= BALANCED_TASKS * threads)


def _schedule_padding(sch: s_tir.Schedule, pad, spec: CpuSpec) -> None:
    """The input's zero padding, a pass of its own: where its blocks are narrower than a vector (a stem's
    NCHW1c input), a zero fill and a copy of the valid region whose rows vectorize (the bounds-checked
    original ran element by element, serial)."""
    blocks = [pad]
    loops = sch.get_loops(pad)
    if loop_extent(sch, loops[-1]) < spec.lanes and sch.can_decompose_padding(pad, loops[0]):
        blocks.insert(0, sch.decompose_padding(pad, loops[0]))
    for block in blocks:
        loops = sch.get_loops(block)
        if len(loops) >= 2 and loop_extent(sch, loops[-1]) < spec.lanes:
            sch.fuse(*loops[-2:])
        schedule_loop_nest(sch, block, spec)


def _column_tiles(sch: s_tir.Schedule, ow, parts: list[int], column_tile: int, reductions: int) -> None:
    """Columns that no register tile divides: whole tiles, then one narrower tile, each a loop nest of its
    own (``loop_partition``) with the columns unrolled inside the reduction."""
    for part in sch.loop_partition(ow, parts[:-1] + [None]):
        (block,) = sch.get_child_blocks(part)
        part_loops = list(sch.get_loops(block))
        at = [str(sch.get(loop).loop_var) for loop in part_loops].index(str(sch.get(part).loop_var))
        reduce_part = part_loops[at + 1 : at + 1 + reductions]
        inner = part_loops[at + 1 + reductions :]
        if loop_extent(sch, part) > column_tile:
            part_outer, part_inner = sch.split(part, [None, column_tile])
            sch.reorder(part_outer, *reduce_part, part_inner, *inner)
        else:
            part_inner = part
            sch.reorder(*reduce_part, part_inner, *inner)
        sch.unroll(part_inner)
        sch.decompose_reduction(block, reduce_part[0])


def register_tile(
    channels: int, columns: int, vectors: int, spec: CpuSpec, tails: bool = False, reduction: int | None = None
) -> tuple[int, int]:
    """(channel blocks, columns) of the register tile: divisors of their extents whose accumulators, one
    weight register per block and a broadcast fit the registers (LLVM keeps every weight vector of a
    step in a register; 28 accumulators, 4 weights and 7 broadcasts spilled), with the most multiply-adds
    per load (``oc`` weight loads and ``ow`` broadcasts serve ``oc * ow`` of them). Where ``tails``
    allows a narrower last tile per row, the columns need not divide (a prime width, 13 or 73 or 109, left
    one column a tile), and such a tile replaces the dividing one where the cycles it saves over the
    ``reduction``'s steps (:func:`row_steps`) exceed what its row costs per output vector
    (:data:`TAIL_VECTOR_CYCLES`): a long reduction takes 2 x 6 and a 2-column tail over 2 x 4 at 56
    columns, a short one keeps 2 x 4. Without ``reduction``, the reduction counts as long."""

    def fits(channel_tile: int, column_tile: int) -> bool:
        accumulators = channel_tile * column_tile * vectors
        return accumulators <= spec.accumulators and accumulators + channel_tile * vectors + 1 <= spec.registers

    candidates = channel_tiles(channels, vectors, spec)
    best, best_score = (1, 1), (0.0, 0)
    for channel_tile in candidates:
        for column_tile in (d for d in range(1, columns + 1) if columns % d == 0):
            if not fits(channel_tile, column_tile):
                continue
            accumulators = channel_tile * column_tile * vectors
            score = (accumulators / (channel_tile * vectors + column_tile), accumulators)
            if score > best_score:
                best, best_score = (channel_tile, column_tile), score
    if not tails:
        return best
    tiles = [(c, w) for c in candidates for w in range(1, columns + 1) if columns % w and fits(c, w)]
    if not tiles:
        return best
    tailed = min(tiles, key=lambda tile: row_steps(channels, columns, *tile, vectors))
    if reduction is None:
        return (
            tailed
            if row_steps(channels, columns, *tailed, vectors) < row_steps(channels, columns, *best, vectors)
            else best
        )
    cycles = [_row_cycles(channels, columns, tile, vectors, reduction) for tile in (tailed, best)]
    return tailed if cycles[0] < cycles[1] else best


def channel_tiles(channels: int, vectors: int, spec: CpuSpec) -> list[int]:
    """Channel blocks a register tile may take: the divisors of ``channels`` up to :data:`MAX_CHANNEL_TILE`, and
    where those leave only one block (5, 7, 13 or 29 blocks: 80, 112, 208 or 464 channels at 16 lanes) and the
    target has :data:`WIDE_TILE_REGISTERS`, the smallest divisor above it as well if it fits two columns (13
    blocks do not: 13 x 1 loads a weight vector for every multiply-add). A one-block tile loads a broadcast for
    every multiply-add (1 x 28: 29 loads for 28), 5 x 4 loads 9 for 20; :func:`register_tile`'s score and cycle
    model, unchanged, choose among the candidates. One thread, CPU time, Zen 5 (loaded), kernels alone: MnasNet's
    1x1 24 -> 72 at 56x56 (5 output blocks) 240 -> 200 us, 480 -> 72 at 14x14 129 -> 122 us. At 16 registers
    such a tile leaves two columns at most; there :func:`tile_padded_blocks` pads the count instead."""
    tiles = [d for d in range(1, min(channels, MAX_CHANNEL_TILE) + 1) if channels % d == 0]
    if tiles == [1] and channels > 1 and spec.registers >= WIDE_TILE_REGISTERS:
        wide = next(d for d in range(MAX_CHANNEL_TILE + 1, channels + 1) if channels % d == 0)
        if 2 * wide * vectors <= spec.accumulators and 3 * wide * vectors + 1 <= spec.registers:
            tiles.append(wide)
    return tiles


def tile_padded_blocks(blocks: int, columns: int, reduction: int, spec: CpuSpec) -> int:
    """Output channel blocks a convolution should compute: ``blocks``, or one more where no register tile of several
    blocks divides them (125 blocks: SqueezeNet's 1000 classes at AVX2; 29: ShuffleNetV2's 232 channels) and the
    cycle model (:func:`register_tile`, :func:`_row_cycles`) puts the padded convolution ahead by more than the
    extra block's share (1 / ``blocks``), which the padded tensor's consumers pay once more (the next convolution's
    reduction, the slice of the real channels). A one-block tile loads a weight vector and a broadcast per column
    for one multiply-add each, so at 16 registers (1 x 7) it is bound by loads, not multiply-adds; at 32 (1 x 14 or
    wider) it loses less (the AVX-512 block counts of the torchvision exports keep theirs: 13 takes 1 x 14, 5 and 7
    a tile of all their blocks, :func:`channel_tiles`). Measured at AVX2 (one thread, Zen 5): SqueezeNet's 1x1 512
    -> 1000 at 13x13, 125 blocks 1787 us, 126 blocks 1376 us (:mod:`tvm_memplan.relax.channel_pad` pads them). Not
    at one output column (a squeeze-and-excitation convolution after a global pool): a matrix-vector product, whose
    every weight vector serves one multiply-add whatever the tile, is bound by loading the weights."""
    if columns == 1 or blocks <= MAX_CHANNEL_TILE or any(blocks % d == 0 for d in range(2, MAX_CHANNEL_TILE + 1)):
        return blocks

    def cycles(count: int) -> float:
        tile = register_tile(count, columns, 1, spec, tails=True, reduction=reduction)
        return _row_cycles(count, columns, tile, 1, reduction)

    return blocks + 1 if cycles(blocks + 1) < (1 - 1 / blocks) * cycles(blocks) else blocks


def row_steps(channels: int, columns: int, channel_tile: int, column_tile: int, vectors: int) -> float:
    """Cycles per reduction step of an output row's tiles, as the micro-kernel is bound: :data:`FMA_PIPES`
    vector multiply-adds a cycle, one weight vector or two broadcasts loaded a cycle, and at least the
    multiply-add's latency (a narrow tail tile waits on its few accumulators), plus
    :data:`LATENCY_BOUND_CYCLES` where the accumulators only just cover that latency. Fitted to one thread
    on Zen 4: at AVX2 a 7-column row ran 2 x 4 + 3 in 1120 us, 1 x 7 in 1168 us, 2 x 6 + 1 in 1312 us; a
    14-column row 2 x 6 + 2 in 1063 us, 4 x 2 in 1235 us."""

    def tile(width: int) -> float:
        accumulators = channel_tile * width * vectors
        bound = max(accumulators / FMA_PIPES, channel_tile * vectors + width / 2, FMA_LATENCY)
        return bound + (LATENCY_BOUND_CYCLES if accumulators <= FMA_PIPES * FMA_LATENCY else 0.0)

    tail = columns % column_tile
    per_channel_tile = columns // column_tile * tile(column_tile) + (tile(tail) if tail else 0.0)
    return channels // channel_tile * per_channel_tile


ROW_BUFFER_BYTES = 16 * 1024
"""The most bytes of accumulators a channel tile may keep across a whole run of tiles (the buffer of a run with
a narrower last tile, which the epilogue reloads): half an x86 core's 32 KiB L1 data cache."""


def _row_cycles(channels: int, columns: int, tile: tuple[int, int], vectors: int, reduction: int) -> float:
    """Cycles of one row of ``columns`` under ``tile``: its reduction's steps and, with a narrower last tile,
    what that costs per output vector (:data:`TAIL_VECTOR_CYCLES`)."""
    cycles = reduction * row_steps(channels, columns, *tile, vectors)
    return cycles + (TAIL_VECTOR_CYCLES * channels * vectors * columns if columns % tile[1] else 0.0)


def _flatten_positions(sch: s_tir.Schedule, main, epilogue, width: int) -> None:
    """The output's rows and columns become one run of positions ``p = oh * width + ow``, tiled across the rows.
    A tile's input addresses (row ``p // W`` times the stride plus the kernel's row, column ``p % W`` likewise) do
    not change along the reduction, so they are computed once per tile (at 1x1 and stride 1,
    ``(p // W) * W + p % W`` simplifies to ``p``). The accumulators and the epilogue take the same run, so that the
    epilogue computed at a tile of positions covers exactly that tile (over rows and columns it covered the whole
    rows the tile crossed, and read accumulators that other tiles held)."""
    sch.transform_block_layout(main, lambda b, oc, oh, ow, o, ic, kh, kw, i: (b, oc, oh * width + ow, o, ic, kh, kw, i))
    sch.transform_layout(main, ("write", 0), lambda b, oc, oh, ow, o: (b, oc, oh * width + ow, o))
    sch.transform_block_layout(epilogue, lambda b, oc, oh, ow, o: (b, oc, oh * width + ow, o))


def _flattens(
    channels: int,
    rows: int,
    columns: int,
    row_tile: tuple[int, int],
    flat_tile: tuple[int, int],
    vectors: int,
    reduction: int,
    spec: CpuSpec,
) -> bool:
    """Whether a convolution should tile its positions across rows: where a row is too narrow for a
    tile that covers the multiply-add's latency (7 columns at AVX2: 2 x 4 and 2 x 3), the whole map is one run
    (49 positions: nine 2 x 5 tiles and a 2 x 4), if its accumulators fit :data:`ROW_BUFFER_BYTES` and its
    channel tile holds more than one weight vector. With one (29 or 5 channel blocks, or 125: no wider tile divides
    them) a broadcast per multiply-add bounds the tile either way, and the run's tiles ran 1 to 12 % slower (one
    thread, AVX2: ShuffleNetV2's 1x1 convolutions at 14x14 and 7x7, MobileNetV3-small's at 14x14)."""
    positions = rows * columns
    if (
        rows == 1
        or flat_tile[0] * vectors == 1
        or flat_tile[0] * vectors * spec.lanes * 4 * positions > ROW_BUFFER_BYTES
    ):
        return False
    flat = _row_cycles(channels, positions, flat_tile, vectors, reduction)
    return flat < rows * _row_cycles(channels, columns, row_tile, vectors, reduction)


L2_BYTES = 1 << 20
"""A core's L2 cache as the task order counts it: 1 MiB, the smallest of the x86 cores the blocked layout is built
for since Zen 4 and Ice Lake (Intel's server cores have 2 MiB). A tensor that fits is reread from there; one that does
not comes again from L3 or memory on every pass."""


def _weights_first(block: s_tir.SBlock, rows: int) -> bool:
    """Whether tasks should run channel tiles outermost (each rereads all inputs) rather than rows
    (each rereads all weights): whichever rereads fewer bytes. Where one of the two fits :data:`L2_BYTES` and the
    other does not, only the rereads from beyond L2 count: ResNet-50's 1024 -> 2048 stride-2 shortcut (8 MiB of
    weights, 784 KiB of input, 7 output rows) read its weights 7 times a call by rows, 623 us, and its input once per
    channel tile from L2 by channel tiles, 523 us (``scripts/time_blocked_conv.py 1024x14x14:2048:1s2``: the weights
    from memory, as a network's come, the input warm; 2 threads, Zen 5); the 512 -> 2048 1x1 at 7x7 318 -> 275 us."""
    data, weights = (next(r.source for r in block.reads if len(r.source.shape) == rank) for rank in (5, 6))
    data_bytes, weight_bytes = (_nbytes(buffer) for buffer in (data, weights))
    channel_blocks = constant(weights.shape[0])
    if (weight_bytes > L2_BYTES) != (data_bytes > L2_BYTES):
        return weight_bytes > L2_BYTES and rows > 1
    return rows * weight_bytes > channel_blocks * data_bytes


def _nbytes(buffer) -> int:
    nbytes = buffer.dtype.bits // 8
    for dim in buffer.shape:
        nbytes *= constant(dim)
    return nbytes
