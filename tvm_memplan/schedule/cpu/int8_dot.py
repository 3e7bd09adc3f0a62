"""The int8 convolutions lowered in a dot-product instruction's layout
(:func:`tvm_memplan.quant.dot_kernels.conv2d_dot`), tensorized with AVX-512 VNNI's ``vpdpbusd`` (16 lanes
x 4 bytes), AVX2's ``vpmaddwd`` on widened bytes (8 lanes x 2) or Armv8.2's ``sdot`` (4 lanes x 4);
on a Cortex-M with the DSP extension, with a C micro-kernel on ``SMLAD`` (:mod:`.int8_smlad`).

As in oneDNN's and MLAS's int8 convolutions, a register tile of ``blocks x pixels`` accumulators
(one int32 vector each) stays in registers over the whole reduction: each step loads one weight
vector per channel block and broadcasts the input bytes of each pixel. The requantizing epilogue
runs per tile, vectorized over the channels of the tile's accumulators. The packed input is built
once per call, in parallel over its rows. On a target without the instruction the kernel was
lowered for, the lanes are vectorized as int32 arithmetic (same result).
"""

from __future__ import annotations

import functools

from tvm import s_tir, tirx
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ...quant.dot_kernels import DOT_INSTRUCTIONS
from ..blocks import NotApplicable, loop_extent, top_level_blocks
from .base import CPUScheduleRule, fuse_parallel
from .spec import CpuSpec

ACC_BLOCK = "dot_acc"


@functools.cache  # TVMScript parsing costs tens of ms a call (its inspect.stack); asked again and again
def _dot_prim_func(isa: str, llvm_intrinsic: str | None = None) -> tirx.PrimFunc:
    """What the dot-product instruction ``isa`` of :data:`DOT_INSTRUCTIONS` computes (``llvm_intrinsic``
    None: ``lanes`` int32 lanes, each adding ``depth`` products of a ``packed_dtype`` input and int8
    weights, the description tensorize matches), else its implementation by ``llvm_intrinsic``.
    Written here because importing ``tvm.s_tir.tensor_intrin`` registers every backend's intrinsics
    (~20 s); the Python ``if``s below choose the body when the function is parsed."""
    lanes, depth, packed_dtype = DOT_INSTRUCTIONS[isa]
    packed_input, weight_vector, accumulators = f"{packed_dtype}x{depth}", f"int8x{lanes * depth}", f"int32x{lanes}"
    # vpmaddwd multiplies int16 pairs: the bytes are widened first (exact) and the sum added to C
    widened = isa == "avx2"
    pairs = f"int16x{depth}"
    widened_weights = f"int16x{lanes * depth}"

    @T.prim_func(s_tir=True)
    def dot(
        A: T.Buffer((depth,), packed_dtype, offset_factor=1),
        B: T.Buffer((lanes, depth), "int8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:depth], B[0:lanes, 0:depth])
            T.writes(C[0:lanes])
            if llvm_intrinsic is None:
                for i, k in T.grid(lanes, depth):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.Cast("int32", A[vk]) * T.Cast("int32", B[vi, vk])
            elif widened:
                A_i32 = T.reinterpret(T.Cast(pairs, A.vload([0], packed_input)), dtype="int32")
                C[T.ramp(T.int32(0), 1, lanes)] = C.vload([0], dtype=accumulators) + T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(llvm_intrinsic),
                    T.Cast(widened_weights, B.vload([0, 0], dtype=weight_vector)),
                    T.reinterpret(T.broadcast(A_i32, lanes), dtype=widened_weights),
                    dtype=accumulators,
                )
            else:
                A_i32 = T.reinterpret(A.vload([0], packed_input), dtype="int32")
                C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(llvm_intrinsic),
                    C.vload([0], dtype=accumulators),
                    T.reinterpret(T.broadcast(A_i32, lanes), dtype=f"{packed_dtype}x{lanes * depth}"),
                    B.vload([0, 0], dtype=weight_vector),
                    dtype=accumulators,
                )

    return dot


# TVM 0.27's own "dot_16x4_vnni" passes <16 x i32> operands, which LLVM 22's vpdpbusd (<64 x i8>
# operands) rejects; AVX2's vpmaddwd on bytes widened to int16 is MLAS's exact AVX2 path; Armv8.2's
# sdot adds 4 int8 x int8 products into each of 4 int32 lanes.
INTRINSICS = {
    "avx512vnni": ("tvm_memplan.dot_16x4_u8i8i32_vnni", "llvm.x86.avx512.vpdpbusd.512"),
    "avx2": ("tvm_memplan.dot_8x2_u8i8i32_avx2", "llvm.x86.avx2.pmadd.wd"),
    "neon-dotprod": ("tvm_memplan.dot_4x4_i8i8i32_sdot", "llvm.aarch64.neon.sdot.v4i32.v16i8"),
}
"""Instruction (a :class:`~tvm_memplan.schedule.cpu.CpuSpec` ``int8_dot``) → (registered tensor intrinsic,
the LLVM intrinsic it calls)."""


@functools.cache
def _registered(isa: str) -> str:
    """The tensor intrinsic of ``isa`` (a key of :data:`INTRINSICS`; "dsp-smlad" is :mod:`.int8_smlad`, a
    rule of its own), registered on first use: parsing its TVMScript costs ~0.3 s, which every compile
    would otherwise pay at import, float models included."""
    name, llvm_intrinsic = INTRINSICS[isa]
    TensorIntrin.register(name, _dot_prim_func(isa), _dot_prim_func(isa, llvm_intrinsic), override=True)
    return name


class Int8DotProduct(CPUScheduleRule):
    """:func:`~tvm_memplan.quant.dot_kernels.conv2d_dot` kernels: register-tiled, tensorized with the
    target's dot-product instruction when the kernel is in its layout (else its lanes are vectorized
    as int32 arithmetic)."""

    name = "int8_dot"

    def transform(self, sch: s_tir.Schedule, spec: CpuSpec) -> None:
        blocks = top_level_blocks(sch)
        names = [sch.get(b).name_hint for b in blocks]
        if not {"pack", ACC_BLOCK, "requantize"} <= set(names) or names.index("requantize") < names.index("pack"):
            raise NotApplicable("not a conv2d_dot kernel")
        # views and elementwise ops around the kernel (dense_dot's reshapes, a fused dequantize)
        for producer in blocks[: names.index("pack")]:
            sch.compute_inline(producer)
        for consumer in blocks[names.index("requantize") + 1 :]:
            sch.reverse_compute_inline(consumer)
        blocks_by_name = dict(zip(names, blocks, strict=True))
        pack, acc, epilogue = (blocks_by_name[name] for name in ("pack", ACC_BLOCK, "requantize"))
        out_channels = int(sch.get(epilogue).iter_vars[1].dom.extent)
        n, ob, oh, ow, lane, rc, ry, rx, rk = sch.get_loops(acc)
        blocks, width = loop_extent(sch, ob), loop_extent(sch, ow)
        tile_blocks, tile_pixels = _register_tile(blocks, width, spec.accumulators - 4)
        ob_o, ob_i = sch.split(ob, [None, tile_blocks])
        ow_o, ow_i = sch.split(ow, [None, tile_pixels])
        lanes, depth = loop_extent(sch, lane), loop_extent(sch, rk)
        packed_dtype = str(sch.get(pack).writes[0].source.dtype)
        tensorized = spec.int8_dot in INTRINSICS and DOT_INSTRUCTIONS[spec.int8_dot] == (lanes, depth, packed_dtype)
        inner = (lane, rk) if tensorized else (rk, lane)
        sch.reorder(n, ob_o, oh, ow_o, rc, ry, rx, ob_i, ow_i, *inner)
        sch.reverse_compute_at(epilogue, ow_o)
        work = 1
        for loop in (n, ob_o, oh, ow_o, rc, ry, rx, ob_i, ow_i):
            work *= loop_extent(sch, loop)
        fuse_parallel(sch, [n, ob_o, oh], work * 64, spec)
        if not tensorized and spec.vector_codegen:
            sch.vectorize(lane)
        init = sch.decompose_reduction(acc, rc)
        if tensorized:
            sch.tensorize(lane, _registered(spec.int8_dot))
        sch.unroll(ow_i)
        sch.unroll(ob_i)
        if spec.vector_codegen:
            sch.vectorize(sch.get_loops(init)[-1])
        tile_loop = sch.get(ow_o)
        loops = sch.get_loops(epilogue)
        own = loops[[sch.get(loop).same_as(tile_loop) for loop in loops].index(True) + 1 :]
        outer, inner = sch.split(own[0], [None, lanes])  # channels; pixels follow unless the tile has one
        sch.reorder(outer, *own[1:], inner)
        if spec.vector_codegen and out_channels % lanes == 0:
            sch.vectorize(inner)
        pack_loops = sch.get_loops(pack)
        fuse_parallel(sch, pack_loops[:3], work * 64, spec)
        if sch.can_decompose_padding(pack, pack_loops[3]):
            # a fill of the border plus a copy without bounds checks (the stem's float input is
            # quantized in that copy, no longer behind a bounds check per element)
            sch.decompose_padding(pack, pack_loops[3])


def _register_tile(blocks: int, width: int, budget: int) -> tuple[int, int]:
    """Channel blocks and pixels of a row held as accumulators: the largest tile within ``budget``
    registers whose sides divide the output (1 or 2 channel blocks of the instruction's lanes; the
    pixels of a prime width such as SqueezeNet's 13 are one tile of one block)."""
    best = (1, 1)
    for tile_blocks in (2, 1):
        if blocks % tile_blocks:
            continue
        pixels = max(d for d in range(1, budget // tile_blocks + 1) if width % d == 0)
        if tile_blocks * pixels > best[0] * best[1]:
            best = (tile_blocks, pixels)
    return best
