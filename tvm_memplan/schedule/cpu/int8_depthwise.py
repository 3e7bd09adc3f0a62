"""The int8 depthwise convolution (:func:`tvm_memplan.quant.dot_kernels.depthwise_conv2d`) on the CPU's
integer vectors.

Each task is one channel (tasks run in parallel where the kernel is big enough). Its input is
staged first: padded (a fill with the zero point, then a copy without bounds checks) and, at stride
2, split into even and odd columns by a tensorized pair of shuffles per row (``ld2`` on Arm), so
that every later load is contiguous; the staged rows are stored flat. The products are then summed
over the flattened output grid in register tiles of a few vectors: each tap loads one contiguous
vector per accumulator at a constant offset, widens the codes and multiplies them by the tap's
broadcast weight into int32 (``vpmulld`` on x86, ``smlal`` on Arm), the tile's accumulators stay in
registers over all taps and are requantized there (a register-tiled stencil, as XNNPACK's depthwise
micro-kernels are, here along the flattened rows rather than the channels). A last loop copies each
output row out of the grid, dropping its padding columns.
"""

from __future__ import annotations

import functools

from tvm import s_tir, tirx
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ..blocks import NotApplicable, loop_extent, top_level_blocks
from .base import CPUScheduleRule, fuse_parallel, product, vectorize
from .spec import CpuSpec
from .tiled_reduction import LOAD_BOUND_FACTOR, vector_parts, vectorize_parts

ACC_BLOCK = "dw_acc"

TILE_VECTORS = 4
"""Most vectors of int32 accumulators in a register tile (the largest count up to this that divides
the grid): several independent vectors keep a tap's loads and multiplies in flight."""


class Int8Depthwise(CPUScheduleRule):
    """:func:`~tvm_memplan.quant.dot_kernels.depthwise_conv2d` kernels, as the module docstring describes."""

    name = "int8_depthwise"

    def transform(self, sch: s_tir.Schedule, spec: CpuSpec) -> None:
        blocks = top_level_blocks(sch)
        names = [sch.get(b).name_hint for b in blocks]
        if not {ACC_BLOCK, "dw_requantize", "dw_output"} <= set(names):
            raise NotApplicable("not a depthwise_conv2d kernel")
        position = names.index("dw_output")
        for consumer in blocks[position + 1 :]:  # fused elementwise consumers (a dequantize): into the output
            sch.reverse_compute_inline(consumer)
        staging = [name for name in ("pad", "quantize", "stage") if name in names]
        for name, producer in zip(names, blocks[:position], strict=False):
            if name not in (*staging, ACC_BLOCK, "dw_requantize"):
                sch.compute_inline(producer)
        blocks_by_name = dict(zip(names, blocks, strict=True))
        acc, epilogue, output = (blocks_by_name[name] for name in (ACC_BLOCK, "dw_requantize", "dw_output"))
        n, channel, flat = sch.get_loops(epilogue)
        grid = loop_extent(sch, flat)
        channels = product(sch, [n, channel])
        task = sch.fuse(n, channel)
        tile_outer, tile_vectors, tile_lanes = sch.split(flat, [None, _tile_vectors(grid, spec), spec.lanes])
        sch.unroll(tile_vectors)
        vectorize(sch, tile_lanes, spec)
        sch.compute_at(acc, tile_outer)
        # the tile's accumulators: a "global" buffer this small is a stack array, which LLVM keeps in
        # registers; a "local" one became workspace memory, stored and reloaded each tile (a store-
        # forwarding stall that took a third of a 96-channel 18x18 kernel's time)
        sch.set_scope(acc, 0, "global")
        *_, lanes, ry, rx = sch.get_loops(acc)
        vectors, lanes = sch.split(lanes, [None, spec.lanes])
        sch.reorder(ry, rx, vectors, lanes)
        for loop in (ry, rx, vectors):
            sch.unroll(loop)
        vectorize(sch, lanes, spec)
        taps = loop_extent(sch, ry) * loop_extent(sch, rx)
        fuse_parallel(sch, [task], grid * taps * LOAD_BOUND_FACTOR * channels, spec)  # before the init exists
        init = sch.decompose_reduction(acc, ry)
        vectorize(sch, sch.get_loops(init)[-1], spec)

        # per channel: the input padded (a fill with the zero point, then a copy without bounds
        # checks), de-interleaved at a stride (the stage), the staged rows stored flat, so that a
        # tap's index is the output's plus a constant
        for name in reversed(staging):
            sch.compute_at(blocks_by_name[name], task)
        staged = blocks_by_name[staging[-1]]
        shape = sch.get(staged).writes[0].source.shape
        cols = int(shape[-1])
        flatten = tirx.IndexMap.from_func(
            lambda *i: (*i[:-2], i[-2] * cols + i[-1]), ndim=len(shape), index_dtype="int32"
        )
        sch.transform_layout(staged, ("write", 0), flatten)
        copies = [blocks_by_name[name] for name in staging]
        pad = copies[0]
        first = sch.get_loops(pad)[1]
        if sch.can_decompose_padding(pad, first):
            copies.insert(0, sch.decompose_padding(pad, first))
        byte_lanes = 4 * spec.lanes
        if "stage" in blocks_by_name and _deinterleave_rows(sch, blocks_by_name["stage"], spec):
            copies.remove(blocks_by_name["stage"])
        for copy in copies:  # vectors of bytes, a power of two wide each
            innermost = sch.get_loops(copy)[-1]
            vectorize_parts(sch, innermost, vector_parts(loop_extent(sch, innermost), byte_lanes)[1], spec, byte_lanes)

        # the output reads the grid at y * cols + x, which compute_at cannot invert: a loop of its own
        *rows, width = sch.get_loops(output)
        fuse_parallel(sch, rows, product(sch, [*rows, width]), spec)
        vectorize_parts(sch, width, vector_parts(loop_extent(sch, width), byte_lanes)[1], spec, byte_lanes)


def _tile_vectors(grid: int, spec: CpuSpec) -> int:
    """Vectors of int32 accumulators in one register tile: up to :data:`TILE_VECTORS` that divide
    the grid (a multiple of :data:`DEPTHWISE_ROUND`, hence of every target's lanes)."""
    return max(v for v in range(1, TILE_VECTORS + 1) if grid % (v * spec.lanes) == 0)


def _deinterleave_rows(sch: s_tir.Schedule, stage, spec: CpuSpec) -> bool:
    """Tensorize the stride-2 stage's copy: each padded row is loaded in vectors of ``2L`` bytes and
    split into its even and odd bytes by two shuffles (LLVM: ``vpermb``/``vpmovwb`` on x86, ``uzp1``/
    ``uzp2`` on Arm), where TVM's vectorizer loads a stride-2 vector byte by byte. False where the
    stage is not a stride-2 one or its rows are narrower than 8 bytes."""
    block = sch.get(stage)
    buffer = block.writes[0].source
    if not spec.vector_codegen or int(buffer.shape[3]) != 2:
        return False
    *_, phase_x, row, col = sch.get_loops(stage)
    cols = loop_extent(sch, col)
    chunk = min(2 * spec.lanes, 1 << (cols.bit_length() - 1))
    if chunk < 8:
        return False
    sch.reorder(row, phase_x, col)
    name = f"tvm_memplan.deinterleave2_{buffer.dtype}_{cols}_{chunk}"
    TensorIntrin.register(name, *_deinterleave_intrinsic(str(buffer.dtype), cols, chunk), override=True)
    sch.tensorize(phase_x, name)
    return True


@functools.cache  # TVMScript parsing costs tens of ms a call (its inspect.stack); asked again and again
def _deinterleave_intrinsic(dtype: str, cols: int, chunk: int) -> tuple[tirx.PrimFunc, tirx.PrimFunc]:
    """``B[p, i] = A[2 i + p]`` for a row of ``cols`` outputs, and its implementation in vectors of
    ``chunk`` outputs (the last one overlaps the one before where ``chunk`` does not divide ``cols``)."""
    even = [2 * i for i in range(chunk)]
    odd = [2 * i + 1 for i in range(chunk)]
    pair = f"{dtype}x{2 * chunk}"

    def deinterleave(vectors: bool) -> tirx.PrimFunc:
        @T.prim_func(s_tir=True)
        def func(a: T.handle, b: T.handle) -> None:
            stride = T.int32()
            A = T.match_buffer(a, (2 * cols,), dtype, offset_factor=1)
            B = T.match_buffer(b, (2, cols), dtype, strides=[stride, 1], offset_factor=1)
            with T.sblock("root"):
                T.reads(A[0 : 2 * cols])
                T.writes(B[0:2, 0:cols])
                if vectors:
                    for k in range((cols + chunk - 1) // chunk):
                        start = T.min(k * chunk, cols - chunk)
                        B[0, T.ramp(start, 1, chunk)] = T.Shuffle([A.vload([2 * start], pair)], even)
                        B[1, T.ramp(start, 1, chunk)] = T.Shuffle([A.vload([2 * start], pair)], odd)
                else:
                    for p, i in T.grid(2, cols):
                        with T.sblock("update"):
                            vp, vi = T.axis.remap("SS", [p, i])
                            B[vp, vi] = A[vi * 2 + vp]

        return func

    return deinterleave(vectors=False), deinterleave(vectors=True)
