"""Int8 1x1 convolutions, denses and depthwise convolutions on Helium, the M-profile Vector Extension.

On a core with MVE (``__ARM_FEATURE_MVE``: the Cortex-M55, which ``qemu-system-arm`` emulates), the
calls of :data:`~tvm_memplan.quant.mcu_kernels.POINTWISE_KERNEL` and
:data:`~tvm_memplan.quant.mcu_kernels.DEPTHWISE_KERNEL` run the definitions here instead of the SMLAD
ones of :mod:`tvm_memplan.deploy.mcu_layers_c` (a ``#define`` after them renames the calls): same
arguments, same weights, and the same requantization arithmetic as ``tvm_memplan_requantize`` and
``tvm_memplan_add`` (float32 multiply, round half to even, saturating zero-point add, clamp; MLAS's two
FMAs for a fused residual add), 4 codes at a time (``VCVT``, ``VMUL``, ``VCVTN``, which rounds as
``VCVTR`` does under the default rounding mode, ``VQADD``, ``VMAX``/``VMIN``, ``VFMA``) and stored by one
narrowing ``VSTRB``. So the output codes equal the SMLAD kernels' bit for bit.

* 1x1 convolution (stride 1, :func:`~tvm_memplan.quant.dot_kernels.pack_dot_weights`'s layout): each
  output is a dot product over the input channels, 16 at a time with one ``VMLADAVA`` (CMSIS-NN's
  ``arm_nn_mat_mult_nt_t_s8`` MVE loop), the last vector's missing channels switched off by a ``VCTP``
  predicate. A tile of pixels is transposed once from NCHW into pixel-major rows (a widening ``VLDRB``
  of 8 pixels of one channel and a byte ``VSTRB`` scatter); each output channel's weights are gathered
  once per tile into a contiguous row (``VLDRB`` gather of 4 steps of 4 channels); then 4 pixels share
  each weight vector: per 16 MACs of a pixel, one ``VLDRB`` and one ``VMLADAVA``.
* dense (a 1x1 of one pixel): the inputs read in place, the weights by the gather, each used once.
* depthwise with rows of at least 16 outputs, at horizontal stride 1 or (3x3) 2: 4 outputs of a row per
  vector, each tap one widening ``VLDRB`` of 4 inputs and one ``VMLA``, the input rows copied once into a
  ring of the window's rows padded with the input zero point (at stride 2 split by ``VLD2`` into even and
  odd columns, so that the 4 inputs of a tap are contiguous); a 3x3 in two passes (the first two rows of
  taps into a row of partial sums, then the third and the requantization), so that each pass's taps and
  pointers stay in registers; other strides and narrower rows call the SMLAD kernel.

Elsewhere (M4, M7, the host) the preprocessor drops this text and the SMLAD kernels run.
"""

from __future__ import annotations

from ..quant.mcu_kernels import DEPTHWISE_KERNEL, POINTWISE_KERNEL
from .mcu_layers_c import DEPTHWISE_PLANE, LAYER_KERNELS, POINTWISE_HEAD

HELIUM_CPUS = ("cortex-m55",)
"""The cores of :mod:`tvm_memplan.deploy.targets` with MVE, whose ``kernels.c`` gets :data:`MVE_KERNELS`."""
MVE_POINTWISE_KERNEL = "tvm_memplan_pointwise_mve_s8"
"""The Helium definition, which ``#define`` makes every call of :data:`POINTWISE_KERNEL` take."""
MVE_DEPTHWISE_KERNEL = "tvm_memplan_depthwise_mve_s8"
"""The Helium depthwise definition, which ``#define`` makes every call of :data:`DEPTHWISE_KERNEL` take."""
MVE_MARKER = "/* tvm-memplan: Helium (MVE) pointwise kernel */"
"""The first line of :data:`MVE_KERNELS`, for tests and readers of ``kernels.c``."""

MVE_KERNELS = (
    MVE_MARKER
    + r"""
#if defined(__ARM_FEATURE_MVE)
#include <arm_mve.h>
/* the 4 requantized codes of acc, as tvm_memplan_requantize: float (VCVT, VMUL, VCVTN: half to even as
 * tvm_memplan_round's VCVTR, VQADD, clamp) or fixed point (VRMULH: (acc * q + 2^31) >> 32 as SMMLAR, the zero
 * point, clamp) */
static inline __attribute__((always_inline)) int32x4_t tvm_memplan_requantize_x4(
    int32x4_t acc, tvm_memplan_scale scale, int32_t zero_point, int32x4_t low, int32x4_t high) {
  const int32x4_t code = scale.fixed
                             ? vaddq_n_s32(vrmulhq_s32(acc, vdupq_n_s32(scale.q)), zero_point)
                             : vqaddq_n_s32(vcvtnq_s32_f32(vmulq_n_f32(vcvtq_f32_s32(acc), scale.m)), zero_point);
  return vminq_s32(vmaxq_s32(code, low), high);
}
/* the depthwise convolution at horizontal stride 1 (or 2 for a 3x3): 4 outputs of a row per vector, each tap one
 * widening VLDRB of 4 inputs and one VMLA; the input rows go once into a ring of the window's rows padded with the
 * input zero point (rows above and below the input read a row of zero points); other strides and rows of fewer
 * than 16 outputs take the SMLAD kernel */
static inline __attribute__((always_inline)) int32_t tvm_memplan_depthwise_mve_s8(
    void* x_, void* w_, void* bias_, void* multiplier_, void* y_, int32_t planes, int32_t channels, int32_t h,
    int32_t w, int32_t oh, int32_t ow, int32_t kh, int32_t kw, int32_t sh, int32_t sw, int32_t top, int32_t left,
    int32_t x_zp, int32_t y_zp, int32_t low, int32_t high, int32_t fixed_point, int32_t y_plane) {
  const int32_t halves = sw == 2 && kh == 3 && kw == 3; /* stride 2: rows stored as even columns, odd columns */
  if ((sw != 1 && !halves) || ow < 16 || ow > 1024) { /* (rows of 9 or 5 outputs: idle lanes cost more) */
    return tvm_memplan_depthwise_s8(x_, w_, bias_, multiplier_, y_, planes, channels, h, w, oh, ow, kh, kw, sh, sw,
                                    top, left, x_zp, y_zp, low, high, fixed_point, y_plane);
  }
  const int8_t* x = (const int8_t*)x_;
  const int8_t* weights = (const int8_t*)w_;
  const int32_t* bias = (const int32_t*)bias_;
  const float* multiplier = (const float*)multiplier_;
  int8_t* y = (int8_t*)y_;
  const int32_t cols = (ow - 1) * sw + kw, filled = left + w, widest = cols > filled ? cols : filled;
  /* + 4: the last vector reads past ow; at stride 2, whole pairs of vectors and 16 bytes of slack per half */
  const int32_t stride = halves ? ((widest + 31) & ~31) + 32 : (widest + 4 + 3) & ~3, half = stride / 2;
  int8_t ring[kh * stride], zero_points[stride], wide[halves ? stride : 1];
  memset(wide, x_zp, sizeof(wide));
  memset(ring, x_zp, sizeof(ring)); /* the padding stays: rows are copied between it */
  memset(zero_points, x_zp, sizeof(zero_points));
  const int8_t* rows[TVM_MEMPLAN_MAX_WINDOW];
  int32_t taps[TVM_MEMPLAN_MAX_WINDOW * TVM_MEMPLAN_MAX_WINDOW];
  const int32x4_t lo = vdupq_n_s32(low), hi = vdupq_n_s32(high);
  int32_t partial[(ow + 3) & ~3]; /* a 3x3 row's sums over its first two rows of taps */
"""
    + DEPTHWISE_PLANE
    + r"""    for (int32_t i = 0; i < kh * kw; ++i) taps[i] = tap[i];
    int32_t next = -top; /* the first input row not yet in the ring */
    for (int32_t oy = 0; oy < oh; ++oy, dst += ow) {
      const int32_t first = oy * sh - top;
      for (int32_t r = 0; r < kh; ++r) {
        const int32_t iy = first + r;
        if (iy < 0 || iy >= h) {
          rows[r] = zero_points;
          continue;
        }
        int8_t* slot = ring + (iy % kh) * stride;
        if (iy >= next && !halves) {
          memcpy(slot + left, src + iy * w, w);
        } else if (iy >= next) { /* the padded row, then split by VLD2 into its even and odd columns */
          memcpy(wide + left, src + iy * w, w);
          for (int32_t i = 0; i < stride; i += 32) {
            const int8x16x2_t pair = vld2q_s8(wide + i);
            vstrbq_s8(slot + i / 2, pair.val[0]);
            vstrbq_s8(slot + half + i / 2, pair.val[1]);
          }
        }
        if (iy >= next) next = iy + 1;
        rows[r] = slot;
      }
      if (halves) { /* stride 2: taps 0 and 2 of output ox at even columns ox and ox + 1, tap 1 at odd column ox */
        const int8_t *r0 = rows[0], *r1 = rows[1], *r2 = rows[2];
        const int8_t *q0 = r0 + half, *q1 = r1 + half, *q2 = r2 + half;
        const int32_t t0 = taps[0], t1 = taps[1], t2 = taps[2], t3 = taps[3], t4 = taps[4], t5 = taps[5];
        const int32x4_t start = vdupq_n_s32(b);
        int32_t* to = partial;
        for (int32_t ox = 0; ox < ow; ox += 4, r0 += 4, q0 += 4, r1 += 4, q1 += 4, to += 4) { /* rows 0 and 1 */
          int32x4_t acc = vmlaq_n_s32(start, vldrbq_s32(r0), t0);
          acc = vmlaq_n_s32(acc, vldrbq_s32(q0), t1);
          acc = vmlaq_n_s32(acc, vldrbq_s32(r0 + 1), t2);
          acc = vmlaq_n_s32(acc, vldrbq_s32(r1), t3);
          acc = vmlaq_n_s32(acc, vldrbq_s32(q1), t4);
          acc = vmlaq_n_s32(acc, vldrbq_s32(r1 + 1), t5);
          vstrwq_s32(to, acc);
        }
        const int32_t t6 = taps[6], t7 = taps[7], t8 = taps[8];
        const int32_t* from = partial;
        for (int32_t ox = 0; ox < ow; ox += 4, r2 += 4, q2 += 4, from += 4) { /* row 2, the requantization */
          int32x4_t acc = vmlaq_n_s32(vldrwq_s32(from), vldrbq_s32(r2), t6);
          acc = vmlaq_n_s32(acc, vldrbq_s32(q2), t7);
          acc = vmlaq_n_s32(acc, vldrbq_s32(r2 + 1), t8);
          vstrbq_p_s32(dst + ox, tvm_memplan_requantize_x4(acc, m, y_zp, lo, hi), vctp32q(ow - ox));
        }
      } else if (kh == 3 && kw == 3) { /* two passes, so that the taps and pointers of each stay in registers */
        const int8_t *r0 = rows[0], *r1 = rows[1], *r2 = rows[2];
        const int32_t t0 = taps[0], t1 = taps[1], t2 = taps[2], t3 = taps[3], t4 = taps[4], t5 = taps[5];
        const int32x4_t start = vdupq_n_s32(b);
        int32_t* to = partial;
        for (int32_t ox = 0; ox < ow; ox += 4, r0 += 4, r1 += 4, to += 4) { /* rows 0 and 1 */
          int32x4_t acc = vmlaq_n_s32(start, vldrbq_s32(r0), t0);
          acc = vmlaq_n_s32(acc, vldrbq_s32(r0 + 1), t1);
          acc = vmlaq_n_s32(acc, vldrbq_s32(r0 + 2), t2);
          acc = vmlaq_n_s32(acc, vldrbq_s32(r1), t3);
          acc = vmlaq_n_s32(acc, vldrbq_s32(r1 + 1), t4);
          acc = vmlaq_n_s32(acc, vldrbq_s32(r1 + 2), t5);
          vstrwq_s32(to, acc);
        }
        const int32_t t6 = taps[6], t7 = taps[7], t8 = taps[8];
        const int32_t* from = partial;
        for (int32_t ox = 0; ox < ow; ox += 4, r2 += 4, from += 4) { /* row 2, the requantization */
          int32x4_t acc = vmlaq_n_s32(vldrwq_s32(from), vldrbq_s32(r2), t6);
          acc = vmlaq_n_s32(acc, vldrbq_s32(r2 + 1), t7);
          acc = vmlaq_n_s32(acc, vldrbq_s32(r2 + 2), t8);
          vstrbq_p_s32(dst + ox, tvm_memplan_requantize_x4(acc, m, y_zp, lo, hi), vctp32q(ow - ox));
        }
      } else {
        for (int32_t ox = 0; ox < ow; ox += 4) {
          int32x4_t acc = vdupq_n_s32(b);
          for (int32_t r = 0; r < kh; ++r) {
            const int8_t* at = rows[r] + ox;
            for (int32_t k = 0; k < kw; ++k) acc = vmlaq_n_s32(acc, vldrbq_s32(at + k), taps[r * kw + k]);
          }
          vstrbq_p_s32(dst + ox, tvm_memplan_requantize_x4(acc, m, y_zp, lo, hi), vctp32q(ow - ox));
        }
      }
    }
  }
  return 0;
}
"""
    + f"static inline __attribute__((always_inline)) int32_t {MVE_POINTWISE_KERNEL}("
    + POINTWISE_HEAD
    + r"""  const int32_t steps = (cin + 3) >> 2, vectors = (cin + 15) >> 4, row = 16 * vectors;
  /* byte offsets of 4 steps of one lane's 4 channels in a block of 4 output channels */
  const uint8x16_t lane_gather = vaddq_u8(vandq_u8(vidupq_n_u8(0, 1), vdupq_n_u8(3)),
                                          vmulq_n_u8(vshrq_n_u8(vidupq_n_u8(0, 1), 2), 16));
  if (pixels == 1) { /* a dense: the input is already a row of channels */
    for (int32_t o = 0; o < cout; ++o) {
      const int8_t* lane = weights + (o >> 2) * steps * 16 + (o & 3) * 4;
      const int8_t* from = x;
      int32_t acc = bias[o], left = cin;
      for (; left >= 16; left -= 16, lane += 64, from += 16) {
        acc = vmladavaq_s8(acc, vldrbq_s8(from), vldrbq_gather_offset_s8(lane, lane_gather));
      }
      if (left > 0) {
        const mve_pred16_t tail = vctp8q(left);
        acc = vmladavaq_p_s8(acc, vldrbq_z_s8(from, tail), vldrbq_gather_offset_z_s8(lane, lane_gather, tail), tail);
      }
      TVM_MEMPLAN_STORE(o, 0, acc, tvm_memplan_scale_of(multiplier[o], fixed));
    }
    return 0;
  }
  int32_t tile = 4096 / row; /* (a row is at most 2 KiB: mcu_kernels.dot_conv's stack bound) */
  tile = tile > 256 ? 256 : tile >= 4 ? tile & ~3 : tile;
  int8_t packed[tile * row]; /* pixel-major: each pixel's input channels, then padding up to a vector */
  int8_t unpacked[row];      /* one output channel's weights, in input-channel order */
  const uint16x8_t pixel_scatter = vmulq_n_u16(vidupq_n_u16(0, 1), (uint16_t)row);
  for (int32_t p0 = 0; p0 < pixels; p0 += tile) {
    const int32_t n = pixels - p0 < tile ? pixels - p0 : tile;
    for (int32_t c = 0; c < cin; ++c) {
      const int8_t* from = x + c * pixels + p0;
      int8_t* to = packed + c;
      int32_t p = 0;
      for (; p + 8 <= n; p += 8, from += 8, to += 8 * row) {
        vstrbq_scatter_offset_s16(to, pixel_scatter, vldrbq_s16(from));
      }
      if (p < n) {
        const mve_pred16_t there = vctp16q(n - p);
        vstrbq_scatter_offset_p_s16(to, pixel_scatter, vldrbq_z_s16(from, there), there);
      }
    }
    for (int32_t o = 0; o < cout; ++o) {
      const int8_t* lane = weights + (o >> 2) * steps * 16 + (o & 3) * 4;
      for (int32_t v = 0; v < vectors; ++v) { /* the padding reads as 0, so the inputs' needs no predicate */
        const mve_pred16_t tail = vctp8q(cin - 16 * v);
        vstrbq_s8(unpacked + 16 * v, vldrbq_gather_offset_z_s8(lane + 64 * v, lane_gather, tail));
      }
      const int32_t bo = bias[o];
      const tvm_memplan_scale mo = tvm_memplan_scale_of(multiplier[o], fixed);
      const int8_t* xp = packed;
      int32_t p = 0;
      for (; p + 4 <= n; p += 4, xp += 4 * row) { /* 4 pixels share each weight vector */
        const int8_t *x0 = xp, *x1 = xp + row, *x2 = xp + 2 * row, *x3 = xp + 3 * row, *w = unpacked;
        int32_t a0 = bo, a1 = bo, a2 = bo, a3 = bo;
        for (int32_t v = 0; v < vectors; ++v, w += 16, x0 += 16, x1 += 16, x2 += 16, x3 += 16) {
          const int8x16_t wv = vldrbq_s8(w);
          a0 = vmladavaq_s8(a0, vldrbq_s8(x0), wv);
          a1 = vmladavaq_s8(a1, vldrbq_s8(x1), wv);
          a2 = vmladavaq_s8(a2, vldrbq_s8(x2), wv);
          a3 = vmladavaq_s8(a3, vldrbq_s8(x3), wv);
        }
        const int32_t at = p0 + p;
        /* the 4 codes at once */
        const int32x4_t acc = vsetq_lane_s32(a3, vsetq_lane_s32(a2, vsetq_lane_s32(a1, vdupq_n_s32(a0), 1), 2), 3);
        int32x4_t code = tvm_memplan_requantize_x4(acc, mo, y_zp, vdupq_n_s32(low), vdupq_n_s32(high));
        if (add) { /* tvm_memplan_add's fmaf(a, ratio_a, fmaf(b, ratio_b, constant)) as two VFMA */
          const float32x4_t mine = vcvtq_f32_s32(code);
          const float32x4_t other = vcvtq_f32_s32(vldrbq_s32(residual + o * pixels + at));
          const float32x4_t a = code_first ? mine : other, b = code_first ? other : mine;
          code = vcvtnq_s32_f32(vfmaq_n_f32(vfmaq_n_f32(vdupq_n_f32(constant), b, ratio_b), a, ratio_a));
          code = vminq_s32(vmaxq_s32(code, vdupq_n_s32(add_low)), vdupq_n_s32(add_high));
        }
        vstrbq_s32(y + o * y_plane + at, code); /* one narrowing store */
      }
      for (; p < n; ++p, xp += row) { /* the last 1 to 3 pixels one by one */
        int32_t a = bo;
        for (int32_t v = 0; v < vectors; ++v) a = vmladavaq_s8(a, vldrbq_s8(xp + 16 * v), vldrbq_s8(unpacked + 16 * v));
        TVM_MEMPLAN_STORE(o, p0 + p, a, mo);
      }
    }
  }
#undef TVM_MEMPLAN_STORE
  return 0;
}
"""
    + f"#define {POINTWISE_KERNEL} {MVE_POINTWISE_KERNEL}\n#define {DEPTHWISE_KERNEL} {MVE_DEPTHWISE_KERNEL}\n"
    + "#endif\n"
)


def with_mve_kernels(source: str) -> str:
    """``source`` (kernels.c after :func:`~tvm_memplan.deploy.mcu_dsp.with_micro_kernels`) with
    :data:`MVE_KERNELS` right after the whole-layer kernels' definitions, where it calls
    :data:`POINTWISE_KERNEL`: after them, so that the SMLAD definition keeps its name and the
    requantization helpers are defined; before the calls, which the ``#define`` redirects."""
    end = source.find(LAYER_KERNELS)
    calls = source[end + len(LAYER_KERNELS) :]
    if end < 0 or not any(f"{name}(" in calls for name in (POINTWISE_KERNEL, DEPTHWISE_KERNEL)):
        return source
    end += len(LAYER_KERNELS)
    return source[:end] + MVE_KERNELS + source[end:]
