"""The int8 1x1 convolution (and the dense, its one-pixel case) on Helium, the M-profile Vector Extension.

On a core with MVE (``__ARM_FEATURE_MVE``: the Cortex-M55, which ``qemu-system-arm`` emulates), a
call of :data:`~tvm_memplan.quant.mcu_kernels.POINTWISE_KERNEL` runs this definition instead of the
SMLAD one of :mod:`tvm_memplan.deploy.mcu_layers_c`: same arguments, same weights (in
:func:`~tvm_memplan.quant.dot_kernels.pack_dot_weights`'s layout), same requantization (the
``tvm_memplan_requantize`` and ``tvm_memplan_add`` those kernels define), so the output codes are
the same bit for bit. Each output is a dot product over the input channels, 16 at a time with one
``VMLADAVA`` (CMSIS-NN's ``arm_nn_mat_mult_nt_t_s8`` MVE loop), the last vector's missing channels
switched off by a ``VCTP`` predicate:

* a tile of pixels is transposed once from NCHW into pixel-major rows of input channels (a
  widening ``VLDRB`` of 8 pixels of one channel and a byte ``VSTRB`` scatter, 8 codes per pair);
* each output channel's weights are gathered once per tile into a contiguous row (``VLDRB`` gather
  of 4 steps of 4 channels), then 4 pixels share each loaded weight vector: per 16 MACs of a pixel,
  one ``VLDRB`` and one ``VMLADAVA``; the 4 codes are requantized as one vector (``VCVT``, ``VMUL``,
  ``VCVTN``, which rounds half to even as ``tvm_memplan_round``'s ``VCVTR`` does, ``VQADD``, clamp) and
  stored by one narrowing ``VSTRB``, a fused residual add as ``tvm_memplan_add``'s two FMAs (``VFMA``);
* a dense (one pixel) reads its inputs in place and its weights by the gather, each used once.

Elsewhere (M4, M7, the host) the preprocessor drops this text and the SMLAD kernel runs.
"""

from __future__ import annotations

from ..quant.mcu_kernels import POINTWISE_KERNEL
from .mcu_layers_c import LAYER_KERNELS

MVE_POINTWISE_KERNEL = "tvm_memplan_pointwise_mve_s8"
"""The Helium definition, which ``#define`` makes every call of :data:`POINTWISE_KERNEL` take."""
MVE_MARKER = "/* tvm-memplan: Helium (MVE) pointwise kernel */"
"""The first line of :data:`MVE_KERNELS`, for tests and readers of ``kernels.c``."""

MVE_KERNELS = (
    MVE_MARKER
    + r"""
#if defined(__ARM_FEATURE_MVE)
#include <arm_mve.h>
"""
    + f"static inline __attribute__((always_inline)) int32_t {MVE_POINTWISE_KERNEL}("
    + r"""
    void* x_, void* w_, void* bias_, void* multiplier_, void* residual_, void* y_, int32_t cin, int32_t cout,
    int32_t pixels, int32_t y_zp, int32_t low, int32_t high, int32_t add, int32_t code_first, float ratio_a,
    float ratio_b, float constant, int32_t add_low, int32_t add_high, int32_t y_plane) {
  const int8_t* x = (const int8_t*)x_;
  const int8_t* weights = (const int8_t*)w_; /* (cout / 4, steps, 4 lanes, 4 channels) */
  const int32_t* bias = (const int32_t*)bias_;
  const float* multiplier = (const float*)multiplier_;
  const int8_t* residual = (const int8_t*)residual_;
  int8_t* y = (int8_t*)y_;
  const int32_t steps = (cin + 3) >> 2, vectors = (cin + 15) >> 4, row = 16 * vectors;
  /* byte offsets of 4 steps of one lane's 4 channels in a block of 4 output channels */
  const uint8x16_t lane_gather = vaddq_u8(vandq_u8(vidupq_n_u8(0, 1), vdupq_n_u8(3)),
                                          vmulq_n_u8(vshrq_n_u8(vidupq_n_u8(0, 1), 2), 16));
#define TVM_MEMPLAN_STORE(o, p, acc, m)                                                                 \
  do {                                                                                                  \
    int32_t code = tvm_memplan_requantize((acc), (m), y_zp, low, high);                                 \
    if (add) {                                                                                          \
      const int32_t other = residual[(o) * pixels + (p)];                                               \
      code = code_first ? tvm_memplan_add(code, other, ratio_a, ratio_b, constant, add_low, add_high)   \
                        : tvm_memplan_add(other, code, ratio_a, ratio_b, constant, add_low, add_high);  \
    }                                                                                                   \
    y[(o) * y_plane + (p)] = (int8_t)code;                                                              \
  } while (0)
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
      TVM_MEMPLAN_STORE(o, 0, acc, multiplier[o]);
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
      const float mo = multiplier[o];
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
        /* the 4 codes at once: VCVT, VMUL, VCVTN (half to even, as tvm_memplan_round's VCVTR), VQADD, clamp */
        const int32x4_t acc = vsetq_lane_s32(a3, vsetq_lane_s32(a2, vsetq_lane_s32(a1, vdupq_n_s32(a0), 1), 2), 3);
        int32x4_t code = vqaddq_n_s32(vcvtnq_s32_f32(vmulq_n_f32(vcvtq_f32_s32(acc), mo)), y_zp);
        code = vminq_s32(vmaxq_s32(code, vdupq_n_s32(low)), vdupq_n_s32(high));
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
    + f"#define {POINTWISE_KERNEL} {MVE_POINTWISE_KERNEL}\n#endif\n"
)


def with_mve_kernels(source: str) -> str:
    """``source`` (kernels.c after :func:`~tvm_memplan.deploy.mcu_dsp.with_micro_kernels`) with
    :data:`MVE_KERNELS` right after the whole-layer kernels' definitions, where it calls
    :data:`POINTWISE_KERNEL`: after them, so that the SMLAD definition keeps its name and the
    requantization helpers are defined; before the calls, which the ``#define`` redirects."""
    end = source.find(LAYER_KERNELS)
    if end < 0 or f"{POINTWISE_KERNEL}(" not in source[end + len(LAYER_KERNELS) :]:
        return source
    end += len(LAYER_KERNELS)
    return source[:end] + MVE_KERNELS + source[end:]
