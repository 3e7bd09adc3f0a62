"""Whole int8 layers as calls of hand-written C kernels on a Cortex-M with the DSP extension.

TVM's C target has no vector types, and a depthwise convolution or a small-channel 1x1 one spends
most of its instructions on loop control, re-indexing and a requantization the compiler cannot
hoist when TVM emits it per element. So on ``dsp-smlad`` these layers are ``te.extern`` calls of C
kernels (:mod:`tvm_memplan.deploy.mcu_layers_c` holds their text), written like CMSIS-NN's
``arm_depthwise_conv_s8`` / ``arm_nn_mat_mult_kernel_s8_s16`` loops: SMLAD on pairs of taps or
input channels unpacked with SXTB16, the per-channel bias and multiplier loaded once per plane
or block, and the requantization fused per output. They compute what :func:`.kernels.conv2d`
computes, bit for bit (the same MLAS float requantization), or within 1 LSB of it with the fixed-point
requantization (``build --requantize fixed``, :func:`fits_fixed_point`); shapes they do not cover take
:func:`.kernels.conv2d` or :func:`.dot_kernels.conv2d_dot`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, te, tirx

from . import dot_kernels, kernels
from .kernels import conv_geometry

DEPTHWISE_KERNEL = "tvm_memplan_depthwise_s8"
"""``(x, w, bias, multiplier, y, planes, channels, h, w, oh, ow, kh, kw, sh, sw, top, left, x_zp,
y_zp, low, high, fixed_point, y_plane)``: NCHW int8 depthwise convolution (dilation 1) with the requantization fused
(``fixed_point``: :func:`fits_fixed_point` of the multipliers; ``y_plane``: elements between output planes,
``oh * ow`` unless it writes rows of a larger tensor)."""
POINTWISE_KERNEL = "tvm_memplan_pointwise_s8"
"""``(x, w, bias, multiplier, residual, y, cin, cout, pixels, y_zp, low, high, add, code_first, ratio_a,
ratio_b, constant, add_low, add_high, fixed_point, y_plane)``: NCHW int8 1x1 convolution of stride 1 (weights in
:func:`.dot_kernels.pack_dot_weights`'s layout) with the requantization and a residual QLinearAdd
(:func:`.kernels.add_codes`, where ``add``) fused."""
WINDOW_KERNEL = "tvm_memplan_window_s8"
"""``(x, w, bias, multiplier, y, cin, h, w, cout, oh, ow, kh, kw, sh, sw, top, left, x_zp, y_zp, low,
high, quantize, x_scale, fixed_point, y_plane)``: NCHW int8 convolution of few input channels (dilation 1) on im2col'd
windows of two pixels, with the requantization fused (``quantize``: ``x`` is float32, quantized
with ``x_scale`` and ``x_zp`` as it enters the row cache)."""
C_KERNELS = (DEPTHWISE_KERNEL, POINTWISE_KERNEL, WINDOW_KERNEL)
ROW_COPY_KERNEL = "tvm_memplan_copy_rows"
"""``(x, y, planes, n, x_plane, offset)``: ``n`` bytes of each of ``planes`` planes, from ``x + offset + p * x_plane``
to ``y + p * n``: a row band of an NCHW tensor (a split row tile's input) copied as whole rows, a word or
four (``LDM``/``STM``) at a time, where TVM's sliced copy moves a byte per loop step."""
ROW_PLACE_KERNEL = "tvm_memplan_place_rows"
"""``(x, y, planes, n, y_plane)``: ``n`` bytes of each of ``planes`` planes packed in ``x``, to ``y + p * y_plane``: the
rows a line buffer kept from the previous row tile placed at the top of the next tile's buffer, copied as
:data:`ROW_COPY_KERNEL` copies them."""
ROW_KERNELS = (ROW_COPY_KERNEL, ROW_PLACE_KERNEL)
MAX_WINDOW = 8
"""The largest window height the row caches hold."""
MAX_ROWS = 32
"""The most input rows (input channels x window height) :data:`WINDOW_KERNEL` reads per output row."""
MAX_PLANE = 2048
"""The largest padded input plane (bytes) :data:`DEPTHWISE_KERNEL` caches whole, each row copied once;
a larger one goes through the ring of window rows."""
FIXED_POINT_MULTIPLIERS = (2.0**-16, 0.5)
"""The multipliers (``[low, high)``) the fixed-point requantization takes: one ``SMMLAR`` by the multiplier
times 2^32 needs it under 0.5; from 2^-16 on, that integer (at least 2^16) keeps the products within 0.01 LSB."""
PACKED_BYTES = 4096
"""The packed input tile (bytes) :func:`dot_conv` allows a pointwise kernel when it routes a layer to it; the kernel
itself packs as many pixels as :data:`STACK_BYTES` holds beside the unpacked weights (fewer tiles, the weights
unpacked fewer times)."""
UNPACK_TILE = 6
"""The fewest pixels a pointwise tile needs for the kernel to unpack each channel pair's weights once per tile:
unpacking costs 8 instructions a step, and saves 4 a step for each pair of pixels."""
STACK_BYTES = 8192
"""The most stack a C kernel may take for its row cache, packed operands and unpacked weights; a
larger layer keeps TVM's kernel."""


def fits_fixed_point(multiplier: np.ndarray) -> bool:
    """Whether every per-channel multiplier lies in :data:`FIXED_POINT_MULTIPLIERS`: the C kernels then
    requantize with integers when built with ``TVM_MEMPLAN_FIXED_POINT`` (``build --requantize fixed``); a layer
    with any other keeps MLAS's float rounding."""
    low, high = FIXED_POINT_MULTIPLIERS
    values = np.asarray(multiplier, np.float32)
    return bool(values.size and np.all((values >= low) & (values < high)))


def conv2d(x: te.Tensor, weight: te.Tensor, bias: te.Tensor, multiplier: te.Tensor, **options: Any) -> te.Tensor:
    """:func:`.kernels.conv2d` (same arguments) as one call of :data:`DEPTHWISE_KERNEL` (a depthwise
    convolution) or :data:`WINDOW_KERNEL` (a regular one of few input channels: the stem, quantizing
    the float network input as MLAS does where ``quantize_input`` says so), where the input is int8,
    the dilation 1 and nothing is fused after it; else :func:`.kernels.conv2d` itself. ``fixed_point``:
    :func:`fits_fixed_point` of the multipliers."""
    fixed_point = int(options.pop("fixed_point", False))
    n, c, h, w = (int(d) for d in x.shape)
    o, per_group, kh, kw = (int(d) for d in weight.shape)
    quantize_input, groups = options.get("quantize_input"), options.get("groups", 1)
    codes = str(x.dtype) == "int8" if quantize_input is None else quantize_input[1] == "int8"
    fused = options.get("table") is not None or options.get("residual") is not None
    plain = not fused and list(options["dilation"]) == [1, 1] and codes and kh <= MAX_WINDOW
    row = w + 2 * kw + 8  # a row cache's row (the padding and word-read slack at most)
    depthwise = plain and groups == c == o and quantize_input is None and 2 * kh * row <= STACK_BYTES
    pairs = (per_group * kh * kw + 1) // 2
    scratch = c * kh * row + (o + 3) * (pairs + 3) * 4  # (the row cache, the weights with their records, two windows)
    window = plain and groups == 1 and n == 1 and c * kh <= MAX_ROWS and scratch <= STACK_BYTES
    if not (depthwise or window):
        return kernels.conv2d(x, weight, bias, multiplier, **options)
    geometry = conv_geometry(x, kh, kw, options)
    (sh, sw), _dilation, (top, left, _bottom, _right), (oh, ow) = geometry
    quantization = tuple(int(options[k]) for k in ("x_zero_point", "y_zero_point", "low", "high"))
    if depthwise:
        args = (n * c, c, h, w, oh, ow, kh, kw, sh, sw, top, left, *quantization, fixed_point, oh * ow)
        name = DEPTHWISE_KERNEL
    else:
        scale = float(quantize_input[0]) if quantize_input else 1.0
        args = (c, h, w, o, oh, ow, kh, kw, sh, sw, top, left, *quantization, int(quantize_input is not None), scale)
        args += (fixed_point, oh * ow)
        name = WINDOW_KERNEL
    return _extern((n, o, oh, ow), [x, weight, bias, multiplier], name, args, options["out_dtype"])


def _extern(
    shape: tuple[int, ...], inputs: list[te.Tensor], name: str, args: tuple, dtype: str, twice: bool = False
) -> te.Tensor:
    """``te.extern`` of C kernel ``name`` on the inputs' and the output's pointers (``twice``: the output's
    pointer passed twice, in a residual's place), then ``args`` (floats as float32, the rest int32). The
    block is named ``root``, as the function's only block, for the schedule rules and analyses that look
    it up."""

    def call(ins, outs):
        tensors = [*ins, *outs, *(outs if twice else [])]
        values = [tirx.const(v, "float32" if isinstance(v, float | np.floating) else "int32") for v in args]
        return tirx.call_extern("int32", name, *(buffer.data for buffer in tensors), *values)

    return te.extern(shape, inputs, call, name="root", dtype=dtype)


def dot_conv(int8_dot: str, weight_shape: Sequence[int], geometry: dict, x_dtype: str) -> Callable:
    """The kernel of a groups-1 convolution on a CPU with a dot-product instruction:
    :func:`pointwise_conv2d` for a 1x1 of stride 1 without padding on int8 codes on a Cortex-M
    (``dsp-smlad``), else :func:`.dot_kernels.conv2d_dot`."""
    _o, c, kh, kw = weight_shape
    unit = list(geometry["strides"]) == [1, 1] and not any(geometry["padding"])
    steps = -(-c // 4)  # the kernel's stack: a tile of packed pixels (4 KiB, or 2 pixels), unpacked weights
    unpacked = 16 * steps if (PACKED_BYTES // (8 * steps)) & ~1 >= UNPACK_TILE else 0
    small = max(PACKED_BYTES, 16 * steps) + unpacked <= STACK_BYTES
    pointwise = int8_dot == "dsp-smlad" and (kh, kw) == (1, 1) and unit and x_dtype == "int8" and small
    return pointwise_conv2d if pointwise else dot_kernels.conv2d_dot


def pointwise_conv2d(
    x: te.Tensor, weight: te.Tensor, bias: te.Tensor, multiplier: te.Tensor, **options: Any
) -> te.Tensor:
    """:func:`.dot_kernels.conv2d_dot` (same arguments) of a 1x1 convolution of stride 1 (``weight`` in
    :func:`.dot_kernels.pack_dot_weights`'s layout) as one call of :data:`POINTWISE_KERNEL` where
    the input is int8; a fused int8 ``residual`` add is computed there too (MLAS's formula). ``fixed_point``:
    :func:`fits_fixed_point` of the multipliers."""
    fixed_point = int(options.pop("fixed_point", False))
    n, c, h, w = (int(d) for d in x.shape)
    residual = options.get("residual")
    plain = options.get("table") is None and options.get("quantize_input") is None and str(x.dtype) == "int8"
    if not plain or n != 1 or (residual is not None and str(residual.dtype) != "int8"):
        return dot_kernels.conv2d_dot(x, weight, bias, multiplier, **options)
    add = options.get("residual_add") or {"code_first": 1, "ratio_a": 0.0, "ratio_b": 0.0, "constant": 0.0}
    cout, requantization = options["out_channels"], tuple(int(options[k]) for k in ("y_zero_point", "low", "high"))
    floats = tuple(float(add[k]) for k in ("ratio_a", "ratio_b", "constant"))
    args = (c, cout, h * w, *requantization, int(residual is not None), int(add["code_first"]), *floats)
    args += (int(add.get("low", 0)), int(add.get("high", 0)), fixed_point, h * w)
    inputs = [x, weight, bias, multiplier] + ([residual] if residual is not None else [])
    return _extern((n, cout, h, w), inputs, POINTWISE_KERNEL, args, options["out_dtype"], twice=residual is None)


CONVOLUTIONS = (conv2d, pointwise_conv2d)
DOT_CONVOLUTIONS = (dot_kernels.conv2d_dot, pointwise_conv2d)
"""What :func:`dot_conv` returns."""
"""The kernels here that take ``min_max`` (passed on where they fall back to TVM's)."""


def row_band(x: te.Tensor, begin: int, end: int) -> te.Tensor:
    """Rows ``[begin, end)`` of a batch-1 NCHW tensor of bytes as one call of :data:`ROW_COPY_KERNEL`."""
    n, c, h, w = (int(d) for d in x.shape)
    args = (n * c, (end - begin) * w, h * w, begin * w)
    return _extern((n, c, end - begin, w), [x], ROW_COPY_KERNEL, args, str(x.dtype))


def placed_rows(x: te.Tensor, rows: int) -> te.Tensor:
    """A batch-1 NCHW tensor of bytes as the first rows of a ``rows``-row tensor (the rows after them left for
    the tile's new rows) as one call of :data:`ROW_PLACE_KERNEL`."""
    n, c, kept, w = (int(d) for d in x.shape)
    return _extern((n, c, rows, w), [x], ROW_PLACE_KERNEL, (n * c, kept * w, rows * w), str(x.dtype))


def _constants(values: relax.Expr) -> list[int] | None:
    """The integers of a tuple of constants (None for anything else)."""
    fields = values.fields if isinstance(values, relax.Tuple) else None
    ok = fields is not None and all(isinstance(v, tirx.IntImm) for v in fields)
    return [int(v.value) for v in fields] if ok else None


def legalize_row_slice(builder: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``LegalizeOps``' lowering of ``strided_slice`` on a Cortex-M with the DSP extension: a slice of rows
    (axis 2, step 1) of a batch-1 NCHW int8 tensor is :func:`row_band`, anything else TVM's lowering."""
    x, axes, begin, end = call.args[:4]
    ty = x.ty
    shape = (
        [int(d) for d in ty.shape] if all(isinstance(d, tirx.IntImm) for d in getattr(ty, "shape", None) or ()) else []
    )
    strides = call.args[4] if len(call.args) > 4 else None
    values = [_constants(t) for t in (axes, begin, end)]
    unit = strides is None or set(_constants(strides) or [0]) == {1}
    if (
        len(shape) == 4
        and shape[0] == 1
        and str(ty.dtype) in ("int8", "uint8")
        and unit
        and values[0] == [2]
        and values[1] is not None
        and values[2] is not None
    ):
        first, last = values[1][0], values[2][0]
        if 0 <= first < last <= shape[2]:  # (negative or clipped bounds: TVM's lowering)
            return builder.call_te(row_band, x, first, last, primfunc_name_hint="row_band")
    return tvm.ir.Op.get("relax.strided_slice").get_attr("FLegalize")(builder, call)


def opaque_to_fusion(builder: relax.BlockBuilder, call: relax.Call) -> relax.Call:
    """``call``, with its PrimFunc marked opaque (``op_pattern`` 8) where it is one of these C kernels'
    calls: FuseOps must not fuse an epilogue into an external call."""
    kernel = builder.get()[call.args[0]]
    if is_layer_call(kernel):
        builder.update_func(call.args[0], kernel.with_attr("op_pattern", 8))
    return call


def _layer_call(func: tirx.PrimFunc) -> tvm.ir.Call | None:
    block = getattr(func.body, "block", None)
    call = getattr(getattr(block, "body", None), "value", None)
    if not isinstance(call, tvm.ir.Call) or getattr(call.op, "name", "") != "tirx.call_extern":
        return None
    return call if getattr(call.args[0], "value", None) in C_KERNELS else None


def layer_written_into_rows(func: tirx.PrimFunc, full: tirx.Buffer, offset: int) -> tirx.PrimFunc | None:
    """``func``, one of these C kernels' calls on a ``(1, C, rows, W)`` output tile, writing rows
    ``[offset, offset + rows)`` of ``full`` (a ``(1, C, H, W)`` buffer that takes the output's place
    among the parameters): the output pointer moves down to the tile's first row and ``y_plane``
    becomes ``H * W``, as MCUNetV2's patch-based inference writes each patch into the stage's output.
    None when ``func`` is not such a call."""
    call = _layer_call(func)
    if call is None:
        return None
    *_, out = func.params
    _n, _c, full_h, width = (int(d) for d in full.shape)
    args = list(call.args)
    positions = [i for i, a in enumerate(args) if tvm_ffi.structural_equal(a, out.data)]
    if not positions or not isinstance(args[-1], tirx.IntImm):
        return None
    zero = tirx.IntImm("int64", 0)
    for i in positions:  # (a pointwise call without a residual passes its output twice)
        args[i] = tirx.call_intrin(
            "handle", "tirx.address_of", tirx.BufferLoad(full, [zero, zero, tirx.IntImm("int64", offset), zero])
        )
    args[-1] = tirx.IntImm(args[-1].ty, full_h * width)
    rewritten = tirx.call_extern("int32", args[0].value, *args[1:])
    body = tvm_ffi.structural_mutate(
        func.body, ((tvm.ir.Call, lambda node, _m: rewritten if node.same_as(call) else _m.default_mutate(node)),)
    )
    params = [full if p.same_as(out) else p for p in func.params]
    return tirx.PrimFunc(params, body, func.ret_type, func.attrs)


def is_row_band(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` is :func:`row_band`'s call of :data:`ROW_COPY_KERNEL` (or :func:`placed_rows`')."""
    block = getattr(func.body, "block", None)
    call = getattr(getattr(block, "body", None), "value", None)
    return isinstance(call, tvm.ir.Call) and getattr(call.args[0], "value", None) in ROW_KERNELS


def is_layer_call(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` is one of these C kernels' calls (a ``te.extern`` block named ``root``)."""
    return _layer_call(func) is not None


def layer_flops(func: tirx.PrimFunc) -> int | None:
    """The multiply-adds x 2 of one of these C kernels' calls (None for any other function): what
    TVM's FLOP estimate cannot see through an external call."""
    call = _layer_call(func)
    if call is None:
        return None
    name, args = call.args[0].value, call.args[1:]
    pointers = sum(1 for a in args if not isinstance(a, tirx.IntImm | tirx.FloatImm))
    v = [int(a.value) for a in args[pointers:] if isinstance(a, tirx.IntImm)]
    if name == DEPTHWISE_KERNEL:  # planes, channels, h, w, oh, ow, kh, kw
        return 2 * v[0] * v[4] * v[5] * v[6] * v[7]
    if name == POINTWISE_KERNEL:  # cin, cout, pixels
        return 2 * v[0] * v[1] * v[2]
    return 2 * v[0] * v[3] * v[4] * v[5] * v[6] * v[7]  # window: cin, h, w, cout, oh, ow, kh, kw
