"""The int8 convolutions on a Cortex-M with the DSP extension: one call of a C micro-kernel per output
pixel and block of 4 output channels, which runs the whole input-channel reduction on ``SMLAD``.

The C target has no vector types, and a call per 4x4 step leaves the accumulators in memory. So the
intrinsic covers the channel loop of :func:`tvm_memplan.quant.dot_kernels.conv2d_dot` (``rc``: 4 input
channels per step, the packed input and the weights each at a stride of their own), and the
micro-kernel (:data:`tvm_memplan.deploy.mcu_dsp.MICRO_KERNELS`) keeps the 4 accumulators in
registers over it, as CMSIS-NN's and TinyEngine's hand-written inner loops do. The window's taps
(``ry``, ``rx``) call it once each; the requantizing epilogue follows each output pixel.

A convolution of one channel step (the stem's 3 input channels) is not lowered in this layout
(:mod:`tvm_memplan.quant.lower`): a micro-kernel call per window tap gained nothing there (the stem
of MobileNetV2-0.35 @ 144 on the emulated M7: 9.67M instructions, 9.74M as a plain conv). It runs
the im2col C kernel of :mod:`tvm_memplan.deploy.mcu_layers_c` instead (5.2M), as do the 1x1
convolutions of stride 1 and the depthwise ones, which a call per output pixel served worse than a
loop nest written for the whole layer (:mod:`tvm_memplan.quant.mcu_kernels`).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ...quant.dot_kernels import DOT_INSTRUCTIONS
from ..blocks import NotApplicable, loop_extent, top_level_blocks
from .base import CPUScheduleRule
from .spec import CpuSpec

SMLAD_MICRO_KERNELS = {1: "tvm_memplan_dot_4x4_smlad", 2: "tvm_memplan_dot_2x4x4_smlad"}
"""The C functions the intrinsic calls, by output pixels per call: ``(acc, x, x_stride, w, w_stride,
steps)``, and for 2 pixels ``(acc, acc_stride, x, x_stride, w, w_stride, steps)`` (the second pixel's
input 4 bytes after the first's: convolutions of stride 1)."""
SMLAD_MICRO_KERNEL = SMLAD_MICRO_KERNELS[1]


def _intrinsic(steps: int, pixels: int, call: bool) -> tirx.PrimFunc:
    """``steps`` reduction steps of ``pixels`` x 4 lanes x 4 bytes: what they compute (``call`` False,
    the tensorize description) or the micro-kernel call (True, the implementation). The packed input
    and the weights keep their window axes (extent 1) so that their regions match the kernel's."""

    @T.prim_func(s_tir=True)
    def intrinsic(a: T.handle, b: T.handle, c: T.handle) -> None:
        x_stride, row = T.int32(), T.int32()
        w_stride, tap_row, tap, acc_stride = T.int32(), T.int32(), T.int32(), T.int32()
        A = T.match_buffer(a, (steps, 1, pixels, 4), "int8", strides=[x_stride, row, 4, 1], offset_factor=1)
        B = T.match_buffer(b, (steps, 1, 1, 4, 4), "int8", strides=[w_stride, tap_row, tap, 4, 1], offset_factor=1)
        C = T.match_buffer(c, (pixels, 4), "int32", strides=[acc_stride, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:pixels, 0:4], A[0:steps, 0:1, 0:pixels, 0:4], B[0:steps, 0:1, 0:1, 0:4, 0:4])
            T.writes(C[0:pixels, 0:4])
            if call and pixels == 1:
                T.evaluate(
                    T.call_extern(
                        "int32",
                        SMLAD_MICRO_KERNELS[1],
                        C.access_ptr("rw"),
                        A.access_ptr("r"),
                        x_stride,
                        B.access_ptr("r"),
                        w_stride,
                        steps,
                    )
                )
            elif call:
                T.evaluate(
                    T.call_extern(
                        "int32",
                        SMLAD_MICRO_KERNELS[2],
                        C.access_ptr("rw"),
                        acc_stride,
                        A.access_ptr("r"),
                        x_stride,
                        B.access_ptr("r"),
                        w_stride,
                        steps,
                    )
                )
            elif pixels == 1:
                for r, i, k in T.grid(steps, 4, 4):
                    with T.sblock("update"):
                        vi, vr, vk = T.axis.remap("SRR", [i, r, k])  # the kernel block's order of iterators
                        C[0, vi] = C[0, vi] + T.Cast("int32", A[vr, 0, 0, vk]) * T.Cast("int32", B[vr, 0, 0, vi, vk])
            else:
                for r, p, i, k in T.grid(steps, pixels, 4, 4):
                    with T.sblock("update"):
                        vp, vi, vr, vk = T.axis.remap("SSRR", [p, i, r, k])
                        C[vp, vi] = C[vp, vi] + T.Cast("int32", A[vr, 0, vp, vk]) * T.Cast("int32", B[vr, 0, 0, vi, vk])

    return intrinsic


def smlad_intrinsic(steps: int, pixels: int) -> str:
    """The tensor intrinsic of ``steps`` steps and ``pixels`` output pixels, registered on first use."""
    name = f"tvm_memplan.dot_{pixels}x4x4x{steps}_i8i8i32_smlad"
    description, implementation = (_intrinsic(steps, pixels, call) for call in (False, True))
    TensorIntrin.register(name, description, implementation, override=True)
    return name


def _unit_stride(sch: s_tir.Schedule, pack: s_tir.SBlockRV, ow: s_tir.LoopRV, rx: s_tir.LoopRV) -> bool:
    """Whether output pixel ``x + 1`` reads the packed input one column after pixel ``x``: a full-width
    output, ``W_padded - (KW - 1)``, has stride 1 and dilation 1 along W (any larger one narrows it)."""
    padded_width = int(sch.get(pack).writes[0].source.shape[3])
    return loop_extent(sch, ow) == padded_width - (loop_extent(sch, rx) - 1)


class Int8Smlad(CPUScheduleRule):
    """:func:`~tvm_memplan.quant.dot_kernels.conv2d_dot` kernels in the ``dsp-smlad`` layout on a
    Cortex-M: output row, block of 4 channels, pixel; then the window; the channel loop is the
    micro-kernel's. The input is packed row by row, just before the output row that reads it: the
    scratch is the window's rows of the input, not a second copy of the whole input (as the vector
    CPUs' schedule packs it)."""

    name = "int8_smlad"

    def transform(self, sch: s_tir.Schedule, spec: CpuSpec) -> None:
        if spec.int8_dot != "dsp-smlad":
            raise NotApplicable("no DSP extension")
        blocks_by_name = {sch.get(b).name_hint: b for b in top_level_blocks(sch)}
        if set(blocks_by_name) != {"pack", "dot_acc", "requantize"}:
            raise NotApplicable("not a conv2d_dot kernel")
        pack, acc, epilogue = (blocks_by_name[name] for name in ("pack", "dot_acc", "requantize"))
        n, ob, oh, ow, lane, rc, ry, rx, rk = sch.get_loops(acc)
        packed_dtype = str(sch.get(pack).writes[0].source.dtype)
        if DOT_INSTRUCTIONS["dsp-smlad"] != (loop_extent(sch, lane), loop_extent(sch, rk), packed_dtype):
            raise NotApplicable("not in the SMLAD micro-kernel's layout")
        steps = loop_extent(sch, rc)
        if steps == 1:
            raise NotApplicable("one channel step: no channel loop for the micro-kernel")
        # two pixels a call where their inputs are 4 bytes apart: the weights' words widened once for both
        pixels = 2 if loop_extent(sch, ow) % 2 == 0 and _unit_stride(sch, pack, ow, rx) else 1
        if pixels == 2:
            ow, ow_i = sch.split(ow, [None, 2])
            sch.reorder(n, oh, ob, ow, ry, rx, rc, ow_i, lane, rk)
        else:
            sch.reorder(n, oh, ob, ow, ry, rx, rc, lane, rk)
        sch.reverse_compute_at(epilogue, ow)
        sch.compute_at(pack, oh)
        sch.decompose_reduction(acc, ry)
        sch.tensorize(rc, smlad_intrinsic(steps, pixels))
