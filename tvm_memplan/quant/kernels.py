"""Integer kernels as TE computes: int8/uint8 in and out, exact accumulation, onnxruntime's requantization.

Requantization follows onnxruntime's MLAS (``MlasRequantizeOutput``, what its QLinearConv,
QLinearMatMul and QGemm call on CPUs): the int32 accumulator plus the int32 bias is converted to
float32, multiplied by one float32 multiplier per output channel (``x_scale * w_scale / y_scale``,
computed in that order in float32), clamped to ``[qmin - zp, qmax - zp]``, rounded to the nearest
integer with ties to even, and the output zero point is added. The dot products are exact (int32, or
float32 where every partial sum provably is: :func:`accumulator_dtype`) and the float steps are the
same IEEE operations, so a conv or dense kernel equals onnxruntime's bit for bit.

QLinearAdd follows MLAS's x86 kernel (float32 fused multiply-adds). Kernels whose onnxruntime
counterpart sums floats in another order or uses other float formulas (QLinearMul, the int8
average pool, QLinearSigmoid's table) are within 1 LSB.

Each kernel is a pad stage (padding with the input zero point, i.e. real zero), one reduction and
an elementwise epilogue (which may also apply a consumer's requantization table or residual add):
the structure tvm_memplan's default CPU schedule tiles.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

import numpy as np
from tvm import te, tirx

if TYPE_CHECKING:
    from typing_extensions import Unpack

INT_RANGE = {"int8": (-128, 127), "uint8": (0, 255)}


class _Requantization(TypedDict):
    y_zero_point: int
    low: int
    high: int
    out_dtype: str


class KernelOutput(_Requantization, total=False):
    """The keyword arguments of every conv and dense kernel's output: :func:`requantize`'s zero point,
    bounds, type and ``min_max`` clamp, and :func:`apply_epilogue`'s consumer ``table`` or ``residual`` add."""

    min_max: bool
    table: te.Tensor | None
    residual: te.Tensor | None
    residual_add: dict | None


class _ConvWindow(KernelOutput):
    strides: Sequence[int]
    padding: Sequence[int]
    dilation: Sequence[int]
    x_zero_point: int


class ConvOptions(_ConvWindow, total=False):
    """A convolution kernel's keyword arguments: its window, the input zero point (the padding value),
    :class:`KernelOutput`, and ``quantize_input`` (scale, type) where ``x`` is the float32 network input."""

    quantize_input: tuple[float, str] | None


def check_keywords(kernel: str, given: dict, accepted: type) -> None:
    """Reject keyword arguments ``accepted`` (a TypedDict) does not name, and missing required ones: the
    ``**options: Unpack[...]`` signatures are checked by type checkers only, and a misspelled optional
    keyword (``residual_ad``) would otherwise be dropped silently, giving a kernel without its epilogue."""
    unknown = sorted(set(given) - accepted.__required_keys__ - accepted.__optional_keys__)
    missing = sorted(accepted.__required_keys__ - set(given))
    if unknown or missing:
        problems = ([f"unknown keyword {', '.join(unknown)}"] if unknown else []) + (
            [f"missing {', '.join(missing)}"] if missing else []
        )
        raise TypeError(f"{kernel}(): {'; '.join(problems)}")


def requantize(
    value: tirx.PrimExpr,
    multiplier: tirx.PrimExpr,
    zero_point: int,
    low: int,
    high: int,
    dtype: str,
    min_max: bool = False,
) -> tirx.PrimExpr:
    """MLAS requantization of an int32 (or float32) ``value``: scale, clamp, round half to even, add
    the zero point. ``low``/``high`` are the output's quantized bounds (the type's range narrowed by a
    folded Relu or Clip). ``min_max``: clamp with calls of C's ``fmaxf``/``fminf`` (the same values)."""
    scaled = value.astype("float32") * multiplier
    lowest, highest = tirx.const(float(low - zero_point), "float32"), tirx.const(float(high - zero_point), "float32")
    if min_max:  # C's fmaxf/fminf: one VMAXNM/VMINNM each on an FPv5 FPU, no compare and branch (never NaN here)
        clamped = tirx.call_pure_extern(
            "float32", "fminf", tirx.call_pure_extern("float32", "fmaxf", scaled, lowest), highest
        )
    else:
        clamped = tirx.min(tirx.max(scaled, lowest), highest)
    return (tirx.nearbyint(clamped).astype("int32") + zero_point).astype(dtype)


def apply_epilogue(
    table: te.Tensor | None,
    code: tirx.PrimExpr,
    dtype: str,
    residual: te.Tensor | None = None,
    residual_add: dict | None = None,
    index: Sequence = (),
) -> tirx.PrimExpr:
    """The epilogue after requantization: ``table[code]`` (a requantization to a consumer's scale, see
    :func:`lookup`), or the QLinearAdd of ``code`` and ``residual[index]`` (``residual_add``: the
    :func:`add_parameters`, the add's bounds and type, and whether ``code`` is the add's first
    operand: MLAS's formula is not symmetric), or ``code``."""
    if table is not None:
        return table[code.astype("int32") + (128 if dtype == "int8" else 0)]
    if residual is not None:
        other = residual[tuple(index)]
        first, second = (code, other) if residual_add["code_first"] else (other, code)
        return add_codes(
            first,
            second,
            residual_add["ratio_a"],
            residual_add["ratio_b"],
            residual_add["constant"],
            residual_add["low"],
            residual_add["high"],
            residual_add["out_dtype"],
        )
    return code


def output_code(
    value: tirx.PrimExpr, multiplier: tirx.PrimExpr, index: Sequence, output: KernelOutput
) -> tirx.PrimExpr:
    """A kernel's output at ``index``: :func:`requantize` of ``value`` (accumulator plus bias), then
    :func:`apply_epilogue` with ``output``'s table or residual add."""
    dtype, min_max = output["out_dtype"], output.get("min_max", False)
    code = requantize(value, multiplier, output["y_zero_point"], output["low"], output["high"], dtype, min_max)
    return apply_epilogue(output.get("table"), code, dtype, output.get("residual"), output.get("residual_add"), index)


def _saturate(value: tirx.PrimExpr, low: int, high: int) -> tirx.PrimExpr:
    return tirx.min(tirx.max(value, tirx.const(float(low), "float32")), tirx.const(float(high), "float32"))


def accumulator_dtype(weight: np.ndarray, x_dtype: str) -> str:
    """``float32`` when every partial sum of every output is an integer float32 holds exactly
    (``max |x| * sum |w[o]| < 2^24``): the products and sums are then exact and the kernel runs on
    the CPU's float FMA units, which tvm_memplan's default schedules use well; else ``int32``."""
    largest = 255 if x_dtype == "uint8" else 128
    per_output = np.abs(weight.reshape(weight.shape[0], -1).astype(np.int64)).sum(axis=1)
    return "float32" if int(per_output.max(initial=0)) * largest < 2**24 else "int32"


def fold_zero_point(bias: np.ndarray, weight: np.ndarray, x_zero_point: int) -> np.ndarray:
    """``bias[o] - x_zero_point * sum(weight[o])``: sum((x - zx) w) + b = sum(x w) + that, in int32."""
    folded = bias.astype(np.int64) - x_zero_point * weight.reshape(weight.shape[0], -1).astype(np.int64).sum(axis=1)
    if folded.min(initial=0) < np.iinfo(np.int32).min or folded.max(initial=0) > np.iinfo(np.int32).max:
        raise OverflowError("the folded bias does not fit int32")
    return folded.astype(np.int32)


def quantize_value(value: tirx.PrimExpr, scale: float, zero_point: int, dtype: str) -> tirx.PrimExpr:
    """QuantizeLinear of one float32 value as MLAS computes it: divide by the scale, clamp, round
    half to even, add the zero point."""
    low, high = INT_RANGE[dtype]
    return requantize(value / tirx.const(scale, "float32"), tirx.const(1.0, "float32"), zero_point, low, high, dtype)


def pad_codes(
    x: te.Tensor, padding: Sequence[int], value: int, quantize_input: tuple[float, str] | None = None
) -> te.Tensor:
    """``x`` (NCHW) padded with ``value`` (the zero point: a real zero) by (top, left, bottom, right).
    ``quantize_input`` (scale, type): ``x`` is float32 and quantized here with zero point ``value``
    (the network input's QuantizeLinear fused into its first conv, see :func:`conv2d`)."""
    top, left, bottom, right = padding
    if not any(padding) and quantize_input is None:
        return x
    n, c, h, w = (int(d) for d in x.shape)
    dtype = x.dtype if quantize_input is None else quantize_input[1]

    def read(b, ch, y, xx):
        if quantize_input is None:
            return x[b, ch, y, xx]
        return quantize_value(x[b, ch, y, xx], quantize_input[0], value, dtype)

    def body(b, ch, y, xx):
        if not any(padding):
            return read(b, ch, y, xx)
        inside = tirx.all(y >= top, y < top + h, xx >= left, xx < left + w)
        return tirx.if_then_else(inside, read(b, ch, y - top, xx - left), tirx.const(value, dtype))

    return te.compute((n, c, h + top + bottom, w + left + right), body, name="pad" if any(padding) else "quantize")


def conv_geometry(
    x: te.Tensor, kh: int, kw: int, window: ConvOptions
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int, int, int], tuple[int, int]]:
    """A 2-d convolution's strides, dilation, padding (top, left, bottom, right) as ints, and its
    output height and width, for an NCHW ``x``, a ``kh x kw`` kernel and ``window``'s strides,
    dilation and padding."""
    h, w = (int(d) for d in x.shape[2:])
    sh, sw = (int(v) for v in window["strides"])
    dh, dw = (int(v) for v in window["dilation"])
    top, left, bottom, right = (int(p) for p in window["padding"])
    oh = (h + top + bottom - (kh - 1) * dh - 1) // sh + 1
    ow = (w + left + right - (kw - 1) * dw - 1) // sw + 1
    return (sh, sw), (dh, dw), (top, left, bottom, right), (oh, ow)


def conv2d(
    x: te.Tensor,
    weight: te.Tensor,
    bias: te.Tensor,
    multiplier: te.Tensor,
    *,
    groups: int = 1,
    accumulate: str = "int32",
    **options: Unpack[ConvOptions],
) -> te.Tensor:
    """QLinearConv: NCHW int8/uint8 ``x``, OIHW int8 ``weight`` (zero point 0), int32 ``bias`` (O),
    float32 ``multiplier`` (O). Regular, grouped (``groups``, 1 by default as in ONNX) and depthwise. The
    dot products accumulate in ``accumulate`` (:func:`accumulator_dtype`: float32 only where that is exact).

    The input zero point is not subtracted per multiply: ``bias`` must already hold
    ``bias - x_zero_point * sum(weight[o])`` (:func:`fold_zero_point`), exact in integers because
    the padding is the zero point too. The reduction is then a plain int8 x int8 dot product.

    ``min_max``: see :func:`requantize`. ``quantize_input`` (scale, type): ``x`` is float32 and this
    kernel quantizes it (QuantizeLinear
    with zero point ``x_zero_point``) as it pads it: the network input's quantized copy is then no
    tensor of the arena (the float input, a function parameter, is not one either). The schedule
    computes the padding per row, so each input element is quantized about once per kernel row."""
    check_keywords("conv2d", options, ConvOptions)
    n, _c, h, w = (int(d) for d in x.shape)
    o, cg, kh, kw = (int(d) for d in weight.shape)
    (sh, sw), (dh, dw), padding, (oh, ow) = conv_geometry(x, kh, kw, options)
    per_group = o // groups
    padded = pad_codes(x, padding, options["x_zero_point"], options.get("quantize_input"))
    rc = te.reduce_axis((0, cg), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def accumulate_products(b, oc, y, xx):
        ic = rc if groups == 1 else (oc // per_group) * cg + rc
        data = padded[b, ic, y * sh + ry * dh, xx * sw + rx * dw].astype(accumulate)
        return te.sum(data * weight[oc, rc, ry, rx].astype(accumulate), axis=[rc, ry, rx])

    acc = te.compute((n, o, oh, ow), accumulate_products, name="conv2d_acc")

    def epilogue(b, oc, y, xx):
        return output_code(acc[b, oc, y, xx].astype("int32") + bias[oc], multiplier[oc], (b, oc, y, xx), options)

    return te.compute(acc.shape, epilogue, name="requantize")


def dense(
    x: te.Tensor,
    weight: te.Tensor,
    bias: te.Tensor,
    multiplier: te.Tensor,
    *,
    accumulate: str = "int32",
    **output: Unpack[KernelOutput],
) -> te.Tensor:
    """QGemm/QLinearMatMul: ``x`` (..., K) times int8 ``weight`` (K, N: outputs contiguous, the layout
    the default schedule vectorizes, as a float matmul's), int32 ``bias`` (N) with the input zero point
    folded in (:func:`fold_zero_point`), float32 ``multiplier`` (N)."""
    check_keywords("dense", output, KernelOutput)
    lead = [int(d) for d in x.shape[:-1]]
    k = int(x.shape[-1])
    n = int(weight.shape[1])
    rk = te.reduce_axis((0, k), name="rk")

    def accumulate_products(*index):
        rows, col = index[:-1], index[-1]
        return te.sum(x[(*rows, rk)].astype(accumulate) * weight[rk, col].astype(accumulate), axis=rk)

    acc = te.compute((*lead, n), accumulate_products, name="dense_acc")
    return te.compute(
        acc.shape,
        lambda *i: output_code(acc[i].astype("int32") + bias[i[-1]], multiplier[i[-1]], i, output),
        name="requantize",
    )


def _broadcast_index(tensor: te.Tensor, index: Sequence[tirx.PrimExpr]) -> list:
    """numpy broadcasting: ``index`` into the output, read from ``tensor`` (right-aligned, size-1 axes fixed at 0)."""
    rank = len(tensor.shape)
    tail = index[len(index) - rank :]
    return [0 if int(d) == 1 else i for d, i in zip(tensor.shape, tail, strict=True)]


def _fma(a: tirx.PrimExpr, b: tirx.PrimExpr, c: tirx.PrimExpr) -> tirx.PrimExpr:
    """``a * b + c`` with one rounding (C's ``fmaf``; LLVM turns it into ``vfmadd`` where the CPU has FMA)."""
    return tirx.call_pure_extern("float32", "fmaf", a, b, c)


def add_parameters(
    a_scale: float, a_zero_point: int, b_scale: float, b_zero_point: int, y_scale: float, y_zero_point: int
) -> tuple[float, float, float]:
    """MLAS's x86 QLinearAdd constants: ``sa/sy``, ``sb/sy`` and ``zy - (ra za + rb zb)``, in float32."""
    ratio_a = np.float32(a_scale) / np.float32(y_scale)
    ratio_b = np.float32(b_scale) / np.float32(y_scale)
    constant = np.float32(y_zero_point) - (ratio_a * np.float32(a_zero_point) + ratio_b * np.float32(b_zero_point))
    return float(ratio_a), float(ratio_b), float(constant)


def add_codes(
    a: tirx.PrimExpr,
    b: tirx.PrimExpr,
    ratio_a: float,
    ratio_b: float,
    constant: float,
    low: int,
    high: int,
    out_dtype: str,
) -> tirx.PrimExpr:
    """``fma(a, ra, fma(b, rb, constant))`` of two int8/uint8 codes, rounded half to even, saturated."""
    value = _fma(
        a.astype("int32").astype("float32"),
        tirx.const(ratio_a, "float32"),
        _fma(b.astype("int32").astype("float32"), tirx.const(ratio_b, "float32"), tirx.const(constant, "float32")),
    )
    return _saturate(tirx.nearbyint(value), low, high).astype(out_dtype)


def binary(
    a: te.Tensor,
    b: te.Tensor,
    *,
    op: str,
    out_shape: Sequence[int],
    a_scale: float,
    a_zero_point: int,
    b_scale: float,
    b_zero_point: int,
    y_scale: float,
    y_zero_point: int,
    low: int,
    high: int,
    out_dtype: str,
) -> te.Tensor:
    """QLinearAdd (``op="add"``) or QLinearMul (``op="multiply"``) of two numpy-broadcast int8/uint8 tensors.

    Add as onnxruntime computes it on x86 (MLAS's AVX2 "XNNFloatMultiply" kernel, its default): ratios
    ``sa/sy`` and ``sb/sy`` and a constant ``zy - (ra za + rb zb)`` in float32, then
    ``fma(a, ra, fma(b, rb, constant))`` rounded half to even and saturated. The constant is computed
    here in numpy; onnxruntime's compiler may contract it into an fma: within 1 LSB at worst.

    Multiply in float32: ``(a - za)(b - zb)`` exactly in int32, times ``sa sb / sy``, rounded half to
    even (onnxruntime's kernel computes the same product in float: within 1 LSB)."""
    if op == "add":
        ratio_a, ratio_b, constant = add_parameters(a_scale, a_zero_point, b_scale, b_zero_point, y_scale, y_zero_point)

        def codes(va: tirx.PrimExpr, vb: tirx.PrimExpr) -> tirx.PrimExpr:
            return add_codes(va, vb, ratio_a, ratio_b, constant, low, high, out_dtype)

    elif op == "multiply":
        multiplier = float(np.float32(a_scale) * np.float32(b_scale) / np.float32(y_scale))

        def codes(va: tirx.PrimExpr, vb: tirx.PrimExpr) -> tirx.PrimExpr:
            product = (va.astype("int32") - a_zero_point) * (vb.astype("int32") - b_zero_point)
            return requantize(product, tirx.const(multiplier, "float32"), y_zero_point, low, high, out_dtype)

    else:
        raise ValueError(f"no quantized elementwise {op!r} (add or multiply)")

    def body(*index):
        return codes(a[tuple(_broadcast_index(a, index))], b[tuple(_broadcast_index(b, index))])

    return te.compute(tuple(int(d) for d in out_shape), body, name="qadd" if op == "add" else "qmul")


UNROLLED_MEAN = 64
"""The most elements a mean sums as one expression (see :func:`mean`)."""


def mean(
    x: te.Tensor,
    *,
    axes: Sequence[int],
    keepdims: bool,
    multiplier: float,
    x_zero_point: int,
    y_zero_point: int,
    low: int,
    high: int,
    out_dtype: str,
) -> te.Tensor:
    """QLinearGlobalAveragePool (a mean over ``axes``): int32 sum of ``x - zx``, times
    ``x_scale / (count * y_scale)``. A window of at most ``UNROLLED_MEAN`` elements (MobileNet's last 5x5 or 7x7
    plane) is summed as one expression per output, its elements' codes then ``- count * zx``: no reduction buffer,
    whose every partial sum a C compiler keeps in memory (an int8 load may alias it), and no workspace."""
    axes = sorted(int(a) % len(x.shape) for a in axes)
    kept = [a for a in range(len(x.shape)) if a not in axes]
    if keepdims:
        out_shape = [1 if a in axes else int(x.shape[a]) for a in range(len(x.shape))]
    else:
        out_shape = [int(x.shape[a]) for a in kept]
    window = [int(x.shape[a]) for a in axes]
    scale = tirx.const(multiplier, "float32")

    def element(index: Sequence, at: Sequence) -> tirx.PrimExpr:
        """``x`` at output ``index``, ``at`` along the reduced axes."""
        full, it = [], iter(at)
        positions = dict(zip(kept, index if not keepdims else [index[a] for a in kept], strict=True))
        for a in range(len(x.shape)):
            full.append(next(it) if a in axes else positions[a])
        return x[tuple(full)]

    count = int(np.prod(window))
    if count <= UNROLLED_MEAN:

        def unrolled(*index):
            total = None
            for at in np.ndindex(*window):
                code = element(index, at).astype("int32")
                total = code if total is None else total + code
            return requantize(total - count * x_zero_point, scale, y_zero_point, low, high, out_dtype)

        return te.compute(tuple(out_shape), unrolled, name="requantize")
    reduce = [te.reduce_axis((0, n), name=f"r{a}") for a, n in zip(axes, window, strict=True)]

    def accumulate(*index):
        return te.sum(element(index, reduce).astype("int32") - x_zero_point, axis=reduce)

    acc = te.compute(tuple(out_shape), accumulate, name="sum_int32")
    return te.compute(
        acc.shape, lambda *i: requantize(acc[i], scale, y_zero_point, low, high, out_dtype), name="requantize"
    )


def avg_pool2d(
    x: te.Tensor,
    *,
    pool_size: Sequence[int],
    strides: Sequence[int],
    padding: Sequence[int],
    count_include_pad: bool,
    x_scale: float,
    x_zero_point: int,
    y_scale: float,
    y_zero_point: int,
    out_dtype: str,
) -> te.Tensor:
    """QLinearAveragePool (NCHW) computed as onnxruntime does: each input dequantized to float32
    (``x_scale * (x - zx)``), summed row by row over the window (padding adds 0.0: no change),
    divided by the window count (padding excluded unless counted), then ``y / y_scale + zy``
    rounded half to even and saturated."""
    n, c, h, w = (int(d) for d in x.shape)
    kh, kw = (int(k) for k in pool_size)
    sh, sw = (int(s) for s in strides)
    top, left, bottom, right = (int(p) for p in padding)
    oh = (h + top + bottom - kh) // sh + 1
    ow = (w + left + right - kw) // sw + 1
    padded = pad_codes(x, (top, left, bottom, right), x_zero_point)
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    scale = tirx.const(x_scale, "float32")
    acc = te.compute(
        (n, c, oh, ow),
        lambda b, ch, y, xx: te.sum(
            (padded[b, ch, y * sh + ry, xx * sw + rx].astype("int32") - x_zero_point).astype("float32") * scale,
            axis=[ry, rx],
        ),
        name="pool_sum",
    )
    low, high = INT_RANGE[out_dtype]

    def count(y, xx):
        if count_include_pad:
            return tirx.const(float(kh * kw), "float32")
        rows = tirx.min(y * sh - top + kh, h) - tirx.max(y * sh - top, 0)
        cols = tirx.min(xx * sw - left + kw, w) - tirx.max(xx * sw - left, 0)
        return (rows * cols).astype("float32")

    def body(b, ch, y, xx):
        value = acc[b, ch, y, xx] / count(y, xx) / tirx.const(y_scale, "float32")
        rounded = tirx.nearbyint(value + tirx.const(float(y_zero_point), "float32"))
        return _saturate(rounded, low, high).astype(out_dtype)

    return te.compute(acc.shape, body, name="requantize")


def lookup(x: te.Tensor, table: te.Tensor) -> te.Tensor:
    """``table[x]`` elementwise: a 256-entry table indexed by the int8/uint8 value (int8 offset by 128)."""
    offset = 128 if x.dtype == "int8" else 0
    return te.compute(x.shape, lambda *i: table[x[i].astype("int32") + offset], name="lookup")


def quantize(x: te.Tensor, *, scale: float, zero_point: int, out_dtype: str) -> te.Tensor:
    """QuantizeLinear as MLAS computes it: divide by the scale, clamp, round half to even, add the zero point."""
    return te.compute(x.shape, lambda *i: quantize_value(x[i], scale, zero_point, out_dtype), name="quantize")
