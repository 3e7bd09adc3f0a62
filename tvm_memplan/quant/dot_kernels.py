"""Integer kernels in the operand layouts of CPUs with an int8 dot-product instruction (AVX-512 VNNI,
AVX2, Armv8.2 sdot, a Cortex-M's SMLAD) and their integer-vector depthwise convolution: the same
integers as :mod:`.kernels` (onnxruntime's requantization), laid out for the schedules in
:mod:`tvm_memplan.schedule.cpu` (``int8_dot``, ``int8_depthwise``, ``int8_smlad``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from tvm import te, tirx

from .kernels import (
    ConvOptions,
    KernelOutput,
    apply_epilogue,
    check_keywords,
    conv_geometry,
    output_code,
    pad_codes,
    quantize_value,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

DEPTHWISE_ROUND = 16
""":func:`depthwise_conv2d` computes a multiple of this many outputs per channel (the int32 lanes of
an AVX-512 vector; a multiple of AVX2's and NEON's), so its vector loop has no tail."""


def depthwise_conv2d(
    x: te.Tensor,
    weight: te.Tensor,
    bias: te.Tensor,
    multiplier: te.Tensor,
    **options: Unpack[ConvOptions],
) -> te.Tensor:
    """QLinearConv with one input channel per output channel (depthwise), in integers: int8/uint8
    codes times int8 weights (``(C, 1, KH, KW)``), each product exact in 16 bits and summed in
    int32, then :func:`.kernels.conv2d`'s requantization: the result equals :func:`.kernels.conv2d`'s bit for bit.
    ``bias`` holds the folded zero point (:func:`.kernels.fold_zero_point`).

    The input is padded with the zero point (``pad``) and, at a stride above 1, staged as its
    stride x stride polyphase components (``stage``: ``(N, C, S, S, rows, cols)``), so each tap of
    every output reads one component at a constant offset. The products are summed
    over a flattened grid of ``OH x cols`` outputs (``dw_acc``; the columns past the output width
    are computed and dropped, rounded up to :data:`DEPTHWISE_ROUND`) and requantized there
    (``dw_requantize``, with a consumer's ``table``): one long contiguous vector axis whatever the
    width, without strided loads or tails. ``dw_output`` crops the grid to the output (and adds a
    ``residual``). The schedule flattens the stage's rows and columns
    (:mod:`tvm_memplan.schedule.cpu.int8_depthwise`)."""
    check_keywords("depthwise_conv2d", options, ConvOptions)
    n, c, h, w = (int(d) for d in x.shape)
    o, _one, kh, kw = (int(d) for d in weight.shape)
    (sh, sw), (dh, dw), (top, left, bottom, right), (oh, ow) = conv_geometry(x, kh, kw, options)
    cols = -(-(w + left + right) // sw)
    grid = -(-(oh * cols) // DEPTHWISE_ROUND) * DEPTHWISE_ROUND
    reach = ((kh - 1) * dh // sh) * cols + (kw - 1) * dw // sw
    rows = -(-(grid + reach) // cols)
    padding = (top, left, max(rows * sh - h - top, 0), cols * sw - w - left)
    padded = pad_codes(x, padding, options["x_zero_point"], options.get("quantize_input"))
    if padded is x:  # nothing to pad: a copy, which the schedule places per channel
        padded = te.compute(x.shape, lambda *i: x[i], name="pad")
    if (sh, sw) == (1, 1):
        staged = padded
    else:
        staged = te.compute(
            (n, c, sh, sw, rows, cols),
            lambda b, ch, phase_y, phase_x, row, col: padded[b, ch, row * sh + phase_y, col * sw + phase_x],
            name="stage",
        )
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def accumulate(b, ch, p):
        flat = p + (ry * dh // sh) * cols + rx * dw // sw
        phases = [] if (sh, sw) == (1, 1) else [ry * dh % sh, rx * dw % sw]
        code = staged[(b, ch, *phases, flat // cols, flat % cols)]
        # |code x weight| <= 255 x 128 fits int16: a widening 16 x 16 -> 32-bit multiply-add
        product = code.astype("int16").astype("int32") * weight[ch, 0, ry, rx].astype("int16").astype("int32")
        return te.sum(product, axis=[ry, rx])

    acc = te.compute((n, o, grid), accumulate, name="dw_acc")
    table_only = {**options, "residual": None}
    codes = te.compute(
        acc.shape,
        lambda b, ch, p: output_code(acc[b, ch, p] + bias[ch], multiplier[ch], (), table_only),
        name="dw_requantize",
    )
    return te.compute(
        (n, o, oh, ow),
        lambda b, ch, y, xx: _residual_add(codes[b, ch, y * cols + xx], (b, ch, y, xx), options),
        name="dw_output",
    )


def _residual_add(code: tirx.PrimExpr, index: tuple, output: KernelOutput) -> tirx.PrimExpr:
    """``code`` plus ``output``'s residual at ``index`` (an output view's epilogue)."""
    return apply_epilogue(None, code, output["out_dtype"], output.get("residual"), output.get("residual_add"), index)


class DotInstruction(NamedTuple):
    """A CPU's int8 dot-product instruction, as :func:`conv2d_dot` lays its operands out."""

    lanes: int
    """int32 accumulators of one instruction (output channels)."""
    depth: int
    """Products each lane adds per instruction (input channels)."""
    packed_dtype: str
    """The type the input is packed to (the weights are int8)."""


DOT_INSTRUCTIONS = {
    "avx512vnni": DotInstruction(16, 4, "uint8"),  # vpdpbusd: uint8 x int8
    "avx2": DotInstruction(8, 2, "uint8"),  # vpmaddwd on bytes widened exactly to int16
    "neon-dotprod": DotInstruction(4, 4, "int8"),  # sdot: int8 x int8 (Armv8.2 dot product)
    "dsp-smlad": DotInstruction(4, 4, "int8"),  # Cortex-M DSP: SXTB16-widened pairs into SMLAD, in C
}
"""The instructions :func:`conv2d_dot` kernels are tensorized with, by :class:`CpuSpec` ``int8_dot`` name."""


def pack_dot_weights(weight: np.ndarray, lanes: int, depth: int) -> np.ndarray:
    """OIHW int8 weights as ``(O/lanes, C/depth, KH, KW, lanes, depth)``, zero-padded: the operand
    layout of :func:`conv2d_dot`'s innermost block, one contiguous vector per instruction (the
    weight packing of oneDNN's and MLAS's int8 convolutions, done once at compile time)."""
    o, c, kh, kw = weight.shape
    blocks, steps = -(-o // lanes), -(-c // depth)
    padded = np.zeros((blocks * lanes, steps * depth, kh, kw), np.int8)
    padded[:o, :c] = weight
    return np.ascontiguousarray(padded.reshape(blocks, lanes, steps, depth, kh, kw).transpose(0, 2, 4, 5, 1, 3))


def dot_zero_point(x_zero_point: int, x_dtype: str, packed_dtype: str) -> int:
    """The input zero point :func:`conv2d_dot` computes with: an input moved to the instruction's
    signedness (int8 to uint8: +128; uint8 to int8: -128, exact) moves its zero point with it."""
    return x_zero_point + _dot_shift(x_dtype, packed_dtype)


def _dot_shift(x_dtype: str, packed_dtype: str) -> int:
    return {("int8", "uint8"): 128, ("uint8", "int8"): -128}.get((x_dtype, packed_dtype), 0)


def conv2d_dot(
    x: te.Tensor,
    weight: te.Tensor,
    bias: te.Tensor,
    multiplier: te.Tensor,
    *,
    out_channels: int,
    packed_dtype: str = "uint8",
    **options: Unpack[ConvOptions],
) -> te.Tensor:
    """QLinearConv (groups 1) in the shape of a CPU's int8 dot-product instruction
    (:data:`DOT_INSTRUCTIONS`): the result equals :func:`.kernels.conv2d`'s bit for bit.

    ``weight`` is :func:`pack_dot_weights`'s layout, whose last two axes give the instruction's
    lanes and depth; ``x`` (NCHW int8/uint8) is padded and packed in the kernel to ``packed_dtype``
    ``(N, C/depth, H, W, depth)`` (moved by ±128 where the types differ: :func:`dot_zero_point`); ``bias`` holds
    ``bias - dot_zero_point * sum(weight[o])`` (:func:`.kernels.fold_zero_point`). The reduction ``dot_acc``
    accumulates ``lanes`` output channels x ``depth`` input channels per step in int32; the schedule
    tensorizes that block (:mod:`tvm_memplan.schedule.cpu.int8_dot`). The output is NCHW, like
    every other kernel's. ``quantize_input`` (scale, type): ``x`` is the float32 network input,
    quantized as it is packed (see :func:`.kernels.conv2d`)."""
    check_keywords("conv2d_dot", options, ConvOptions)
    n, c, h, w = (int(d) for d in x.shape)
    blocks, steps, kh, kw, lanes, depth = (int(d) for d in weight.shape)
    (sh, sw), (dh, dw), (top, left, bottom, right), (oh, ow) = conv_geometry(x, kh, kw, options)
    x_zero_point, quantize_input = options["x_zero_point"], options.get("quantize_input")
    x_dtype = str(x.dtype) if quantize_input is None else quantize_input[1]
    zero = dot_zero_point(x_zero_point, x_dtype, packed_dtype)
    shift = _dot_shift(x_dtype, packed_dtype)

    def pack(b, c4, y, xx, k):
        ch = c4 * depth + k
        inside = tirx.all(y >= top, y < top + h, xx >= left, xx < left + w, ch < c)
        code = x[b, tirx.min(ch, c - 1), y - top, xx - left]
        if quantize_input is not None:
            code = quantize_value(code, quantize_input[0], x_zero_point, x_dtype)
        moved = (code.astype("int32") + shift).astype(packed_dtype)
        return tirx.if_then_else(inside, moved, tirx.const(zero, packed_dtype))

    packed = te.compute((n, steps, h + top + bottom, w + left + right, depth), pack, name="pack")
    rc = te.reduce_axis((0, steps), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    rk = te.reduce_axis((0, depth), name="rk")
    acc = te.compute(
        (n, blocks, oh, ow, lanes),
        lambda b, ob, y, xx, lane: te.sum(
            packed[b, rc, y * sh + ry * dh, xx * sw + rx * dw, rk].astype("int32")
            * weight[ob, rc, ry, rx, lane, rk].astype("int32"),
            axis=[rc, ry, rx, rk],
        ),
        name="dot_acc",
    )

    def epilogue(b, oc, y, xx):
        value = acc[b, oc // lanes, y, xx, oc % lanes] + bias[oc]
        return output_code(value, multiplier[oc], (b, oc, y, xx), options)

    return te.compute((n, out_channels, oh, ow), epilogue, name="requantize")


def dense_dot(
    x: te.Tensor,
    weight: te.Tensor,
    bias: te.Tensor,
    multiplier: te.Tensor,
    *,
    out_channels: int,
    x_zero_point: int,
    packed_dtype: str = "uint8",
    **output: Unpack[KernelOutput],
) -> te.Tensor:
    """QGemm/QLinearMatMul of a 2-d ``x`` (M, K) on a dot-product instruction: :func:`conv2d_dot`
    of ``x`` viewed as an ``(1, K, M, 1)`` image (rows are its pixels) and the weights as 1x1
    filters (:func:`pack_dot_weights` of ``(N, K, 1, 1)``), its output viewed as ``(M, N)`` (where a
    ``residual`` is added); the schedule inlines both views. ``bias`` is folded as for :func:`conv2d_dot`."""
    check_keywords("dense_dot", output, KernelOutput)
    rows, depth = (int(d) for d in x.shape)
    image = te.compute((1, depth, rows, 1), lambda b, k, m, one: x[m, k], name="as_image")
    pointwise = {"strides": [1, 1], "padding": [0, 0, 0, 0], "dilation": [1, 1], "x_zero_point": x_zero_point}
    requantized = {**output, "residual": None, "residual_add": None}
    out = conv2d_dot(
        image,
        weight,
        bias,
        multiplier,
        out_channels=out_channels,
        packed_dtype=packed_dtype,
        **pointwise,
        **requantized,
    )
    return te.compute(
        (rows, out_channels), lambda m, n: _residual_add(out[0, n, m, 0], (m, n), output), name="as_matrix"
    )
