"""Bitserial TIR kernels for LQ dense layers, their schedules per target, and numpy references.

A layer is two PrimFuncs:

* ``lq_pack``: float activations (M, N) → bit-planes ``xp[Kx, M, NW]`` (uint32 words). The
  quantizer's thresholds and code table are baked in as constants.
* ``lq_dense``: ``y[m, o] = bias[o] + Σ_i Σ_j ax[i]·aw[j, o]·(N - 2·popcount(x_i ⊕ w_j))``
  with integer popcount partial sums and a float epilogue.

Bit layout (weights and activations alike): element n of a row sits in word ``n % NW``,
bit ``n // NW`` (NW = ceil(N/32)). Packing then reads consecutive floats into consecutive
words, so it vectorizes over words; the padding bits (n ≥ N) are zero in both operands, their
xor is zero and ``N`` (not 32·NW) is the right constant. Weights are interleaved as
``[Kw, O/V, NW, V]`` with V output channels per vector register (an o-strided layout would gather): the
partial sums for V outputs are one vector, the activation word is a broadcast.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import s_tir, te, tirx

from .quantizer import LQQuantizer

# Output channels per vector register: 16 u32 = one zmm, 8 = one ymm, 4 = one NEON q register.
LANES = {"avx512": 16, "x86": 8, "neon": 4}
# Below this many (word x plane pair) vector steps a kernel runs serially: the thread-pool
# launch (~10-20 µs) costs more than the work.
PARALLEL_MIN_STEPS = 1 << 14
# Register budget for the popcount accumulators: M-tile x Kx x Kw vectors live across the k loop.
MAX_ACCUMULATORS = 16


def words(n: int) -> int:
    """uint32 words per packed row of n bits."""
    return (n + 31) // 32


def kernel_flavor(target: tvm.target.Target) -> str:
    """Which schedule family suits ``target``: avx512 (VPOPCNTDQ), neon (aarch64) or generic x86."""
    if target.kind.name != "llvm":
        raise ValueError(f"LQ kernels need an llvm target, got {target.kind.name}")
    triple = str(target.attrs.get("mtriple", ""))
    if triple.startswith(("aarch64", "arm64")):
        return "neon"
    if tvm.target.codegen.target_has_features("avx512vpopcntdq", target):
        return "avx512"
    return "x86"


# ---------------------------------------------------------------------------------------------
# numpy side: packing and the ±1 reference


def pack_rows(bits: np.ndarray) -> np.ndarray:
    """(..., N) 0/1 array → (..., NW) uint32 in the strided layout (element n: word n % NW, bit n // NW)."""
    n = bits.shape[-1]
    nw = words(n)
    padded = np.zeros(bits.shape[:-1] + (32 * nw,), dtype=np.uint32)
    padded[..., :n] = bits
    planes = padded.reshape(bits.shape[:-1] + (32, nw))
    shifts = np.arange(32, dtype=np.uint32).reshape((32, 1))
    return np.bitwise_or.reduce(planes << shifts, axis=-2).astype(np.uint32)


def unpack_rows(packed: np.ndarray, n: int) -> np.ndarray:
    """Inverse of :func:`pack_rows` (the tests use it to check the padding bits)."""
    nw = packed.shape[-1]
    shifts = np.arange(32, dtype=np.uint32).reshape((32, 1))
    planes = (packed[..., None, :] >> shifts) & 1
    return planes.reshape(packed.shape[:-1] + (32 * nw,))[..., :n].astype(np.uint8)


def pack_weight_planes(bits: np.ndarray, lanes: int) -> np.ndarray:
    """(Kw, O, N) weight bits → interleaved (Kw, ceil(O/V), NW, V) uint32, padded channels all zero."""
    kw, o, _ = bits.shape
    rows = pack_rows(bits)
    op = -(-o // lanes)
    full = np.zeros((kw, op * lanes, rows.shape[-1]), dtype=np.uint32)
    full[:, :o] = rows
    return np.ascontiguousarray(full.reshape(kw, op, lanes, -1).transpose(0, 1, 3, 2))


def lq_dense_reference(
    xbits: np.ndarray, wbits: np.ndarray, ax: np.ndarray, aw: np.ndarray, bias: np.ndarray
) -> np.ndarray:
    """The layer computed directly in ±1 arithmetic: xbits (Kx, M, N), wbits (Kw, O, N), aw (Kw, O)."""
    xs = 2.0 * xbits.astype(np.float64) - 1.0
    ws = 2.0 * wbits.astype(np.float64) - 1.0
    dots = np.einsum("imn,jon->mijo", xs, ws)
    return np.einsum("mijo,i,jo->mo", dots, ax.astype(np.float64), aw.astype(np.float64)) + bias


@dataclass(frozen=True)
class ConvGeometry:
    """An NCHW conv2d as im2col: one row per output pixel, one column per (c, kh, kw)."""

    batch: int
    channels: int
    height: int
    width: int
    kernel: tuple[int, int]
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]
    """top, left, bottom, right"""
    dilation: tuple[int, int]

    @property
    def out_hw(self) -> tuple[int, int]:
        (kh, kw), (sh, sw), (dh, dw) = self.kernel, self.strides, self.dilation
        top, left, bottom, right = self.padding
        return (
            (self.height + top + bottom - dh * (kh - 1) - 1) // sh + 1,
            (self.width + left + right - dw * (kw - 1) - 1) // sw + 1,
        )

    @property
    def rows(self) -> int:
        oh, ow = self.out_hw
        return self.batch * oh * ow

    @property
    def depth(self) -> int:
        return self.channels * self.kernel[0] * self.kernel[1]

    def columns(self, x: np.ndarray) -> np.ndarray:
        """(B, C, H, W) → (B·OH·OW, C·KH·KW) patches, zero padded (any batch B)."""
        (kh, kw), (sh, sw), (dh, dw) = self.kernel, self.strides, self.dilation
        top, left, bottom, right = self.padding
        oh, ow = self.out_hw
        padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
        cols = np.empty((x.shape[0], oh, ow, self.channels, kh, kw), dtype=x.dtype)
        for i in range(kh):
            for j in range(kw):
                window = padded[
                    :, :, i * dh : i * dh + sh * (oh - 1) + 1 : sh, j * dw : j * dw + sw * (ow - 1) + 1 : sw
                ]
                cols[:, :, :, :, i, j] = window.transpose(0, 2, 3, 1)
        return cols.reshape(-1, self.depth)


# ---------------------------------------------------------------------------------------------
# TIR computes


def _code_word(x: tirx.PrimExpr, thresholds: np.ndarray, codes: np.ndarray) -> tirx.PrimExpr:
    """Code word of x's level as c_0 + Σ_t (c_{t+1} - c_t)·[x > t_t] (telescoping over the sorted levels).

    Linear in the comparisons, so it vectorizes with no table lookup; ``x > t`` is the rule
    :meth:`LQQuantizer.encode` uses, so numpy and the kernel pick the same codes.
    """
    expr: tirx.PrimExpr = tirx.const(int(codes[0]), "int32")
    for t, thr in enumerate(thresholds):
        delta = int(codes[t + 1]) - int(codes[t])
        if delta:
            hit = tirx.Select(x > tirx.const(float(thr), "float32"), tirx.const(1, "int32"), tirx.const(0, "int32"))
            expr = expr + hit * delta
    return expr


def lq_pack_func(m: int, n: int, quant: LQQuantizer) -> tirx.PrimFunc:
    """Unscheduled activation packing PrimFunc ``(x f32[M, N]) -> xp u32[Kx, M, NW]`` for one layer."""
    if quant.channels != 1:
        raise ValueError("activation quantizers have one basis per layer")
    thresholds = quant.thresholds()[0]
    codes = quant.sorted_levels()[1][0]
    nw = words(n)
    x = te.placeholder((m, n), "float32", name="x")
    b = te.reduce_axis((0, 32), name="b")

    def packed(i: tirx.Var, row: tirx.Var, w: tirx.Var) -> tirx.PrimExpr:
        index = b * nw + w
        # Clamp, then select: both sides are safe to evaluate, so the lanes vectorize.
        word = _code_word(x[row, tirx.min(index, n - 1)], thresholds, codes)
        bit = ((word >> i) & 1).astype("uint32") << b.astype("uint32")
        return te.sum(tirx.Select(index < n, bit, tirx.const(0, "uint32")), axis=b)

    xp = te.compute((quant.bits, m, nw), packed, name="xp")
    return te.create_prim_func([x, xp])


def lq_pack_conv_func(geom: ConvGeometry, quant: LQQuantizer) -> tirx.PrimFunc:
    """Unscheduled im2col packing ``(x f32[B, C, H, W]) -> xp u32[Kx, B·OH·OW, NW]``.

    Row r is output pixel (b, oh, ow), element e is (c, kh, kw) of its patch; positions in the
    padding read 0.0 and are quantized like any zero input (the quantized conv is the quantized
    im2col matrix times the weights), while the bits past C·KH·KW are zero as in :func:`lq_pack_func`.
    """
    thresholds = quant.thresholds()[0]
    codes = quant.sorted_levels()[1][0]
    (kh, kw), (sh, sw), (dh, dw) = geom.kernel, geom.strides, geom.dilation
    top, left = geom.padding[0], geom.padding[1]
    oh, ow = geom.out_hw
    n = geom.depth
    nw = words(n)
    x = te.placeholder((geom.batch, geom.channels, geom.height, geom.width), "float32", name="x")
    b = te.reduce_axis((0, 32), name="b")

    def packed(i: tirx.Var, row: tirx.Var, w: tirx.Var) -> tirx.PrimExpr:
        index = b * nw + w
        e = tirx.min(index, n - 1)
        c, kr, kc = e // (kh * kw), (e // kw) % kh, e % kw
        image, pixel = row // (oh * ow), row % (oh * ow)
        ih = (pixel // ow) * sh + kr * dh - top
        iw = (pixel % ow) * sw + kc * dw - left
        inside = tirx.all(ih >= 0, ih < geom.height, iw >= 0, iw < geom.width)
        clamp_h = tirx.max(tirx.min(ih, geom.height - 1), 0)
        clamp_w = tirx.max(tirx.min(iw, geom.width - 1), 0)
        value = tirx.Select(inside, x[image, c, clamp_h, clamp_w], tirx.const(0.0, "float32"))
        word = _code_word(value, thresholds, codes)
        bit = ((word >> i) & 1).astype("uint32") << b.astype("uint32")
        return te.sum(tirx.Select(index < n, bit, tirx.const(0, "uint32")), axis=b)

    xp = te.compute((quant.bits, geom.rows, nw), packed, name="xp")
    return te.create_prim_func([x, xp])


def lq_dense_func(m: int, n: int, o: int, kx: int, kw: int, lanes: int) -> tirx.PrimFunc:
    """Unscheduled ``(xp, wp, ax, aw, bias) -> y f32[M, O]`` with Kx x Kw integer partial sums.

    ``wp`` is u32[Kw, ceil(O/V), NW, V] from :func:`pack_weight_planes`, ``aw`` f32[Kw, O],
    ``ax`` f32[Kx]. The partial sums are laid out [M, Kx, Kw, O] with o innermost, so V of
    them are one vector (o-strided layouts cause gathers).
    """
    nw, op = words(n), -(-o // lanes)
    xp = te.placeholder((kx, m, nw), "uint32", name="xp")
    wp = te.placeholder((kw, op, nw, lanes), "uint32", name="wp")
    ax = te.placeholder((kx,), "float32", name="ax")
    aw = te.placeholder((kw, o), "float32", name="aw")
    bias = te.placeholder((o,), "float32", name="bias")
    k = te.reduce_axis((0, nw), name="k")
    partial = te.compute(
        (m, kx, kw, op * lanes),
        lambda row, i, j, c: te.sum(
            tirx.popcount(xp[i, row, k] ^ wp[j, c // lanes, k, c % lanes]).astype("int32"), axis=k
        ),
        name="popcount",
    )

    i = te.reduce_axis((0, kx), name="i")
    j = te.reduce_axis((0, kw), name="j")
    scaled = te.compute(
        (m, o),
        lambda row, c: te.sum(ax[i] * aw[j, c] * (n - 2 * partial[row, i, j, c]).astype("float32"), axis=[i, j]),
        name="scaled",
    )
    y = te.compute((m, o), lambda row, c: scaled[row, c] + bias[c], name="y")
    return te.create_prim_func([xp, wp, ax, aw, bias, y])


def fp32_dense_func(m: int, n: int, o: int, block: int) -> tirx.PrimFunc:
    """The float baseline ``(x f32[M, N], wf f32[O/B, N, B], bias) -> y``, weights pre-packed in
    panels of B output channels so the inner loop reads them contiguously."""
    ob = -(-o // block)
    x = te.placeholder((m, n), "float32", name="x")
    wf = te.placeholder((ob, n, block), "float32", name="wf")
    bias = te.placeholder((o,), "float32", name="bias")
    k = te.reduce_axis((0, n), name="k")
    acc = te.compute(
        (m, ob * block), lambda row, c: te.sum(x[row, k] * wf[c // block, k, c % block], axis=k), name="acc"
    )
    y = te.compute((m, o), lambda row, c: acc[row, c] + bias[c], name="y")
    return te.create_prim_func([x, wf, bias, y])


def pack_fp32_weight(weight: np.ndarray, block: int) -> np.ndarray:
    """(N, O) float weight → (ceil(O/B), N, B) panels for :func:`fp32_dense_func`."""
    n, o = weight.shape
    ob = -(-o // block)
    full = np.zeros((n, ob * block), dtype=np.float32)
    full[:, :o] = weight
    return np.ascontiguousarray(full.reshape(n, ob, block).transpose(1, 0, 2))


# ---------------------------------------------------------------------------------------------
# Schedules


def _m_tile(m: int, per_row: int, limit: int) -> int:
    """Largest power-of-two M-tile dividing M whose accumulators fit the register budget."""
    tile = 1
    while tile * 2 <= m and m % (tile * 2) == 0 and tile * 2 * per_row <= limit:
        tile *= 2
    return tile


def schedule_lq_dense(func: tirx.PrimFunc, flavor: str, parallel: bool | None = None) -> tirx.PrimFunc:
    """Register-tiled popcount GEMM.

    Per parallel task (one V-wide output tile x one M-tile) the k loop runs over the packed
    words with (mi, i, j) unrolled, so M-tile·Kx·Kw vector accumulators stay in registers and
    each weight vector load is reused M-tile·Kx times; the float epilogue runs right after
    on the same tile (``reverse_compute_at``), so the partial sums never leave the cache.
    """
    sch = s_tir.Schedule(func)
    block = sch.get_sblock("popcount")
    m_ext, kx, kw, o_ext, nw = (int(r.dom.extent) for r in sch.get(block).iter_vars)
    lanes = LANES[flavor]
    m_tile = _m_tile(m_ext, kx * kw, MAX_ACCUMULATORS)
    row, i, j, c, k = sch.get_loops(block)
    mo, mi = sch.split(row, [None, m_tile])
    co, ci = sch.split(c, [None, lanes])
    # Output tiles outer, M-tiles inner: a task's weight tile stays in L1 while the (small)
    # packed activations are reread from L2; the other order rereads all weights per M-tile.
    sch.reorder(co, mo, k, mi, i, j, ci)
    task = sch.fuse(co, mo)
    steps = m_ext * (o_ext // lanes) * nw * kx * kw
    if parallel is None:
        parallel = steps >= PARALLEL_MIN_STEPS
    if parallel:
        sch.parallel(task)
    sch.vectorize(ci)
    for loop in (j, i, mi):
        sch.unroll(loop)
    for name in ("scaled", "y"):
        sch.reverse_compute_at(sch.get_sblock(name), task)
    sch.decompose_reduction(block, k)
    return sch.mod["main"].with_attr("tir.is_scheduled", True)


def schedule_lq_pack(func: tirx.PrimFunc, flavor: str, parallel: bool | None = None) -> tirx.PrimFunc:
    """Packing vectorized over words: V consecutive floats → V words, 32 steps per word, planes unrolled.

    When V does not divide NW the last vector is predicated (masked loads and stores on AVX-512);
    a scalar tail loop was 4x slower at N=784.
    """
    sch = s_tir.Schedule(func)
    block = sch.get_sblock("xp")
    kx, m_ext, nw, _ = (int(r.dom.extent) for r in sch.get(block).iter_vars)
    lanes = LANES[flavor]
    i, row, w, b = sch.get_loops(block)
    wo, wi = sch.split(w, [None, lanes])
    sch.reorder(row, wo, b, i, wi)
    sch.vectorize(wi)
    sch.unroll(i)
    outer = sch.fuse(row, wo)
    if parallel is None:
        parallel = m_ext * nw * kx >= PARALLEL_MIN_STEPS
    if parallel:
        sch.parallel(outer)
    sch.decompose_reduction(block, b)
    return sch.mod["main"].with_attr("tir.is_scheduled", True)


def schedule_fp32_dense(func: tirx.PrimFunc, parallel: bool | None = None, k_block: int = 256) -> tirx.PrimFunc:
    """A register-blocked float GEMM: the fair baseline, not TVM's unscheduled default.

    Tile (M-tile x B) of accumulators in vector registers (up to 8 x 32 floats = 16 zmm),
    k blocked so the weight panel block stays in L1, bias fused after each tile.
    """
    sch = s_tir.Schedule(func)
    block = sch.get_sblock("acc")
    m_ext, o_ext, n_ext = (int(r.dom.extent) for r in sch.get(block).iter_vars)
    width = int(sch.get(block).reads[1].source.shape[2])
    m_tile = _m_tile(m_ext, max(1, width // 16), MAX_ACCUMULATORS)
    row, c, k = sch.get_loops(block)
    mo, mi = sch.split(row, [None, m_tile])
    co, ci = sch.split(c, [None, width])
    kb = k_block if n_ext % k_block == 0 else n_ext
    ko, ki = sch.split(k, [None, kb])
    sch.reorder(co, mo, ko, ki, mi, ci)
    task = sch.fuse(co, mo)
    if parallel is None:
        parallel = m_ext * o_ext * n_ext >= 64 * PARALLEL_MIN_STEPS
    if parallel:
        sch.parallel(task)
    sch.vectorize(ci)
    sch.unroll(mi)
    sch.reverse_compute_at(sch.get_sblock("y"), task)
    sch.decompose_reduction(block, ko)
    return sch.mod["main"].with_attr("tir.is_scheduled", True)
