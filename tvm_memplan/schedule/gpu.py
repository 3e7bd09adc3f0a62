"""A GPU schedule for convolutions and pools: each thread computes whole output elements.

dlight's reduction rules give every output element a workgroup that reduces across its threads.
That suits long reductions (a dense layer's 1280 inputs), not a convolution window: a 3x3 depthwise
output becomes a 256-thread workgroup with 9 active threads (MobileNetV2-0.35 @ 144 ran 40x slower
on PoCL than on the CPU). :class:`ThreadPerOutput` instead maps the fused output elements onto
``blockIdx.x``/``threadIdx.x`` and keeps the reduction inside the thread, in a local accumulator:
producers (padding) are inlined, the epilogue (bias, activation, residual add) runs on the
accumulator, and where a reused operand allows it (a convolution's output channels, recognised as
in the CPU rules) each thread computes a few channels, loading the input element they share into a
register once per reduction step. Only thread bindings and local buffers: the same TIR suits OpenCL,
Vulkan and CUDA.

:class:`ThreadPerLoopNest` is the last rule: it binds what no rule before it schedules (a non-global
adaptive pool, whose windows vary with the output position, nests a block that dlight cannot
normalise), because a function left without thread bindings is host code that a GPU target cannot run.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight.base import max_threads_per_block
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

from .blocks import (
    DATA_PAR,
    REDUCE,
    NotApplicable,
    inline_into_epilogue,
    is_padding,
    iter_extents,
    iterator_loops,
    reduction_axes,
    region_uses,
    the_reduction,
    top_level_blocks,
)

THREADS = 128
"""Threads per block: a multiple of any GPU's warp or wavefront, small enough for every device."""
CHANNEL_TILES = (4, 2)
"""Output channels per thread where the input is reused across channels, largest that divides."""
UNROLL_WINDOW = 7
"""Reduction loops up to this extent (kernel windows) are unrolled."""


def _scheduled(
    rule: GPUScheduleRule,
    func: tirx.PrimFunc,
    target: tvm.target.Target,
    schedule: Callable[[s_tir.Schedule, int], None],
) -> s_tir.Schedule | None:
    """``func`` scheduled by ``schedule``, or None where it raises NotApplicable (dlight's contract);
    any other exception is a bug and propagates."""
    if not isinstance(func, tirx.PrimFunc) or not rule.is_target_available(target):
        return None
    sch = s_tir.Schedule(func)
    try:
        schedule(sch, max_threads_per_block(target))
    except NotApplicable:
        return None
    return sch


class ThreadPerOutput(GPUScheduleRule):
    """Kernels with one reduction block whose outputs outnumber its reduction length (convolutions,
    depthwise convolutions, pools): one thread per output element or channel tile. Declines the rest
    (dense layers, softmax, norms), which dlight's reduction rules schedule better."""

    def apply(self, func: tirx.PrimFunc, target: tvm.target.Target, _tunable: bool) -> s_tir.Schedule | None:
        return _scheduled(self, func, target, thread_per_output)


def thread_per_output(sch: s_tir.Schedule, max_threads: int) -> None:
    """Schedule ``sch``'s function as described in the module docstring, or raise NotApplicable."""
    blocks = top_level_blocks(sch)
    main = the_reduction(sch, blocks)
    block = sch.get(main)
    kinds = [int(iv.iter_type) for iv in block.iter_vars]
    if any(kind not in (DATA_PAR, REDUCE) for kind in kinds):
        raise NotApplicable("iterators other than spatial and reduction")
    extents = iter_extents(block)
    outputs = math.prod(e for e, k in zip(extents, kinds, strict=True) if k == DATA_PAR)
    if outputs < math.prod(e for e, k in zip(extents, kinds, strict=True) if k == REDUCE):
        raise NotApplicable("a long reduction: dlight's cross-thread reductions suit it")

    channel = _channel_axis(block, extents)
    tile = 1
    if channel is not None:
        tile = next((t for t in CHANNEL_TILES if extents[channel] % t == 0 and outputs // t >= THREADS), 1)
    # Where a thread computes several channels, the operand they share (the input) is loaded once per
    # reduction step into a register: its padding block is kept for that, other producers are inlined.
    shared = _shared_operands(block, channel) if tile > 1 else set()
    position = [sch.get(b).name_hint for b in blocks].index(block.name_hint)
    staged = []
    for producer in reversed(blocks[:position]):
        written = sch.get(producer).writes[0].source
        if is_padding(sch.get(producer)) and any(written.same_as(b) for b in shared):
            staged.append(producer)
        else:
            sch.compute_inline(producer)
    for index, read in enumerate(sch.get(main).reads):
        if any(read.source.same_as(b) for b in shared) and not any(
            sch.get(p).writes[0].source.same_as(read.source) for p in staged
        ):
            staged.append(sch.cache_read(main, index, "local"))
    consumers = blocks[position + 1 :]
    epilogue = inline_into_epilogue(sch, main, consumers, "local")
    if consumers:
        sch.set_scope(main, 0, "local")

    loops = iterator_loops(sch, main, extents)
    tile_loops = []
    if tile > 1:
        loops[channel], inner = sch.split(loops[channel], [None, tile])
        tile_loops.append(inner)
    spatial = [loop for loop, kind in zip(loops, kinds, strict=True) if kind == DATA_PAR]
    reduce = [loop for loop, kind in zip(loops, kinds, strict=True) if kind == REDUCE]
    sch.reorder(*spatial, *reduce, *tile_loops)
    fused = sch.fuse(*spatial)
    threads = min(THREADS, max_threads, int(sch.get(fused).extent))
    block_loop, thread_loop = sch.split(fused, [None, threads])
    sch.bind(block_loop, "blockIdx.x")
    sch.bind(thread_loop, "threadIdx.x")
    sch.reverse_compute_at(epilogue, thread_loop)
    for stage in staged:
        sch.set_scope(stage, 0, "local")
        sch.compute_at(stage, reduce[-1])
    if reduce:
        sch.decompose_reduction(main, reduce[0])
    for loop in [*reduce, *tile_loops]:
        if int(sch.get(loop).extent) <= UNROLL_WINDOW:
            sch.unroll(loop)


class ThreadPerLoopNest(GPUScheduleRule):
    """The last rule, for kernels every other rule declined: each top-level loop nest runs with one
    thread per iteration of its outer spatial loops, the rest of the nest (reductions, nested blocks)
    inside the thread; consumers that can run in the same thread do, their intermediates in local
    buffers. A baseline, not a tuned schedule: it only makes such functions device kernels."""

    def apply(self, func: tirx.PrimFunc, target: tvm.target.Target, _tunable: bool) -> s_tir.Schedule | None:
        return _scheduled(self, func, target, thread_per_loop_nest)


def thread_per_loop_nest(sch: s_tir.Schedule, max_threads: int) -> None:
    """Schedule ``sch``'s function as :class:`ThreadPerLoopNest` describes, or raise NotApplicable."""
    root = sch.get_sblock("root")
    blocks = list(sch.get_child_blocks(root))
    if any(sch.get(loop).thread_binding is not None for block in blocks for loop in sch.get_loops(block)):
        raise NotApplicable("already bound")
    for block in blocks[:-1]:
        try:
            sch.compute_inline(block)
        except s_tir.ScheduleError:
            pass  # a reduction or a multi-consumer producer: it gets a loop nest of its own
    groups: list[list] = []
    thread_loop = None
    for block in sch.get_child_blocks(root):
        if thread_loop is not None:
            try:
                sch.reverse_compute_at(block, thread_loop)
                groups[-1].append(block)
                continue
            except s_tir.ScheduleError:
                pass
        thread_loop = _bind_outer_spatial(sch, block, max_threads)
        groups.append([block])
    allocated = list(sch.get(root).alloc_buffers)
    for group in groups:
        inside = [region.source for b in group for region in sch.get(b).reads]
        outside = [region.source for g in groups if g is not group for b in g for region in sch.get(b).reads]
        for index, region in enumerate(sch.get(group[0]).writes):
            written = region.source
            if _among(written, allocated) and _among(written, inside) and not _among(written, outside):
                sch.set_scope(group[0], index, "local")  # produced and consumed in one thread


def _among(buffer: tirx.Buffer, buffers: list) -> bool:
    return any(buffer.same_as(b) for b in buffers)


def _bind_outer_spatial(sch: s_tir.Schedule, block, max_threads: int):
    """Fuse the outer loops that only spatial iterators use, bind them to blocks and threads, and
    return the thread loop; a nest without such loops runs in one thread."""
    loops = list(sch.get_loops(block))
    realize = sch.get(loops[-1]).body if loops else None
    if loops and not isinstance(realize, s_tir.SBlockRealize):
        raise NotApplicable("the block is not the innermost loop's body")
    spatial_vars, other_vars = set(), set()
    if realize is not None:
        for iv, value in zip(realize.block.iter_vars, realize.iter_values, strict=True):
            used = {v.name for v in tirx.analysis.undefined_vars(value, [])}
            (spatial_vars if int(iv.iter_type) == DATA_PAR else other_vars).update(used)
    outer = []
    for loop in loops:
        name = sch.get(loop).loop_var.name
        if name not in spatial_vars or name in other_vars:
            break
        outer.append(loop)
    fused = sch.fuse(*outer) if len(outer) > 1 else outer[0] if outer else sch.add_unit_loop(block)
    extent = sch.get(fused).extent
    threads = min(THREADS, max_threads, int(extent)) if isinstance(extent, tirx.IntImm) else min(THREADS, max_threads)
    block_loop, thread_loop = sch.split(fused, [None, threads])
    sch.bind(block_loop, "blockIdx.x")
    sch.bind(thread_loop, "threadIdx.x")
    return thread_loop


def _shared_operands(block: s_tir.SBlock, channel: int) -> set:
    """Buffers the block reads independently of the channel iterator (its input, not its weights)."""
    var = block.iter_vars[channel].var
    return {read.source for read in block.reads if not region_uses(read.region, var)}


def _channel_axis(block: s_tir.SBlock, extents: list[int]) -> int | None:
    """The spatial iterator a thread tiles: one operand (the input) is read along the output's last
    axis but not along it, so its loads serve every channel of the tile (the CPU rules' reuse axis)."""
    try:
        return reduction_axes(block, extents).reuse
    except NotApplicable:
        return None
