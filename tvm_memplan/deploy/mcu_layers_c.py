"""The C text of the whole-layer int8 kernels that :mod:`tvm_memplan.quant.mcu_kernels` calls.

Written in the manner of CMSIS-NN (``arm_depthwise_conv_s8``, ``arm_nn_mat_mult_kernel_s8_s16``)
for NCHW tensors:

* depthwise: each channel's input rows go once into a small row cache padded with the input zero
  point (a window of rows at a time, reused across output rows), so the inner loop has no bounds
  checks. A 3x3 window at stride 1 computes two outputs per word of 4 input bytes: ``SXTB16``
  splits it into the even and odd bytes, ``SMLAD`` adds taps 0 and 2 of a row, ``SMLABB``/``SMLATB``
  tap 1 (the pairing of TinyEngine's depthwise kernels); at stride 2 two outputs per two words
  (``PKHBT`` pairs the second output's bytes 2 and 4 for ``SMLADX``); rows of up to 72 outputs are
  unrolled whole (fixed offsets, no loop registers);
* pointwise (1x1, stride 1): a tile of pixels is packed once as ``SXTB16`` pairs of 4 input
  channels, then 2 output channels x 2 pixels accumulate on ``SMLAD`` over the channels (4
  accumulators in registers), reading the weights in :func:`.dot_kernels.pack_dot_weights`'s
  layout, the one :func:`.dot_kernels.conv2d_dot` reads; 5-8 input channels: one channel's
  weights in registers, 4 or 8 pixels a pass; one pixel (a dense): 4 channels a step;
* the stem (few input channels): two pixels' im2col'd windows and two channels' weights, interleaved
  so that one ``LDRD`` reads a pair of taps of both.

On the DSP the pointwise kernel's inner steps are inline-asm blocks: GCC's scheduler otherwise hoists
later steps' loads and spills the accumulators on some layer shapes; the asm fixes the registers (at
most 12) and the instruction order. Where four words move together (the 2x2 step's two pixels, the unpacked
weights of a channel pair, the stem's two pairs of taps, the depthwise ring's and whole-plane cache's rows, a split
row tile's input rows: ``tvm_memplan_copy_rows``, :data:`~tvm_memplan.quant.mcu_kernels.ROW_COPY_KERNEL`) one
``LDM``/``STM`` moves them, its four registers named (the list must ascend): one instruction where ``LDRD`` takes two.

They requantize each output as MLAS does (float32 multiply, clamp, round half to even), with the
channel's bias and multiplier loaded once; built with ``TVM_MEMPLAN_FIXED_POINT`` (``build --requantize
fixed``), a layer whose multipliers fit (:func:`.mcu_kernels.fits_fixed_point`) requantizes in integers as
CMSIS-NN does (one ``SMMLAR`` by the multiplier times 2^32), within 1 LSB of MLAS's codes. Without the DSP
extension (the host build) the same code runs on portable definitions of the intrinsics.
"""

from __future__ import annotations

from ..quant.mcu_kernels import (
    DEPTHWISE_KERNEL,
    MAX_PLANE,
    MAX_ROWS,
    MAX_WINDOW,
    POINTWISE_KERNEL,
    STACK_BYTES,
    UNPACK_TILE,
    WINDOW_KERNEL,
)

DEPTHWISE_PLANE = """\
  for (int32_t plane = 0; plane < planes; ++plane) {
    const int32_t channel = plane % channels;
    const int8_t* src = x + plane * h * w;
    const int8_t* tap = weights + channel * kh * kw;
    int8_t* dst = y + plane * y_plane;
    const int32_t b = bias[channel];
    const tvm_memplan_scale m = tvm_memplan_scale_of(multiplier[channel], TVM_MEMPLAN_FIXED_POINT && fixed_point);
"""
"""The head of a depthwise kernel's loop over planes: the plane's input, taps, output, bias and scale (one text for
the SMLAD kernel here and the Helium one in :mod:`.mcu_mve`)."""

POINTWISE_PARAMETERS = """
    void* x_, void* w_, void* bias_, void* multiplier_, void* residual_, void* y_, int32_t cin, int32_t cout,
    int32_t pixels, int32_t y_zp, int32_t low, int32_t high, int32_t add, int32_t code_first, float ratio_a,
    float ratio_b, float constant, int32_t add_low, int32_t add_high, int32_t fixed_point, int32_t y_plane)"""
"""A pointwise kernel's parameters (its SMLAD body's after the tile buffers' pointers)."""

POINTWISE_HEAD = (
    POINTWISE_PARAMETERS
    + r""" {
  const int8_t* x = (const int8_t*)x_;
  const int8_t* weights = (const int8_t*)w_; /* (cout / 4, steps, 4 lanes, 4 channels) */
  const int32_t* bias = (const int32_t*)bias_;
  const float* multiplier = (const float*)multiplier_;
  const int8_t* residual = (const int8_t*)residual_;
  int8_t* y = (int8_t*)y_;
  const int32_t fixed = TVM_MEMPLAN_FIXED_POINT && fixed_point;
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
"""
)
"""The parameters of a pointwise kernel, its operands' pointers and ``TVM_MEMPLAN_STORE``, the requantizing store of
one output code (with the residual add): one text for the SMLAD kernel here and the Helium one in :mod:`.mcu_mve`."""


DEPTHWISE_PARAMETERS = """
    void* x_, void* w_, void* bias_, void* multiplier_, void* y_, int32_t planes, int32_t channels, int32_t h,
    int32_t w, int32_t oh, int32_t ow, int32_t kh, int32_t kw, int32_t sh, int32_t sw, int32_t top, int32_t left,
    int32_t x_zp, int32_t y_zp, int32_t low, int32_t high, int32_t fixed_point, int32_t y_plane)"""
"""The depthwise kernel's parameters (its body's after the cache's pointer)."""

DEPTHWISE_BUFFER = r"""
/* the depthwise cache's geometry: its rows' stride, whether the plane goes whole, its bytes */
#define TVM_MEMPLAN_DEPTHWISE_GEOMETRY                                                                       \
  const int32_t cols = (ow - 1) * sw + kw, filled = left + w;                                                \
  /* 4 bytes of slack for word reads */                                                                      \
  const int32_t stride = ((cols > filled ? cols : filled) + 7) & ~3;                                         \
  /* a small plane goes whole into the cache, padded, each row copied once; a large one through a ring of the \
   * window's rows, each held twice (at slot and slot + ring): any window is kh consecutive rows */          \
  const int32_t span = (oh - 1) * sh + kh, whole = span * stride <= TVM_MEMPLAN_MAX_PLANE;                   \
  /* each row's input columns start on a word (its first byte at left + shift), so that the row copies are   \
   * word-aligned */                                                                                         \
  /* a 3x3 ring at stride 1 holds kh + 1 rows where they fit MAX_PLANE (twice): two output rows' windows */     \
  const int32_t ring = kh == 3 && kw == 3 && sw == 1 && sh == 1 && 2 * (kh + 1) * stride <= TVM_MEMPLAN_MAX_PLANE \
                           ? kh + 1                                                                        \
                           : kh;                                                                           \
  const int32_t cache_shift = (4 - (left & 3)) & 3, bytes = (whole ? span * stride : 2 * ring * stride) + 3;
"""
"""``TVM_MEMPLAN_DEPTHWISE_GEOMETRY``: the depthwise cache's geometry, which its body and the wrapper that
places the cache both compute."""


LAYER_KERNELS = (
    r"""
/* tvm-memplan's whole-layer int8 kernels (NCHW, requantization fused; see tvm_memplan.quant.mcu_kernels) */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__ARM_FEATURE_DSP)
#include <arm_acle.h>
static inline __attribute__((always_inline)) uint32_t tvm_memplan_even(uint32_t word) { return __sxtb16(word); }
static inline __attribute__((always_inline)) uint32_t tvm_memplan_odd(uint32_t word) {
  uint32_t pairs;
  __asm__("sxtb16 %0, %1, ror #8" : "=r"(pairs) : "r"(word));
  return pairs;
}
#define tvm_memplan_smlad(a, b, acc) __smlad((a), (b), (acc))
#define tvm_memplan_smladx(a, b, acc) __smladx((a), (b), (acc))
/* the bottom half of a, the top half of b: one PKHBT */
static inline __attribute__((always_inline)) uint32_t tvm_memplan_pkhbt(uint32_t a, uint32_t b) {
  uint32_t packed;
  __asm__("pkhbt %0, %1, %2" : "=r"(packed) : "r"(a), "r"(b));
  return packed;
}
#define tvm_memplan_smlabb(a, b, acc) __smlabb((int32_t)(a), (b), (acc))
#define tvm_memplan_smlatb(a, b, acc) __smlatb((int32_t)(a), (b), (acc))
#define tvm_memplan_smlabt(a, b, acc) __smlabt((int32_t)(a), (int32_t)(b), (acc))
#define tvm_memplan_smlatt(a, b, acc) __smlatt((int32_t)(a), (int32_t)(b), (acc))
#else
static inline uint32_t tvm_memplan_even(uint32_t word) {
  return (uint32_t)(uint16_t)(int16_t)(int8_t)(word & 0xff) | ((uint32_t)(uint16_t)(int16_t)(int8_t)(word >> 16) << 16);
}
static inline uint32_t tvm_memplan_odd(uint32_t word) { return tvm_memplan_even(word >> 8 | word << 24); }
static inline int32_t tvm_memplan_smlad(uint32_t a, uint32_t b, int32_t acc) {
  return acc + (int16_t)(a & 0xffff) * (int16_t)(b & 0xffff) + (int16_t)(a >> 16) * (int16_t)(b >> 16);
}
static inline int32_t tvm_memplan_smladx(uint32_t a, uint32_t b, int32_t acc) {
  return acc + (int16_t)(a & 0xffff) * (int16_t)(b >> 16) + (int16_t)(a >> 16) * (int16_t)(b & 0xffff);
}
static inline uint32_t tvm_memplan_pkhbt(uint32_t a, uint32_t b) { return (a & 0xffffu) | (b & 0xffff0000u); }
static inline int32_t tvm_memplan_smlabb(uint32_t a, int32_t b, int32_t acc) {
  return acc + (int16_t)(a & 0xffff) * (int16_t)b;
}
static inline int32_t tvm_memplan_smlatb(uint32_t a, int32_t b, int32_t acc) {
  return acc + (int16_t)(a >> 16) * (int16_t)b;
}
static inline int32_t tvm_memplan_smlabt(uint32_t a, uint32_t b, int32_t acc) {
  return acc + (int16_t)(a & 0xffff) * (int16_t)(b >> 16);
}
static inline int32_t tvm_memplan_smlatt(uint32_t a, uint32_t b, int32_t acc) {
  return acc + (int16_t)(a >> 16) * (int16_t)(b >> 16);
}
#endif
/* the low and high words of *p, then p + 1: one post-indexed LDRD (GCC splits a uint64_t used as two halves
 * into two LDR) */
static inline __attribute__((always_inline)) const uint64_t* tvm_memplan_ldrd(
    const uint64_t* p, uint32_t* low, uint32_t* high) {
#if defined(__ARM_FEATURE_DSP)
  __asm__("ldrd %0, %1, [%2], #8" : "=r"(*low), "=r"(*high), "+r"(p) : "m"(*p));
  return p;
#else
  *low = (uint32_t)*p, *high = (uint32_t)(*p >> 32);
  return p + 1;
#endif
}
/* the low and high words at p, then p past them and the next pair (one pixel's steps in a tile of two pixels'): one
 * LDRD, post-indexed */
static inline __attribute__((always_inline)) const uint64_t* tvm_memplan_ldrd_skip(
    const uint64_t* p, uint32_t* low, uint32_t* high) {
#if defined(__ARM_FEATURE_DSP)
  __asm__("ldrd %0, %1, [%2], #16" : "=r"(*low), "=r"(*high), "+r"(p) : "m"(*p));
  return p;
#else
  *low = (uint32_t)*p, *high = (uint32_t)(*p >> 32);
  return p + 2;
#endif
}
/* the low and high words at p: one LDRD, its address a base register plus a constant the compiler picks. "Uv" (a VFP
 * load's address: a register and a multiple of 4 within +-1020) is LDRD's immediate range too, where "m" would allow
 * LDR's 4095 */
#if defined(__ARM_FEATURE_DSP)
#define TVM_MEMPLAN_LDRD_M(p, low, high) \
  __asm__("ldrd %0, %1, %2" : "=r"(low), "=r"(high) : "Uv"(*(const uint64_t*)(p)))
#else
#define TVM_MEMPLAN_LDRD_M(p, low, high)                               \
  do {                                                                 \
    const uint64_t tvm_memplan_pair_ = *(const uint64_t*)(p);          \
    low = (uint32_t)tvm_memplan_pair_, high = (uint32_t)(tvm_memplan_pair_ >> 32); \
  } while (0)
#endif
/* the low and high words at byte `offset` (a literal) from p: one LDRD with an immediate offset */
#if defined(__ARM_FEATURE_DSP)
#define TVM_MEMPLAN_LDRD_AT(p, offset, low, high) \
  __asm__("ldrd %0, %1, [%2, #" #offset "]" : "=r"(low), "=r"(high) : "r"(p), "m"(*(const uint64_t(*)[8])(p)))
#else
#define TVM_MEMPLAN_LDRD_AT(p, offset, low, high)                                       \
  do {                                                                                  \
    const uint64_t tvm_memplan_pair_ = *(const uint64_t*)((const int8_t*)(p) + offset); \
    low = (uint32_t)tvm_memplan_pair_, high = (uint32_t)(tvm_memplan_pair_ >> 32);      \
  } while (0)
#endif
/* the eight SMLADs of a pointwise 2x2 step (the second channel's pair loaded into the first's between them) and
 * the operands of the asm block that runs them, shared by the two DSP variants of TVM_MEMPLAN_STEP_2X2 below */
#if defined(__ARM_FEATURE_DSP)
#define TVM_MEMPLAN_MACS_2X2                                                                                   \
  "smlad %[a0], %[u0], %[x0], %[a0]\n\t"                                                                       \
  "smlad %[a0], %[u1], %[x1], %[a0]\n\t"                                                                       \
  "smlad %[a1], %[u0], %[y0], %[a1]\n\t"                                                                       \
  "smlad %[a1], %[u1], %[y1], %[a1]\n\t"                                                                       \
  "ldrd %[u0], %[u1], [%[v]], #8\n\t"                                                                          \
  "smlad %[b0], %[u0], %[x0], %[b0]\n\t"                                                                       \
  "smlad %[b0], %[u1], %[x1], %[b0]\n\t"                                                                       \
  "smlad %[b1], %[u0], %[y0], %[b1]\n\t"                                                                       \
  "smlad %[b1], %[u1], %[y1], %[b1]"
#define TVM_MEMPLAN_OPERANDS_2X2(v, q, a0, a1, b0, b1)                                                         \
  [a0] "+r"(a0), [a1] "+r"(a1), [b0] "+r"(b0), [b1] "+r"(b1), [v] "+r"(v), [q] "+r"(q), [u0] "=&r"(u0_),       \
  [u1] "=&r"(u1_), [x0] "=&r"(x0_), [x1] "=&r"(x1_), [y0] "=&r"(y0_), [y1] "=&r"(y1_)
#endif
/* one step of 4 input channels of the pointwise 2x2 block: channels o and o + 1 (their unpacked pairs at v), pixels
 * p and p + 1 (their packed pairs at q), both pointers advanced: one LDM of the two pixels' four words, two LDRD of
 * the channels' pairs, eight SMLAD (11 instructions for 16 MACs; LDM's register list must ascend, so its four
 * registers are named). On the DSP one asm block, so that the compiler's scheduler cannot hoist later steps' loads
 * and spill the accumulators (it did for some layers' shapes, 56 -> 336 channels at 5x5 among them): 12 registers,
 * the second channel's pair loaded into the first's */
#if defined(__ARM_FEATURE_DSP) && !defined(__ARM_ARCH_8M_MAIN__)
#define TVM_MEMPLAN_STEP_2X2(v, q, a0, a1, b0, b1)                                                             \
  do {                                                                                                         \
    register uint32_t x0_ __asm__("r0"), x1_ __asm__("r1"), y0_ __asm__("r2"), y1_ __asm__("r3");          \
    uint32_t u0_, u1_;                                                                                         \
    __asm__(                                                                                                   \
        "ldm %[q]!, {%[x0], %[x1], %[y0], %[y1]}\n\t"                                                          \
        "ldrd %[u0], %[u1], [%[v]], #8\n\t"                                                                    \
        TVM_MEMPLAN_MACS_2X2                                                                                   \
        : TVM_MEMPLAN_OPERANDS_2X2(v, q, a0, a1, b0, b1)                                                       \
        :                                                                                                      \
        : "memory");                                                                                           \
  } while (0)
/* Armv8.1-M without MVE (the M55 built +nomve) keeps LR for its low-overhead loops, and GCC finds no registers
 * for the LDM's four named ones beside the other eight: four LDRD, any registers */
#elif defined(__ARM_FEATURE_DSP)
#define TVM_MEMPLAN_STEP_2X2(v, q, a0, a1, b0, b1)                                                             \
  do {                                                                                                         \
    uint32_t u0_, u1_, x0_, x1_, y0_, y1_;                                                                     \
    __asm__(                                                                                                   \
        "ldrd %[u0], %[u1], [%[v]], #8\n\t"                                                                    \
        "ldrd %[x0], %[x1], [%[q]], #8\n\t"                                                                    \
        "ldrd %[y0], %[y1], [%[q]], #8\n\t"                                                                    \
        TVM_MEMPLAN_MACS_2X2                                                                                   \
        : TVM_MEMPLAN_OPERANDS_2X2(v, q, a0, a1, b0, b1)                                                       \
        :                                                                                                      \
        : "memory");                                                                                           \
  } while (0)
#else
#define TVM_MEMPLAN_STEP_2X2(v, q, a0, a1, b0, b1)                                                           \
  do {                                                                                                         \
    uint32_t ue, uo, te, to, x0e, x0o, x1e, x1o;                                                               \
    v = tvm_memplan_ldrd(v, &ue, &uo), v = tvm_memplan_ldrd(v, &te, &to);                                      \
    q = tvm_memplan_ldrd(q, &x0e, &x0o), q = tvm_memplan_ldrd(q, &x1e, &x1o);                                  \
    a0 = tvm_memplan_smlad(uo, x0o, tvm_memplan_smlad(ue, x0e, a0));                                           \
    a1 = tvm_memplan_smlad(uo, x1o, tvm_memplan_smlad(ue, x1e, a1));                                           \
    b0 = tvm_memplan_smlad(to, x0o, tvm_memplan_smlad(te, x0e, b0));                                           \
    b1 = tvm_memplan_smlad(to, x1o, tvm_memplan_smlad(te, x1e, b1));                                           \
  } while (0)
#endif
/* all steps of the pointwise 2x2 block over unpacked weights in one asm loop, k steps an iteration (the largest k of
 * 8, 7, 6, 5, 4 or 2 that divides the steps: the loop's end test, 3 instructions, once per k steps; fewer than 12 or
 * 14 steps, or a count none divides, keep TVM_MEMPLAN_STEP_2X2): per step one
 * LDM of the channel pair's four unpacked words, one LDM of the two pixels' four packed words, eight SMLAD (10
 * instructions for 16 MACs, where TVM_MEMPLAN_STEP_2X2 takes 11). 14 registers, all named: GCC's regional allocator
 * found none for them otherwise. The loop ends where the next word of the unpacked weights is TVM_MEMPLAN_SENTINEL,
 * which no SXTB16 pair is (0x4000 is no sign-extended byte): no counter register */
#define TVM_MEMPLAN_SENTINEL 0x40004000u
#if defined(__ARM_FEATURE_DSP) && !defined(__ARM_ARCH_8M_MAIN__)
#define TVM_MEMPLAN_STEP_LDM                         \
  "ldm %[v]!, {%[u0], %[u1], %[t0], %[t1]}\n\t"      \
  "ldm %[q]!, {%[x0], %[x1], %[y0], %[y1]}\n\t"      \
  "smlad %[a0], %[u0], %[x0], %[a0]\n\t"             \
  "smlad %[a0], %[u1], %[x1], %[a0]\n\t"             \
  "smlad %[a1], %[u0], %[y0], %[a1]\n\t"             \
  "smlad %[a1], %[u1], %[y1], %[a1]\n\t"             \
  "smlad %[b0], %[t0], %[x0], %[b0]\n\t"             \
  "smlad %[b0], %[t1], %[x1], %[b0]\n\t"             \
  "smlad %[b1], %[t0], %[y0], %[b1]\n\t"             \
  "smlad %[b1], %[t1], %[y1], %[b1]\n\t"
#define TVM_MEMPLAN_STEPS_LOOP(body, v, q, a0, a1, b0, b1)                                                      \
  do {                                                                                                         \
    register uint32_t x0_ __asm__("r0"), x1_ __asm__("r1"), y0_ __asm__("r2"), y1_ __asm__("r3");          \
    register uint32_t u0_ __asm__("r8"), u1_ __asm__("r9"), t0_ __asm__("r10"), t1_ __asm__("r11");        \
    register int32_t a0_ __asm__("r4") = (a0), a1_ __asm__("r5") = (a1), b0_ __asm__("r6") = (b0);         \
    register int32_t b1_ __asm__("r7") = (b1);                                                                 \
    register const uint64_t* v_ __asm__("r12") = (v);                                                          \
    register const uint64_t* q_ __asm__("lr") = (q);                                                           \
    __asm__("1:\n\t" body "ldr %[x0], [%[v]]\n\t"                                                              \
            "cmp %[x0], %[sentinel]\n\t"                                                                       \
            "bne 1b"                                                                                           \
            : [a0] "+r"(a0_), [a1] "+r"(a1_), [b0] "+r"(b0_), [b1] "+r"(b1_), [v] "+r"(v_), [q] "+r"(q_),      \
              [x0] "=&r"(x0_), [x1] "=&r"(x1_), [y0] "=&r"(y0_), [y1] "=&r"(y1_), [u0] "=&r"(u0_),             \
              [u1] "=&r"(u1_), [t0] "=&r"(t0_), [t1] "=&r"(t1_)                                                \
            : [sentinel] "I"(TVM_MEMPLAN_SENTINEL)                                                             \
            : "cc", "memory");                                                                                 \
    (a0) = a0_, (a1) = a1_, (b0) = b0_, (b1) = b1_, (v) = v_, (q) = q_;                                        \
  } while (0)
#define TVM_MEMPLAN_LDM2 TVM_MEMPLAN_STEP_LDM TVM_MEMPLAN_STEP_LDM
#define TVM_MEMPLAN_LDM4 TVM_MEMPLAN_LDM2 TVM_MEMPLAN_LDM2
#define TVM_MEMPLAN_STEPS_2X2(steps, v, q, a0, a1, b0, b1)                                                      \
  do {                                                                                                         \
    if ((steps) % 8 == 0 && (steps) >= 16) {                                                                   \
      TVM_MEMPLAN_STEPS_LOOP(TVM_MEMPLAN_LDM4 TVM_MEMPLAN_LDM4, v, q, a0, a1, b0, b1);                         \
    } else if ((steps) % 7 == 0 && (steps) >= 14) {                                                            \
      TVM_MEMPLAN_STEPS_LOOP(TVM_MEMPLAN_LDM4 TVM_MEMPLAN_LDM2 TVM_MEMPLAN_STEP_LDM, v, q, a0, a1, b0, b1);    \
    } else if ((steps) % 6 == 0 && (steps) >= 12) {                                                            \
      TVM_MEMPLAN_STEPS_LOOP(TVM_MEMPLAN_LDM4 TVM_MEMPLAN_LDM2, v, q, a0, a1, b0, b1);                         \
    } else if ((steps) % 5 == 0 && (steps) >= 15) {                                                            \
      TVM_MEMPLAN_STEPS_LOOP(TVM_MEMPLAN_LDM4 TVM_MEMPLAN_STEP_LDM, v, q, a0, a1, b0, b1);                     \
    } else if ((steps) % 4 == 0 && (steps) >= 12) {                                                            \
      TVM_MEMPLAN_STEPS_LOOP(TVM_MEMPLAN_LDM4, v, q, a0, a1, b0, b1);                                          \
    } else if ((steps) % 2 == 0 && (steps) >= 14) {                                                            \
      TVM_MEMPLAN_STEPS_LOOP(TVM_MEMPLAN_LDM2, v, q, a0, a1, b0, b1);                                          \
    } else { /* few steps: GCC's unrolled TVM_MEMPLAN_STEP_2X2, no moves into the named registers */           \
      _Pragma("GCC unroll 4") for (int32_t s_ = 0; s_ < (steps); ++s_) TVM_MEMPLAN_STEP_2X2(v, q, a0, a1, b0, b1); \
    }                                                                                                          \
  } while (0)
#else
#define TVM_MEMPLAN_STEPS_2X2(steps, v, q, a0, a1, b0, b1)                                                      \
  do {                                                                                                         \
    _Pragma("GCC unroll 4") for (int32_t s_ = 0; s_ < (steps); ++s_) TVM_MEMPLAN_STEP_2X2(v, q, a0, a1, b0, b1); \
  } while (0)
#endif
static inline __attribute__((always_inline)) uint32_t tvm_memplan_word(const int8_t* p) {
  uint32_t word;
  memcpy(&word, p, 4);
  return word;
}
/* n bytes from `from` to `to` and to `to + other` (a row of the depthwise ring, held twice): on the DSP, where all
 * three are word-aligned, 16 bytes at a time (one LDM, two STM; their register lists must ascend, so the registers
 * are named); then a word at a time (LDR, which may be unaligned on the M4 and M7, and two STR to word-aligned rows;
 * the empty asm keeps GCC from turning the loop back into memcpy calls, which cost more for rows of a few dozen
 * bytes), then the last bytes */
static inline __attribute__((always_inline)) void tvm_memplan_copy_row_twice(
    int8_t* to, int32_t other, const int8_t* from, int32_t n) {
  int32_t i = 0;
#if defined(__ARM_FEATURE_DSP)
  if ((((uintptr_t)to | (uintptr_t)from | (uintptr_t)other) & 3) == 0) {
    const int8_t* at = from;
    int8_t *first = to, *second = to + other;
#pragma GCC unroll 4
    for (; i + 15 < n; i += 16) {
      register uint32_t w0_ __asm__("r0"), w1_ __asm__("r1"), w2_ __asm__("r2"), w3_ __asm__("r3");
      __asm__ volatile(  /* (it stores) */
          "ldm %[at]!, {%[w0], %[w1], %[w2], %[w3]}\n\t"
          "stm %[first]!, {%[w0], %[w1], %[w2], %[w3]}\n\t"
          "stm %[second]!, {%[w0], %[w1], %[w2], %[w3]}"
          : [at] "+r"(at), [first] "+r"(first), [second] "+r"(second), [w0] "=&r"(w0_), [w1] "=&r"(w1_),
            [w2] "=&r"(w2_), [w3] "=&r"(w3_)
          :
          : "memory");
    }
  }
#endif
#pragma GCC unroll 4
  for (; i + 3 < n; i += 4) {
    uint32_t word = tvm_memplan_word(from + i);
    __asm__("" : "+r"(word));
    memcpy(to + i, &word, 4), memcpy(to + other + i, &word, 4);
  }
  for (; i < n; ++i) to[i] = to[other + i] = from[i];
}
/* n bytes from `from` to `to`, as tvm_memplan_copy_row_twice moves them (16 bytes by LDM/STM where both are
 * word-aligned, then words, then bytes) but to one destination: a row of the depthwise whole-plane cache, a split
 * row tile's input rows */
static inline __attribute__((always_inline)) void tvm_memplan_copy_row(int8_t* to, const int8_t* from, int32_t n) {
  int32_t i = 0;
#if defined(__ARM_FEATURE_DSP)
  if ((((uintptr_t)to | (uintptr_t)from) & 3) == 0) {
    const int8_t* at = from;
    int8_t* first = to;
#pragma GCC unroll 4
    for (; i + 15 < n; i += 16) {
      register uint32_t w0_ __asm__("r0"), w1_ __asm__("r1"), w2_ __asm__("r2"), w3_ __asm__("r3");
      __asm__ volatile(  /* (it stores) */
          "ldm %[at]!, {%[w0], %[w1], %[w2], %[w3]}\n\t"
          "stm %[first]!, {%[w0], %[w1], %[w2], %[w3]}"
          : [at] "+r"(at), [first] "+r"(first), [w0] "=&r"(w0_), [w1] "=&r"(w1_), [w2] "=&r"(w2_), [w3] "=&r"(w3_)
          :
          : "memory");
    }
  }
#endif
#pragma GCC unroll 4
  for (; i + 3 < n; i += 4) {
    uint32_t word = tvm_memplan_word(from + i);
    __asm__("" : "+r"(word));
    memcpy(to + i, &word, 4);
  }
  for (; i < n; ++i) to[i] = from[i];
}
/* tvm_memplan_copy_rows (mcu_kernels.ROW_COPY_KERNEL): n bytes of each of `planes` planes, x_plane bytes apart
 * from x + offset, packed in y */
static inline __attribute__((always_inline)) int32_t tvm_memplan_copy_rows(
    void* x_, void* y_, int32_t planes, int32_t n, int32_t x_plane, int32_t offset) {
  const int8_t* x = (const int8_t*)x_ + offset;
  int8_t* y = (int8_t*)y_;
  for (int32_t p = 0; p < planes; ++p, x += x_plane, y += n) tvm_memplan_copy_row(y, x, n);
  return 0;
}
/* tvm_memplan_place_rows (mcu_kernels.ROW_PLACE_KERNEL): n bytes of each of `planes` planes packed in x, to y,
 * y_plane bytes apart (a line buffer's kept rows at the top of the next row tile's buffer) */
static inline __attribute__((always_inline)) int32_t tvm_memplan_place_rows(
    void* x_, void* y_, int32_t planes, int32_t n, int32_t y_plane) {
  const int8_t* x = (const int8_t*)x_;
  int8_t* y = (int8_t*)y_;
  for (int32_t p = 0; p < planes; ++p, x += n, y += y_plane) tvm_memplan_copy_row(y, x, n);
  return 0;
}
/* a float rounded half to even (the FPSCR's default mode) to int32, saturating: VCVTR on a Cortex-M FPU */
static inline __attribute__((always_inline)) int32_t tvm_memplan_round(float value) {
#if defined(__ARM_FP) && (__ARM_FP & 4)
  float rounded;
  int32_t code;
  __asm__("vcvtr.s32.f32 %0, %1" : "=t"(rounded) : "t"(value));
  memcpy(&code, &rounded, 4);
  return code;
#else
  return value >= 2147483520.0f ? 2147483647 : value <= -2147483648.0f ? (-2147483647 - 1) : (int32_t)nearbyintf(value);
#endif
}
static inline __attribute__((always_inline)) int32_t tvm_memplan_clamp(int32_t code, int32_t low, int32_t high) {
#if defined(__ARM_FEATURE_DSP)  /* one SSAT or USAT where the bounds are a type's */
  if (low == -128 && high == 127) return __ssat(code, 8);
  if (low == 0 && high == 255) return __usat(code, 8);
#endif
  return code < low ? low : code > high ? high : code;
}
/* a rounded code plus a zero point, saturated to [low, high] */
static inline __attribute__((always_inline)) int32_t tvm_memplan_offset(
    int32_t code, int32_t zero_point, int32_t low, int32_t high) {
#if defined(__ARM_FEATURE_DSP)
  return tvm_memplan_clamp(__qadd(code, zero_point), low, high);
#else
  const int64_t sum = (int64_t)code + zero_point;
  return (int32_t)(sum < low ? low : sum > high ? high : sum);
#endif
}
/* TVM_MEMPLAN_FIXED_POINT 1 (build --requantize fixed): integer requantization, as CMSIS-NN's arm_nn_requantize
 * (gemmlowp's rounding multiply), within 1 LSB of onnxruntime's float rounding (it differs only where the float
 * product rounds across a tie); 0: MLAS's float rounding, onnxruntime's codes exactly */
#ifndef TVM_MEMPLAN_FIXED_POINT
#define TVM_MEMPLAN_FIXED_POINT 0
#endif
/* a channel's requantization scale: MLAS's float multiplier or, where fixed (a constant the compiler folds), the
 * same multiplier times 2^32 as an integer (exact for multipliers of at least 2^-9, float32's 24 bits) */
typedef struct {
  float m;
  int32_t q;
  int32_t fixed;
} tvm_memplan_scale;
static inline __attribute__((always_inline)) tvm_memplan_scale tvm_memplan_scale_of(float m, int32_t fixed) {
  tvm_memplan_scale s = {m, fixed ? (int32_t)(m * 4294967296.0f + 0.5f) : 0, fixed};
  return s;
}
/* zero_point + acc * q / 2^32 rounded half up: one SMMLAR (the accumulator, the multiplier, the zero point) */
static inline __attribute__((always_inline)) int32_t tvm_memplan_smmlar(int32_t acc, int32_t q, int32_t zero_point) {
#if defined(__ARM_FEATURE_DSP)
  int32_t code;
  __asm__("smmlar %0, %1, %2, %3" : "=r"(code) : "r"(acc), "r"(q), "r"(zero_point));
  return code;
#else
  return (int32_t)((((int64_t)zero_point << 32) + (int64_t)acc * q + 0x80000000LL) >> 32);
#endif
}
/* MLAS's requantization: float32 multiply, round half to even, zero point, clamp (clamping after the
 * rounding is the same as before it: the bounds are integers); fixed: SMMLAR and the clamp (SSAT) */
static inline __attribute__((always_inline)) int32_t tvm_memplan_requantize(
    int32_t acc, tvm_memplan_scale scale, int32_t zero_point, int32_t low, int32_t high) {
  if (scale.fixed) return tvm_memplan_clamp(tvm_memplan_smmlar(acc, scale.q, zero_point), low, high);
  return tvm_memplan_offset(tvm_memplan_round((float)acc * scale.m), zero_point, low, high);
}
/* MLAS's QLinearAdd of two codes: fma(a, ra, fma(b, rb, constant)), rounded half to even, saturated (kept in float
 * with the fixed-point requantization too: an integer add, CMSIS-NN's arm_elementwise_add_s8, rounds ties the other
 * way, and on MobileNetV2 those few codes grow to 2 LSB at the output, where onnxruntime's own spread is 0) */
static inline __attribute__((always_inline)) int32_t tvm_memplan_add(
    int32_t a, int32_t b, float ratio_a, float ratio_b, float constant, int32_t low, int32_t high) {
  return tvm_memplan_clamp(tvm_memplan_round(fmaf((float)a, ratio_a, fmaf((float)b, ratio_b, constant))), low, high);
}
/* two taps of a row as an int16 pair for SMLAD: bottom a, top b */
static inline uint32_t tvm_memplan_pair(int8_t a, int8_t b) {
  return (uint32_t)(uint16_t)(int16_t)a | ((uint32_t)(uint16_t)(int16_t)b << 16);
}
"""
    + f"#define TVM_MEMPLAN_MAX_WINDOW {MAX_WINDOW}\n#define TVM_MEMPLAN_MAX_ROWS {MAX_ROWS}\n"
    + f"#define TVM_MEMPLAN_MAX_PLANE {MAX_PLANE}\n#define TVM_MEMPLAN_STACK_BYTES {STACK_BYTES}\n"
    + f"#define TVM_MEMPLAN_UNPACK_TILE {UNPACK_TILE}\n"
    + DEPTHWISE_BUFFER
    + f"static inline __attribute__((always_inline)) int32_t {DEPTHWISE_KERNEL}_in(int8_t* padded, "
    + DEPTHWISE_PARAMETERS
    + r""" {
  const int8_t* x = (const int8_t*)x_;
  const int8_t* weights = (const int8_t*)w_;
  const int32_t* bias = (const int32_t*)bias_;
  const float* multiplier = (const float*)multiplier_;
  int8_t* y = (int8_t*)y_;
  TVM_MEMPLAN_DEPTHWISE_GEOMETRY
  memset(padded, x_zp, bytes); /* the padding stays */
  int8_t* cache = padded + cache_shift;
"""
    + DEPTHWISE_PLANE
    + r"""    int32_t next = -top; /* the first input row not yet in the ring */
    uint32_t outer0 = 0, outer1 = 0, outer2 = 0, middle01 = 0;
    int32_t middle2 = 0;
    if (kh == 3 && kw == 3) {
      outer0 = tvm_memplan_pair(tap[0], tap[2]), outer1 = tvm_memplan_pair(tap[3], tap[5]);
      outer2 = tvm_memplan_pair(tap[6], tap[8]), middle01 = tvm_memplan_pair(tap[1], tap[4]), middle2 = tap[7];
    }
    for (int32_t r = 0; whole && r < h && r + top < span; ++r) {
      tvm_memplan_copy_row(cache + (r + top) * stride + left, src + r * w, w);
    }
    for (int32_t oy = 0; oy < oh; ++oy, dst += ow) {
      const int32_t first = oy * sh - top;
      /* two output rows at once (3x3 at stride 1, the whole plane or a ring of kh + 1 rows, rows of up to 72
       * outputs; at stride 2, where the rows would share one input row of three, GCC spilled: +7 %) */
      const int32_t two = kh == 3 && kw == 3 && sw == 1 && sh == 1 && (whole || ring > kh) && oy + 1 < oh && ow <= 72;
      if (next < first) next = first;
      for (; !whole && next < first + kh + (two ? sh : 0); ++next) { /* the columns between the padding, twice */
        int8_t* row = cache + (((next % ring) + ring) % ring) * stride + left;
        if (next < 0 || next >= h) {
          memset(row, x_zp, w), memset(row + ring * stride, x_zp, w);
        } else {
          tvm_memplan_copy_row_twice(row, ring * stride, src + next * w, w);
        }
      }
      const int8_t* r0 = whole ? cache + oy * sh * stride : cache + (((first % ring) + ring) % ring) * stride;
      if (two) {
        /* two output rows at once (the whole-plane cache, or the ring of 4 rows): their middle input rows are
         * loaded and split once (4 rows of words for 4 outputs, where one row at a time reads 6) */
#define TVM_MEMPLAN_PAIR2(at, out, ox)                                                               \
  do {                                                                                                \
    uint32_t e = tvm_memplan_word(at), o = tvm_memplan_odd(e);                                        \
    e = tvm_memplan_even(e);                                                                          \
    int32_t a0 = tvm_memplan_smlabb(o, middle01, tvm_memplan_smlad(e, outer0, b));                    \
    int32_t a1 = tvm_memplan_smlatb(e, middle01, tvm_memplan_smlad(o, outer0, b));                    \
    e = tvm_memplan_word((at) + stride), o = tvm_memplan_odd(e), e = tvm_memplan_even(e);             \
    a0 = tvm_memplan_smlabt(o, middle01, tvm_memplan_smlad(e, outer1, a0));                           \
    a1 = tvm_memplan_smlatt(e, middle01, tvm_memplan_smlad(o, outer1, a1));                           \
    int32_t c0 = tvm_memplan_smlabb(o, middle01, tvm_memplan_smlad(e, outer0, b));                    \
    int32_t c1 = tvm_memplan_smlatb(e, middle01, tvm_memplan_smlad(o, outer0, b));                    \
    e = tvm_memplan_word((at) + 2 * stride), o = tvm_memplan_odd(e), e = tvm_memplan_even(e);         \
    a0 = tvm_memplan_smlabb(o, middle2, tvm_memplan_smlad(e, outer2, a0));                            \
    a1 = tvm_memplan_smlatb(e, middle2, tvm_memplan_smlad(o, outer2, a1));                            \
    c0 = tvm_memplan_smlabt(o, middle01, tvm_memplan_smlad(e, outer1, c0));                           \
    c1 = tvm_memplan_smlatt(e, middle01, tvm_memplan_smlad(o, outer1, c1));                           \
    e = tvm_memplan_word((at) + 3 * stride), o = tvm_memplan_odd(e), e = tvm_memplan_even(e);         \
    c0 = tvm_memplan_smlabb(o, middle2, tvm_memplan_smlad(e, outer2, c0));                            \
    c1 = tvm_memplan_smlatb(e, middle2, tvm_memplan_smlad(o, outer2, c1));                            \
    (out)[0] = (int8_t)tvm_memplan_requantize(a0, m, y_zp, low, high);                                \
    (out)[ow] = (int8_t)tvm_memplan_requantize(c0, m, y_zp, low, high);                               \
    if ((ox) + 1 < ow) {                                                                              \
      (out)[1] = (int8_t)tvm_memplan_requantize(a1, m, y_zp, low, high);                              \
      (out)[ow + 1] = (int8_t)tvm_memplan_requantize(c1, m, y_zp, low, high);                         \
    }                                                                                                 \
  } while (0)
#pragma GCC unroll 36
        for (int32_t ox = 0; ox < ow; ox += 2) TVM_MEMPLAN_PAIR2(r0 + ox, dst + ox, ox);
#undef TVM_MEMPLAN_PAIR2
        ++oy, dst += ow; /* (the loop's step moves past the second row) */
      } else if (kh == 3 && kw == 3 && sw == 1) { /* two outputs per word: taps 0 and 2 on SMLAD, tap 1 on SMLAxB */
#define TVM_MEMPLAN_PAIR(at, out, ox)                                                                \
  do {                                                                                                \
    uint32_t e = tvm_memplan_word(at), o = tvm_memplan_odd(e);                                        \
    e = tvm_memplan_even(e);                                                                          \
    int32_t a0 = tvm_memplan_smlabb(o, middle01, tvm_memplan_smlad(e, outer0, b));                    \
    int32_t a1 = tvm_memplan_smlatb(e, middle01, tvm_memplan_smlad(o, outer0, b));                    \
    e = tvm_memplan_word(at + stride), o = tvm_memplan_odd(e), e = tvm_memplan_even(e);               \
    a0 = tvm_memplan_smlabt(o, middle01, tvm_memplan_smlad(e, outer1, a0));                           \
    a1 = tvm_memplan_smlatt(e, middle01, tvm_memplan_smlad(o, outer1, a1));                           \
    e = tvm_memplan_word(at + 2 * stride), o = tvm_memplan_odd(e), e = tvm_memplan_even(e);           \
    a0 = tvm_memplan_smlabb(o, middle2, tvm_memplan_smlad(e, outer2, a0));                            \
    a1 = tvm_memplan_smlatb(e, middle2, tvm_memplan_smlad(o, outer2, a1));                            \
    (out)[0] = (int8_t)tvm_memplan_requantize(a0, m, y_zp, low, high);                                \
    if ((ox) + 1 < ow) (out)[1] = (int8_t)tvm_memplan_requantize(a1, m, y_zp, low, high);            \
  } while (0)
        if (ow <= 72) { /* a short row unrolled: fixed offsets, no loop registers */
#pragma GCC unroll 36
          for (int32_t ox = 0; ox < ow; ox += 2) TVM_MEMPLAN_PAIR(r0 + ox, dst + ox, ox);
        } else {
          int8_t* out = dst;
          for (int32_t ox = 0; ox < ow; ox += 2, r0 += 2, out += 2) TVM_MEMPLAN_PAIR(r0, out, ox);
        }
#undef TVM_MEMPLAN_PAIR
      } else if (kh == 3 && kw == 3) { /* at stride 2, two outputs per two words of each row; else one per word */
#define TVM_MEMPLAN_ROW(at, outer, middle, tap1_a0, tap1_a1)                               \
  do {                                                                                    \
    const uint32_t w0 = tvm_memplan_word(at), e = tvm_memplan_even(w0), o = tvm_memplan_odd(w0); \
    const uint32_t pair = tvm_memplan_pkhbt(tvm_memplan_even(tvm_memplan_word((at) + 4)), e);  \
    a0 = tap1_a0(o, middle, tvm_memplan_smlad(e, outer, a0));                               \
    a1 = tap1_a1(o, middle, tvm_memplan_smladx(pair, outer, a1));                           \
  } while (0)
/* bytes 0 to 4 of a row: output ox takes 0, 1, 2 (SMLAD of bytes 0 and 2, tap 1 on byte 1), ox + 1 takes 2, 3, 4
 * (SMLADX of bytes 4 and 2, which PKHBT pairs, tap 1 on byte 3) */
#define TVM_MEMPLAN_PAIR(at, out)                                                        \
  do {                                                                                    \
    int32_t a0 = b, a1 = b;                                                               \
    TVM_MEMPLAN_ROW(at, outer0, middle01, tvm_memplan_smlabb, tvm_memplan_smlatb);         \
    TVM_MEMPLAN_ROW((at) + stride, outer1, middle01, tvm_memplan_smlabt, tvm_memplan_smlatt); \
    TVM_MEMPLAN_ROW((at) + 2 * stride, outer2, middle2, tvm_memplan_smlabb, tvm_memplan_smlatb); \
    (out)[0] = (int8_t)tvm_memplan_requantize(a0, m, y_zp, low, high);                    \
    (out)[1] = (int8_t)tvm_memplan_requantize(a1, m, y_zp, low, high);                    \
  } while (0)
        int32_t ox = 0;
        if (sw == 2 && ow <= 72) { /* a row of up to 72 outputs unrolled: fixed offsets, no loop registers */
#pragma GCC unroll 36
          for (; ox + 1 < ow; ox += 2) TVM_MEMPLAN_PAIR(r0 + 2 * ox, dst + ox);
          r0 += 2 * ox;
        }
        for (; sw == 2 && ox + 1 < ow; ox += 2, r0 += 4) TVM_MEMPLAN_PAIR(r0, dst + ox);
#undef TVM_MEMPLAN_PAIR
#undef TVM_MEMPLAN_ROW
        for (; ox < ow; ++ox, r0 += sw) {
          uint32_t e = tvm_memplan_word(r0);
          int32_t a = tvm_memplan_smlad(tvm_memplan_even(e), outer0, b);
          a = tvm_memplan_smlabb(tvm_memplan_odd(e), middle01, a);
          e = tvm_memplan_word(r0 + stride);
          a = tvm_memplan_smlabt(tvm_memplan_odd(e), middle01, tvm_memplan_smlad(tvm_memplan_even(e), outer1, a));
          e = tvm_memplan_word(r0 + 2 * stride);
          a = tvm_memplan_smlabb(tvm_memplan_odd(e), middle2, tvm_memplan_smlad(tvm_memplan_even(e), outer2, a));
          dst[ox] = (int8_t)tvm_memplan_requantize(a, m, y_zp, low, high);
        }
      } else {
        for (int32_t ox = 0; ox < ow; ++ox) {
          int32_t a = b;
          for (int32_t r = 0; r < kh; ++r) {
            const int8_t* at = r0 + r * stride + ox * sw;
            for (int32_t k = 0; k < kw; ++k) a += at[k] * tap[r * kw + k];
          }
          dst[ox] = (int8_t)tvm_memplan_requantize(a, m, y_zp, low, high);
        }
      }
    }
  }
  return 0;
}
"""
    + f"static inline __attribute__((always_inline)) int32_t {DEPTHWISE_KERNEL}("
    + DEPTHWISE_PARAMETERS
    + r""" {
  TVM_MEMPLAN_DEPTHWISE_GEOMETRY
  /* the cache in a fixed-size array where it fits one (the call's arguments are constants, so only one branch
   * stays): a variable-length array costs the frame pointer (r7), a register the 3x3 rows then lack */
#define TVM_MEMPLAN_IN(size)                                                                                     \
  do {                                                                                                         \
    int8_t buffer[size];                                                                                       \
    return tvm_memplan_depthwise_s8_in(buffer, x_, w_, bias_, multiplier_, y_, planes, channels, h, w, oh, ow, \
                                       kh, kw, sh, sw, top, left, x_zp, y_zp, low, high, fixed_point, y_plane); \
  } while (0)
  (void)cache_shift;
  if (bytes <= 512) TVM_MEMPLAN_IN(512);
  if (bytes <= TVM_MEMPLAN_MAX_PLANE + 3) TVM_MEMPLAN_IN(TVM_MEMPLAN_MAX_PLANE + 3);
  TVM_MEMPLAN_IN(bytes);
#undef TVM_MEMPLAN_IN
}
"""
    + r"""
/* a pointwise kernel's tile: its pixels, the most whose packed steps (of 4 channels) and the unpacked weights (2 words
 * a step, and the sentinel) fit TVM_MEMPLAN_STACK_BYTES (or, too few to unpack, the packed steps alone; at least 2
 * pixels), and whether enough pixels a tile to unpack each channel pair's weights once a tile: the fewer tiles, the
 * fewer times the weights are unpacked (the 25- and 81-pixel layers of wide inputs took 3 to 7 tiles in 4 KiB) */
#define TVM_MEMPLAN_POINTWISE_TILE                                                                  \
  const int32_t steps = (cin + 3) >> 2;                                                             \
  int32_t tile = ((TVM_MEMPLAN_STACK_BYTES / 8 - (2 * steps + 1)) / steps) & ~1;                    \
  const int32_t unpack = tile >= TVM_MEMPLAN_UNPACK_TILE;                                           \
  /* too few pixels beside the unpacked weights: the packed steps alone fill the buffer, not unpacked \
   * (a tile of them and the unpacked weights would overflow it, into a variable-length array) */   \
  if (!unpack) tile = (TVM_MEMPLAN_STACK_BYTES / (8 * steps)) & ~1;                                 \
  /* a multiple of 4 (no pixels left to pack one by one) where it unpacks and takes no more tiles */ \
  if (unpack && (tile & ~3) >= TVM_MEMPLAN_UNPACK_TILE &&                                           \
      (pixels + (tile & ~3) - 1) / (tile & ~3) == (pixels + tile - 1) / tile)                       \
    tile &= ~3;                                                                                     \
  tile = tile < 2 ? 2 : tile > 256 ? 256 : tile;
"""
    + "static inline __attribute__((always_inline)) int32_t "
    + f"{POINTWISE_KERNEL}_in(uint64_t* packed, uint64_t* unpacked, "
    + POINTWISE_HEAD
    + r"""  TVM_MEMPLAN_POINTWISE_TILE
  /* packed: per two pixels, per step of 4 channels, per pixel: the even pair (low word) and the odd pair (high word),
   * read by one LDRD; the two pixels' steps interleave so that one pointer walks both; unpacked: per step, channel
   * o's even and odd pair, then o + 1's, then the sentinel that ends the steps' loop. With 5-8 channels (two steps)
   * and more than one pixel, a pixel's two steps instead follow each other (its four words: one LDM) */
  const int32_t by_pixel = steps == 2 && pixels > 1;
#define TVM_MEMPLAN_PACKED_AT(p, s) (by_pixel ? 2 * (p) + (s) : 2 * (((p) >> 1) * steps + (s)) + ((p) & 1))
  if (unpack) {
    const uint32_t sentinel = TVM_MEMPLAN_SENTINEL;
    memcpy(unpacked + 2 * steps, &sentinel, 4);
  }
  for (int32_t p0 = 0; p0 < pixels; p0 += tile) {
    const int32_t n = pixels - p0 < tile ? pixels - p0 : tile;
    for (int32_t s = 0; s < steps; ++s) {
      const int8_t* c0 = x + 4 * s * pixels + p0;
      const int32_t there = cin - 4 * s; /* channels of this step that exist */
      int32_t p = 0;
#if defined(__ARM_FEATURE_DSP)
      /* a word (4 pixels) of each of the step's 4 channels; their bottom halves of channels 0 and 2 (t), 1 and 3 (w0),
       * their top halves (w2, w3) */
#define TVM_MEMPLAN_FOUR_CHANNEL_WORDS(from)                                                    \
  uint32_t w0 = tvm_memplan_word(from), w1 = tvm_memplan_word(from + pixels);                   \
  uint32_t w2 = tvm_memplan_word(from + 2 * pixels), w3 = tvm_memplan_word(from + 3 * pixels), t_
#define TVM_MEMPLAN_PKH_HALVES                                                                  \
  "pkhbt %[t], %[w0], %[w2], lsl #16\n\t"                                                       \
  "pkhtb %[w2], %[w2], %[w0], asr #16\n\t"                                                      \
  "pkhbt %[w0], %[w1], %[w3], lsl #16\n\t"                                                      \
  "pkhtb %[w3], %[w3], %[w1], asr #16\n\t"
      /* the transpose below in one asm block: PKHBT/PKHTB in place (GCC wrote each as two to four shifts and ORs),
       * then each pixel pair's four words stored by one STM (the list must ascend, so the registers are named) */
      const int8_t* from = c0;
      uint32_t *to = (uint32_t*)(packed + (by_pixel ? s : 2 * s)), *next = to + 4 * steps;
      for (const int8_t* const from_end = c0 + (there >= 4 && by_pixel ? n & ~3 : 0); from != from_end; from += 4) {
        /* by pixel: each pixel's pair by one STRD, 16 bytes apart */
        TVM_MEMPLAN_FOUR_CHANNEL_WORDS(from);
        uint32_t e02_, e13_, o02_, o13_;
        __asm__ volatile( /* (it stores) */
            TVM_MEMPLAN_PKH_HALVES
            "sxtb16 %[e02], %[t]\n\t"
            "sxtb16 %[e13], %[w0]\n\t"
            "strd %[e02], %[e13], [%[to]]\n\t"
            "sxtb16 %[o02], %[t], ror #8\n\t"
            "sxtb16 %[o13], %[w0], ror #8\n\t"
            "strd %[o02], %[o13], [%[to], #16]\n\t"
            "sxtb16 %[e02], %[w2]\n\t"
            "sxtb16 %[e13], %[w3]\n\t"
            "strd %[e02], %[e13], [%[to], #32]\n\t"
            "sxtb16 %[o02], %[w2], ror #8\n\t"
            "sxtb16 %[o13], %[w3], ror #8\n\t"
            "strd %[o02], %[o13], [%[to], #48]\n\t"
            "add %[to], %[to], #64"
            : [w0] "+r"(w0), [w1] "+r"(w1), [w2] "+r"(w2), [w3] "+r"(w3), [t] "=&r"(t_), [e02] "=&r"(e02_),
              [e13] "=&r"(e13_), [o02] "=&r"(o02_), [o13] "=&r"(o13_), [to] "+r"(to)
            :
            : "memory");
      }
      for (const int8_t* const from_end = there >= 4 && !by_pixel ? c0 + (n & ~3) : from; from != from_end; from += 4) {
        TVM_MEMPLAN_FOUR_CHANNEL_WORDS(from);
        register uint32_t e02_ __asm__("r0"), e13_ __asm__("r1"), o02_ __asm__("r2"), o13_ __asm__("r3");
        __asm__ volatile( /* (it stores) */
            TVM_MEMPLAN_PKH_HALVES
            "sxtb16 %[e02], %[t]\n\t"
            "sxtb16 %[e13], %[w0]\n\t"
            "sxtb16 %[o02], %[t], ror #8\n\t"
            "sxtb16 %[o13], %[w0], ror #8\n\t"
            "stm %[to], {%[e02], %[e13], %[o02], %[o13]}\n\t"
            "sxtb16 %[e02], %[w2]\n\t"
            "sxtb16 %[e13], %[w3]\n\t"
            "sxtb16 %[o02], %[w2], ror #8\n\t"
            "sxtb16 %[o13], %[w3], ror #8\n\t"
            "stm %[next], {%[e02], %[e13], %[o02], %[o13]}\n\t"
            "add %[to], %[to], %[advance]\n\t"
            "add %[next], %[next], %[advance]"
            : [w0] "+r"(w0), [w1] "+r"(w1), [w2] "+r"(w2), [w3] "+r"(w3), [t] "=&r"(t_), [e02] "=&r"(e02_),
              [e13] "=&r"(e13_), [o02] "=&r"(o02_), [o13] "=&r"(o13_), [to] "+r"(to), [next] "+r"(next)
            : [advance] "rI"(32 * steps)
            : "memory");
      }
      p = (int32_t)(from - c0);
#endif
      for (; there >= 4 && p + 3 < n; p += 4) { /* 4 pixels from a word of each channel: a 4x4 byte transpose */
        const uint32_t w0 = tvm_memplan_word(c0 + p), w1 = tvm_memplan_word(c0 + pixels + p);
        const uint32_t w2 = tvm_memplan_word(c0 + 2 * pixels + p), w3 = tvm_memplan_word(c0 + 3 * pixels + p);
        /* the bottom halves of channels 0 and 2 (PKHBT), [c0 p0, c0 p1, c2 p0, c2 p1], give pixel 0's even pair
         * (SXTB16) and pixel 1's (SXTB16 ROR 8); the top halves (PKHTB) pixels 2 and 3; channels 1 and 3 their odd
         * pairs: 4 PKH and 8 SXTB16 */
        const uint32_t low02 = (w0 & 0xffffu) | w2 << 16, high02 = (w0 >> 16) | (w2 & 0xffff0000u);
        const uint32_t low13 = (w1 & 0xffffu) | w3 << 16, high13 = (w1 >> 16) | (w3 & 0xffff0000u);
        packed[TVM_MEMPLAN_PACKED_AT(p, s)] = tvm_memplan_even(low02) | (uint64_t)tvm_memplan_even(low13) << 32;
        packed[TVM_MEMPLAN_PACKED_AT(p + 1, s)] = tvm_memplan_odd(low02) | (uint64_t)tvm_memplan_odd(low13) << 32;
        packed[TVM_MEMPLAN_PACKED_AT(p + 2, s)] = tvm_memplan_even(high02) | (uint64_t)tvm_memplan_even(high13) << 32;
        packed[TVM_MEMPLAN_PACKED_AT(p + 3, s)] = tvm_memplan_odd(high02) | (uint64_t)tvm_memplan_odd(high13) << 32;
      }
      for (; p < n; ++p) {
        uint64_t* to = packed + TVM_MEMPLAN_PACKED_AT(p, s);
        uint32_t word = (uint8_t)c0[p];
        if (there > 1) word |= (uint32_t)(uint8_t)c0[pixels + p] << 8;
        if (there > 2) word |= (uint32_t)(uint8_t)c0[2 * pixels + p] << 16;
        if (there > 3) word |= (uint32_t)(uint8_t)c0[3 * pixels + p] << 24;
        *to = tvm_memplan_even(word) | (uint64_t)tvm_memplan_odd(word) << 32;
      }
    }
    for (int32_t o = 0; pixels == 1 && o < cout; o += 4) { /* one pixel (a dense): a block of 4 channels */
      const int8_t* v = weights + (o >> 2) * steps * 16;
      const uint64_t* q = packed;
      int32_t a[4];
      for (int32_t k = 0; k < 4; ++k) a[k] = o + k < cout ? bias[o + k] : 0;
      int32_t a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
#if defined(__ARM_FEATURE_DSP) && !defined(__ARM_ARCH_8M_MAIN__)
      /* the steps in one asm loop, k an iteration (k = 4, 2 or 1, whichever divides them): per step one LDRD of the
       * input pairs, one LDM of the 4 channels' weight words (word-aligned constants), eight SXTB16 and eight
       * SMLAD (18 instructions for 16 MACs); the loop ends on the weights' pointer, its end read from the stack
       * into the temporary. 13 registers, all named (GCC's regional allocator found none for them otherwise; the
       * LDM's list must ascend), r7 left to the frame pointer of the larger tile buffers */
      {
        register uint32_t w0_ __asm__("r0"), w1_ __asm__("r1"), w2_ __asm__("r2"), w3_ __asm__("r3");
        register int32_t a0_ __asm__("r4") = a0, a1_ __asm__("r5") = a1, a2_ __asm__("r6") = a2;
        register int32_t a3_ __asm__("r8") = a3;
        register uint32_t xe_ __asm__("r9"), xo_ __asm__("r10"), t_ __asm__("r11");
        register const uint64_t* q_ __asm__("r12") = q;
        register const int8_t* v_ __asm__("lr") = v;
        const int8_t* const end = v + 16 * steps;
#define TVM_MEMPLAN_LANE(acc, w)                 \
  "sxtb16 %[t], %[" #w "]\n\t"                   \
  "sxtb16 %[" #w "], %[" #w "], ror #8\n\t"      \
  "smlad %[" #acc "], %[t], %[xe], %[" #acc "]\n\t" \
  "smlad %[" #acc "], %[" #w "], %[xo], %[" #acc "]\n\t"
#define TVM_MEMPLAN_STEP                                \
  "ldrd %[xe], %[xo], [%[q]], #16\n\t"                  \
  "ldm %[v]!, {%[w0], %[w1], %[w2], %[w3]}\n\t"         \
  TVM_MEMPLAN_LANE(a0, w0) TVM_MEMPLAN_LANE(a1, w1) TVM_MEMPLAN_LANE(a2, w2) TVM_MEMPLAN_LANE(a3, w3)
#define TVM_MEMPLAN_LOOP(body)                                                                                 \
  __asm__("1:\n\t" body "ldr %[t], %[end]\n\t"                                                                  \
          "cmp %[v], %[t]\n\t"                                                                                    \
          "bne 1b"                                                                                             \
          : [a0] "+r"(a0_), [a1] "+r"(a1_), [a2] "+r"(a2_), [a3] "+r"(a3_), [q] "+r"(q_), [v] "+r"(v_),        \
            [xe] "=&r"(xe_), [xo] "=&r"(xo_), [w0] "=&r"(w0_), [w1] "=&r"(w1_), [w2] "=&r"(w2_), [w3] "=&r"(w3_), \
            [t] "=&r"(t_)                                                                                      \
          : [end] "m"(end)                                                                                     \
          : "cc", "memory")
        if (steps % 4 == 0) {
          TVM_MEMPLAN_LOOP(TVM_MEMPLAN_STEP TVM_MEMPLAN_STEP TVM_MEMPLAN_STEP TVM_MEMPLAN_STEP);
        } else if (steps % 2 == 0) {
          TVM_MEMPLAN_LOOP(TVM_MEMPLAN_STEP TVM_MEMPLAN_STEP);
        } else {
          TVM_MEMPLAN_LOOP(TVM_MEMPLAN_STEP);
        }
#undef TVM_MEMPLAN_LOOP
#undef TVM_MEMPLAN_STEP
#undef TVM_MEMPLAN_LANE
        a0 = a0_, a1 = a1_, a2 = a2_, a3 = a3_;
      }
#elif defined(__ARM_FEATURE_DSP) /* (Armv8.1-M keeps LR for its low-overhead loops) */
      /* a step in one asm block (11 registers; the compiler's schedule hoisted loads and spilled): one LDRD of
       * the input pairs, two of the 4 channels' weight words (the weights are word-aligned constants), eight
       * SXTB16 and eight SMLAD */
#pragma GCC unroll 2
      for (int32_t s = 0; s < steps; ++s) {
        uint32_t xe, xo, w0, w1, t;
#define TVM_MEMPLAN_LANE(acc, w)                 \
  "sxtb16 %[t], %[" #w "]\n\t"                   \
  "sxtb16 %[" #w "], %[" #w "], ror #8\n\t"      \
  "smlad %[" #acc "], %[t], %[xe], %[" #acc "]\n\t" \
  "smlad %[" #acc "], %[" #w "], %[xo], %[" #acc "]\n\t"
        __asm__("ldrd %[xe], %[xo], [%[q]], #16\n\t"
                "ldrd %[w0], %[w1], [%[v]], #16\n\t" TVM_MEMPLAN_LANE(a0, w0) TVM_MEMPLAN_LANE(a1, w1)
                "ldrd %[w0], %[w1], [%[v], #-8]\n\t" TVM_MEMPLAN_LANE(a2, w0) TVM_MEMPLAN_LANE(a3, w1)
                : [a0] "+r"(a0), [a1] "+r"(a1), [a2] "+r"(a2), [a3] "+r"(a3), [q] "+r"(q), [v] "+r"(v),
                  [xe] "=&r"(xe), [xo] "=&r"(xo), [w0] "=&r"(w0), [w1] "=&r"(w1), [t] "=&r"(t)
                :
                : "memory");
#undef TVM_MEMPLAN_LANE
      }
#else
      for (int32_t s = 0; s < steps; ++s, v += 16, q += 2) {
        const uint32_t xe = (uint32_t)*q, xo = (uint32_t)(*q >> 32);
        const uint32_t w0 = tvm_memplan_word(v), w1 = tvm_memplan_word(v + 4);
        const uint32_t w2 = tvm_memplan_word(v + 8), w3 = tvm_memplan_word(v + 12);
        a0 = tvm_memplan_smlad(tvm_memplan_odd(w0), xo, tvm_memplan_smlad(tvm_memplan_even(w0), xe, a0));
        a1 = tvm_memplan_smlad(tvm_memplan_odd(w1), xo, tvm_memplan_smlad(tvm_memplan_even(w1), xe, a1));
        a2 = tvm_memplan_smlad(tvm_memplan_odd(w2), xo, tvm_memplan_smlad(tvm_memplan_even(w2), xe, a2));
        a3 = tvm_memplan_smlad(tvm_memplan_odd(w3), xo, tvm_memplan_smlad(tvm_memplan_even(w3), xe, a3));
      }
#endif
      a[0] = a0, a[1] = a1, a[2] = a2, a[3] = a3;
      for (int32_t k = 0; k < 4 && o + k < cout; ++k) {
        TVM_MEMPLAN_STORE(o + k, p0, a[k], tvm_memplan_scale_of(multiplier[o + k], fixed));
      }
    }
    /* 5 to 8 channels: 1 channel x 4 pixels, its weights in registers */
    for (int32_t o = 0; pixels > 1 && steps == 2 && o < cout; ++o) {
      const int8_t* wo = weights + (o >> 2) * 32 + (o & 3) * 4;
      const uint32_t u = tvm_memplan_word(wo), t = tvm_memplan_word(wo + 16);
      const uint32_t ue = tvm_memplan_even(u), uo = tvm_memplan_odd(u);
      const uint32_t te = tvm_memplan_even(t), to = tvm_memplan_odd(t);
      const int32_t bo = bias[o];
      const tvm_memplan_scale mo = tvm_memplan_scale_of(multiplier[o], fixed);
      const int32_t at = p0;
      int32_t p = 0;
#if defined(__ARM_FEATURE_DSP)
      const uint64_t* q = packed;
      int8_t* yo = y + o * y_plane + p0;
      /* with the fixed-point requantization to the int8 range and no residual: 8 pixels a loop step to their stored
       * codes, per pixel one LDM of its four packed words, four SMLAD, SMMLAR, SSAT and STRB (post-indexed); the
       * loop ends on q. 14 registers, all named (GCC's regional allocator found none for them otherwise) */
#if !defined(__ARM_ARCH_8M_MAIN__) /* (Armv8.1-M keeps LR for its low-overhead loops: the 4-pixel blocks) */
      const uint64_t* const end8 = packed + ((fixed && !add && low == -128 && high == 127) ? 2 * (n & ~7) : 0);
      if (q != end8) {
        register uint32_t x0_ __asm__("r0"), x1_ __asm__("r1"), x2_ __asm__("r2"), x3_ __asm__("r3");
        register uint32_t ue_ __asm__("r4") = ue, uo_ __asm__("r5") = uo, te_ __asm__("r6") = te;
        register uint32_t to_ __asm__("r7") = to;
        register int32_t b_ __asm__("r8") = bo, mq_ __asm__("r9") = mo.q, zp_ __asm__("r10") = y_zp;
        register const uint64_t* q_ __asm__("r11") = q;
        register int8_t* out_ __asm__("r12") = yo;
        register const uint64_t* end_ __asm__("lr") = end8;
#define TVM_MEMPLAN_CODE                               \
  "ldm %[q]!, {%[x0], %[x1], %[x2], %[x3]}\n\t"         \
  "smlad %[x0], %[ue], %[x0], %[b]\n\t"                 \
  "smlad %[x0], %[uo], %[x1], %[x0]\n\t"                \
  "smlad %[x0], %[te], %[x2], %[x0]\n\t"                \
  "smlad %[x0], %[to], %[x3], %[x0]\n\t"                \
  "smmlar %[x0], %[x0], %[mq], %[zp]\n\t"               \
  "ssat %[x0], #8, %[x0]\n\t"                           \
  "strb %[x0], [%[out]], #1\n\t"
        __asm__ volatile("1:\n\t" /* (it stores) */
                         TVM_MEMPLAN_CODE TVM_MEMPLAN_CODE TVM_MEMPLAN_CODE TVM_MEMPLAN_CODE TVM_MEMPLAN_CODE
                             TVM_MEMPLAN_CODE TVM_MEMPLAN_CODE TVM_MEMPLAN_CODE
                         "cmp %[q], %[end]\n\t"
                         "bne 1b"
                         : [x0] "=&r"(x0_), [x1] "=&r"(x1_), [x2] "=&r"(x2_), [x3] "=&r"(x3_), [q] "+r"(q_),
                           [out] "+r"(out_)
                         : [ue] "r"(ue_), [uo] "r"(uo_), [te] "r"(te_), [to] "r"(to_), [b] "r"(b_), [mq] "r"(mq_),
                           [zp] "r"(zp_), [end] "r"(end_)
                         : "cc", "memory");
#undef TVM_MEMPLAN_CODE
        q = q_, yo = out_;
      }
#endif
      p = (int32_t)(q - packed) >> 1;
      /* (the loop ends on q, 8 words a block, and stores by yo) */
      for (const uint64_t* const end4 = add ? q : q + 8 * ((n - p) >> 2); q != end4; yo += 4) {
        int32_t a0, a1, a2, a3;
        uint32_t y_, z_;
#define TVM_MEMPLAN_DOT8(acc, step0, step1)                  \
  "ldrd %[" #acc "], %[y], " step0 "\n\t"                    \
  "smlad %[" #acc "], %[ue], %[" #acc "], %[b]\n\t"          \
  "smlad %[" #acc "], %[uo], %[y], %[" #acc "]\n\t"          \
  "ldrd %[y], %[z], " step1 "\n\t"                           \
  "smlad %[" #acc "], %[te], %[y], %[" #acc "]\n\t"          \
  "smlad %[" #acc "], %[to], %[z], %[" #acc "]\n\t"
        __asm__(TVM_MEMPLAN_DOT8(a0, "[%[q]], #64", "[%[q], #-56]") TVM_MEMPLAN_DOT8(a1, "[%[q], #-48]", "[%[q], #-40]")
                    TVM_MEMPLAN_DOT8(a2, "[%[q], #-32]", "[%[q], #-24]")
                        TVM_MEMPLAN_DOT8(a3, "[%[q], #-16]", "[%[q], #-8]")
                : [a0] "=&r"(a0), [a1] "=&r"(a1), [a2] "=&r"(a2), [a3] "=&r"(a3), [y] "=&r"(y_), [z] "=&r"(z_),
                  [q] "+r"(q)
                : [ue] "r"(ue), [uo] "r"(uo), [te] "r"(te), [to] "r"(to), [b] "r"(bo)
                : "memory");
#undef TVM_MEMPLAN_DOT8
        yo[0] = (int8_t)tvm_memplan_requantize(a0, mo, y_zp, low, high);
        yo[1] = (int8_t)tvm_memplan_requantize(a1, mo, y_zp, low, high);
        yo[2] = (int8_t)tvm_memplan_requantize(a2, mo, y_zp, low, high);
        yo[3] = (int8_t)tvm_memplan_requantize(a3, mo, y_zp, low, high);
      }
      p = (int32_t)(q - packed) >> 1;
#endif
      for (; p + 1 < n; p += 2) { /* 2 pixels at fixed offsets: two LDRD a pixel */
        const uint64_t* q = packed + 2 * p; /* (pixel p, step 0), (p, 1), (p + 1, 0), (p + 1, 1) */
#define TVM_MEMPLAN_DOT8(step0, step1, acc)                                                                 \
  do {                                                                                                      \
    uint32_t xe, xo, ye, yo;                                                                                \
    TVM_MEMPLAN_LDRD_AT(q, step0, xe, xo);                                                                  \
    TVM_MEMPLAN_LDRD_AT(q, step1, ye, yo);                                                                  \
    acc = tvm_memplan_smlad(uo, xo, tvm_memplan_smlad(ue, xe, bo));                                         \
    acc = tvm_memplan_smlad(to, yo, tvm_memplan_smlad(te, ye, acc));                                        \
  } while (0)
        int32_t a0, a1;
        TVM_MEMPLAN_DOT8(0, 8, a0);
        TVM_MEMPLAN_DOT8(16, 24, a1);
#undef TVM_MEMPLAN_DOT8
        TVM_MEMPLAN_STORE(o, at + p, a0, mo);
        TVM_MEMPLAN_STORE(o, at + p + 1, a1, mo);
      }
      for (; p < n; p += 4) {
        const uint64_t* q = packed + 2 * p;
        const int32_t more = n - p;
        const uint64_t* q1 = more > 1 ? q + 2 : q;
        const uint64_t* q2 = more > 2 ? q + 4 : q;
        const uint64_t* q3 = more > 3 ? q + 6 : q;
#define TVM_MEMPLAN_DOT8(x)                                                                                 \
  tvm_memplan_smlad(to, (uint32_t)((x)[1] >> 32),                                                           \
                    tvm_memplan_smlad(te, (uint32_t)(x)[1],                                                 \
                                      tvm_memplan_smlad(uo, (uint32_t)((x)[0] >> 32),                       \
                                                        tvm_memplan_smlad(ue, (uint32_t)(x)[0], bo))))
        const int32_t a0 = TVM_MEMPLAN_DOT8(q), a1 = TVM_MEMPLAN_DOT8(q1), a2 = TVM_MEMPLAN_DOT8(q2);
        const int32_t a3 = TVM_MEMPLAN_DOT8(q3);
#undef TVM_MEMPLAN_DOT8
        TVM_MEMPLAN_STORE(o, at + p, a0, mo);
        if (more > 1) TVM_MEMPLAN_STORE(o, at + p + 1, a1, mo);
        if (more > 2) TVM_MEMPLAN_STORE(o, at + p + 2, a2, mo);
        if (more > 3) TVM_MEMPLAN_STORE(o, at + p + 3, a3, mo);
      }
    }
    /* else channels o and o + 1 (lanes of one block of 4) x 2 pixels */
    for (int32_t o = 0; pixels > 1 && steps != 2 && o < cout; o += 2) {
      const int8_t* wa = weights + (o >> 2) * steps * 16 + (o & 3) * 4;
      const int32_t ba = bias[o], bb = o + 1 < cout ? bias[o + 1] : 0;
      /* the blocks' accumulators start from these: two LDRD, no register held for the biases */
      const int32_t starts[4] __attribute__((aligned(8))) = {ba, ba, bb, bb};
      const tvm_memplan_scale ma = tvm_memplan_scale_of(multiplier[o], fixed);
      const tvm_memplan_scale mb = tvm_memplan_scale_of(o + 1 < cout ? multiplier[o + 1] : 0.0f, fixed);
      const int32_t multipliers[2] __attribute__((aligned(8))) = {ma.q, mb.q};
      if (unpack) {
#if defined(__ARM_FEATURE_DSP)
        /* per step: one LDRD of the two channels' words (word-aligned constants), four SXTB16, one STM (STM's
         * register list must ascend, so its four registers are named) */
        const int8_t* from = wa;
        uint32_t* to = (uint32_t*)unpacked;
#pragma GCC unroll 2
        for (int32_t s = 0; s < steps; ++s) {
          register uint32_t ue_ __asm__("r0"), uo_ __asm__("r1"), te_ __asm__("r2"), to_ __asm__("r3");
          uint32_t u_, t_;
          __asm__ volatile("ldrd %[u], %[t], [%[from]], #16\n\t"  /* (it stores) */
                         "sxtb16 %[ue], %[u]\n\t"
                         "sxtb16 %[uo], %[u], ror #8\n\t"
                         "sxtb16 %[te], %[t]\n\t"
                         "sxtb16 %[to], %[t], ror #8\n\t"
                         "stm %[to_p]!, {%[ue], %[uo], %[te], %[to]}"
                         : [from] "+r"(from), [to_p] "+r"(to), [u] "=&r"(u_), [t] "=&r"(t_), [ue] "=&r"(ue_),
                           [uo] "=&r"(uo_), [te] "=&r"(te_), [to] "=&r"(to_)
                         :
                         : "memory");
        }
#else
        for (int32_t s = 0; s < steps; ++s) {
          const uint32_t u = tvm_memplan_word(wa + 16 * s), t = tvm_memplan_word(wa + 16 * s + 4);
          unpacked[2 * s] = tvm_memplan_even(u) | (uint64_t)tvm_memplan_odd(u) << 32;
          unpacked[2 * s + 1] = tvm_memplan_even(t) | (uint64_t)tvm_memplan_odd(t) << 32;
        }
#endif
      }
      /* the pixel pairs walk the packed tile in order, and their outputs (and residuals) by pointer */
      const uint64_t* q = packed;
      int8_t* ya = y + o * y_plane + p0;
      const int8_t* ra = residual + o * pixels + p0;
      const int32_t second = o + 1 < cout;
#define TVM_MEMPLAN_STORE_AT(out, other, acc, m)                                                        \
  do {                                                                                                  \
    int32_t code = tvm_memplan_requantize((acc), (m), y_zp, low, high);                                 \
    if (add) {                                                                                          \
      code = code_first ? tvm_memplan_add(code, *(other), ratio_a, ratio_b, constant, add_low, add_high) \
                        : tvm_memplan_add(*(other), code, ratio_a, ratio_b, constant, add_low, add_high); \
    }                                                                                                   \
    *(out) = (int8_t)code;                                                                              \
  } while (0)
/* a block of channels o, o + 1 x pixels p, p + 1 (both: p + 1 exists) */
#define TVM_MEMPLAN_BLOCK(both)                                                                \
  do {                                                                                         \
    int32_t a0, a1, b0, b1;                                                                    \
    TVM_MEMPLAN_LDRD_M(starts, a0, a1);                                                        \
    TVM_MEMPLAN_LDRD_M(starts + 2, b0, b1);                                                    \
    if (unpack && !(both)) { /* the last odd pixel: per step two LDRD of the unpacked weights, one \
                              * of the pixel's pairs, four SMLAD (7 for 8 MACs; the 2x2 step takes 10) */ \
      const uint64_t* v = unpacked;                                                            \
      _Pragma("GCC unroll 4") for (int32_t s = 0; s < steps; ++s) {                            \
        uint32_t ue, uo, te, to, xe, xo;                                                       \
        v = tvm_memplan_ldrd(v, &ue, &uo), v = tvm_memplan_ldrd(v, &te, &to);                  \
        q = tvm_memplan_ldrd_skip(q, &xe, &xo);                                                \
        a0 = tvm_memplan_smlad(uo, xo, tvm_memplan_smlad(ue, xe, a0));                         \
        b0 = tvm_memplan_smlad(to, xo, tvm_memplan_smlad(te, xe, b0));                         \
      }                                                                                        \
    } else if (unpack) { /* per step the unpacked weights and the packed inputs, eight SMLAD */ \
      const uint64_t* v = unpacked;                                                            \
      TVM_MEMPLAN_STEPS_2X2(steps, v, q, a0, a1, b0, b1);                                      \
    } else {                                                                                   \
      const int8_t* v = wa;                                                                    \
_Pragma("GCC unroll 4")                                                                        \
      for (int32_t s = 0; s < steps; ++s, v += 16, q += 2) {                                   \
        const uint32_t u = tvm_memplan_word(v), t = tvm_memplan_word(v + 4);                   \
        const uint32_t ue = tvm_memplan_even(u), uo = tvm_memplan_odd(u);                      \
        const uint32_t te = tvm_memplan_even(t), to = tvm_memplan_odd(t);                      \
        const uint64_t x0 = q[0], x1 = q[1];                                                   \
        const uint32_t x0e = (uint32_t)x0, x0o = (uint32_t)(x0 >> 32), x1e = (uint32_t)x1;     \
        const uint32_t x1o = (uint32_t)(x1 >> 32);                                             \
        a0 = tvm_memplan_smlad(uo, x0o, tvm_memplan_smlad(ue, x0e, a0));                       \
        a1 = tvm_memplan_smlad(uo, x1o, tvm_memplan_smlad(ue, x1e, a1));                       \
        b0 = tvm_memplan_smlad(to, x0o, tvm_memplan_smlad(te, x0e, b0));                       \
        b1 = tvm_memplan_smlad(to, x1o, tvm_memplan_smlad(te, x1e, b1));                       \
      }                                                                                        \
    }                                                                                          \
    tvm_memplan_scale ma_ = ma, mb_ = mb;                                                      \
    if (fixed) TVM_MEMPLAN_LDRD_M(multipliers, ma_.q, mb_.q); /* (one LDRD, not two LDR) */     \
    TVM_MEMPLAN_STORE_AT(ya, ra, a0, ma_);                                                     \
    if (both) TVM_MEMPLAN_STORE_AT(ya + 1, ra + 1, a1, ma_);                                   \
    if (second) {                                                                              \
      TVM_MEMPLAN_STORE_AT(ya + y_plane, ra + pixels, b0, mb_);                                \
      if (both) TVM_MEMPLAN_STORE_AT(ya + y_plane + 1, ra + pixels + 1, b1, mb_);              \
    }                                                                                          \
  } while (0)
      /* each block moves q by its two pixels' steps: the loop ends on q (no pixel count to keep; no test of the
       * second pixel) */
      for (const uint64_t* const pairs_end = packed + steps * (n & ~1); q != pairs_end; ya += 2, ra += 2) {
        TVM_MEMPLAN_BLOCK(1);
      }
      if (n & 1) TVM_MEMPLAN_BLOCK(0);
#undef TVM_MEMPLAN_BLOCK
#undef TVM_MEMPLAN_STORE_AT
    }
  }
#undef TVM_MEMPLAN_STORE
  return 0;
}
"""
    + f"static inline __attribute__((always_inline)) int32_t {POINTWISE_KERNEL}("
    + POINTWISE_PARAMETERS
    + r""" {
  TVM_MEMPLAN_POINTWISE_TILE
  /* the tile's buffers in one fixed-size array where they fit (the call's arguments are constants, so only one branch
   * stays): the unpacked weights after the packed tile, which holds no more pixels than the layer has (rounded up to
   * 4), so a small layer takes a small array; variable-length arrays cost the frame pointer (r7), a register the 2x2
   * step needs */
#define TVM_MEMPLAN_IN(words)                                                                                    \
  do {                                                                                                           \
    uint64_t buffer[words];                                                                                      \
    return tvm_memplan_pointwise_s8_in(buffer, buffer + steps * used, x_, w_, bias_, multiplier_, residual_, y_, \
                                       cin, cout, pixels, y_zp, low, high, add, code_first, ratio_a, ratio_b,    \
                                       constant, add_low, add_high, fixed_point, y_plane);                       \
  } while (0)
  const int32_t used = ((pixels + 3) & ~3) < tile ? (pixels + 3) & ~3 : tile;
  const int32_t words = steps * used + (unpack ? 2 * steps + 1 : 0);
  if (words <= 128) TVM_MEMPLAN_IN(128);
  if (words <= 512) TVM_MEMPLAN_IN(512);
  if (words <= TVM_MEMPLAN_STACK_BYTES / 8) TVM_MEMPLAN_IN(TVM_MEMPLAN_STACK_BYTES / 8);
  TVM_MEMPLAN_IN(words);
#undef TVM_MEMPLAN_IN
}
"""
    + f"static inline __attribute__((always_inline)) int32_t {WINDOW_KERNEL}("
    + r"""
    void* x_, void* w_, void* bias_, void* multiplier_, void* y_, int32_t cin, int32_t h, int32_t w, int32_t cout,
    int32_t oh, int32_t ow, int32_t kh, int32_t kw, int32_t sh, int32_t sw, int32_t top, int32_t left, int32_t x_zp,
    int32_t y_zp, int32_t low, int32_t high, int32_t quantize, float x_scale, int32_t fixed_point, int32_t y_plane) {
  const int8_t* weights = (const int8_t*)w_; /* OIHW */
  const int32_t* bias = (const int32_t*)bias_;
  const float* multiplier = (const float*)multiplier_;
  int8_t* y = (int8_t*)y_;
  const int32_t depth = cin * kh * kw, pairs = (depth + 1) >> 1;
  const int32_t cols = (ow - 1) * sw + kw, filled = left + w;
  const int32_t stride = ((cols > filled ? cols : filled) + 3) & ~3;
  int8_t cache[cin * kh * stride]; /* per input channel, a ring of the window's rows, padded */
  /* two pixels' windows (im2col) as int16 pairs, interleaved: pair i of pixel 0, then of pixel 1 (one LDRD); a fixed
   * size, so that their addresses are offsets from the stack pointer */
  uint64_t columns[TVM_MEMPLAN_MAX_ROWS * TVM_MEMPLAN_MAX_WINDOW / 2];
  /* per pair of output channels, one record that one pointer walks: the accumulators' starts {ba, ba, bb, bb} (two
   * LDRD), the weights in the columns' order, interleaved (channel o's pair i, then o + 1's; zeros past cout), the
   * fixed-point multipliers {qa, qb} (one LDRD); and the requantization scales, computed once */
  const int32_t record = pairs + 3;
  uint64_t packed[((cout + 1) >> 1) * record];
  tvm_memplan_scale scales[cout + 1];
  const int8_t* rows[TVM_MEMPLAN_MAX_ROWS];
  const int32_t fixed = TVM_MEMPLAN_FIXED_POINT && fixed_point;
  for (int32_t o = 0; o <= cout; ++o) scales[o] = tvm_memplan_scale_of(o < cout ? multiplier[o] : 0.0f, fixed);
  for (int32_t o = 0; o < cout; o += 2) {
    uint64_t* at = packed + (o >> 1) * record;
    const int32_t ba = bias[o], bb = o + 1 < cout ? bias[o + 1] : 0;
    const int32_t starts[4] = {ba, ba, bb, bb}, q[2] = {scales[o].q, scales[o + 1].q};
    memcpy(at, starts, 16), memcpy(at + 2 + pairs, q, 8);
    for (int32_t i = 0; i < pairs; ++i) {
      int16_t lanes[4];
      for (int32_t k = 0; k < 4; ++k) {
        const int32_t channel = o + (k >> 1), tap = 2 * i + (k & 1);
        lanes[k] = channel < cout && tap < depth ? weights[channel * depth + tap] : 0;
      }
      memcpy(at + 2 + i, lanes, 8);
    }
  }
  memset(columns, 0, 8 * pairs);
  int32_t next = -top;
  for (int32_t oy = 0; oy < oh; ++oy) {
    const int32_t first = oy * sh - top;
    if (next < first) next = first;
    for (; next < first + kh; ++next) {
      for (int32_t c = 0; c < cin; ++c) {
        int8_t* row = cache + (c * kh + ((next % kh) + kh) % kh) * stride;
        memset(row, x_zp, stride);
        if (next < 0 || next >= h) continue;
        if (quantize) { /* the network input: MLAS's QuantizeLinear (divide, round half to even, saturate) */
          const float* from = (const float*)x_ + (c * h + next) * w;
#pragma GCC unroll 4
          for (int32_t i = 0; i < w; ++i) row[left + i] = (int8_t)tvm_memplan_offset(
              tvm_memplan_round(from[i] / x_scale), x_zp, -128, 127);
        } else {
          memcpy(row + left, (const int8_t*)x_ + (c * h + next) * w, w);
        }
      }
    }
    for (int32_t c = 0; c < cin; ++c) {
      for (int32_t r = 0; r < kh; ++r) rows[c * kh + r] = cache + (c * kh + (((first + r) % kh) + kh) % kh) * stride;
    }
    for (int32_t ox = 0; ox < ow; ox += 2) {
      const int32_t two = ox + 1 < ow;
      for (int32_t p = 0; p <= two; ++p) {
        int16_t* to = (int16_t*)columns + 2 * p; /* element j at 4 (j / 2) + 2 p + j % 2 */
#pragma GCC unroll 32
        for (int32_t i = 0; i < cin * kh; ++i) {
          const int8_t* from = rows[i] + (ox + p) * sw;
#pragma GCC unroll 8
          for (int32_t k = 0; k < kw; ++k) to[4 * ((i * kw + k) >> 1) + ((i * kw + k) & 1)] = from[k];
        }
      }
      /* (the second pixel's window and channel o + 1's weights are read even where there is none, and not stored) */
      int8_t* out = y + oy * ow + ox;
      const uint64_t* u = packed;
      for (int32_t o = 0; o < cout; o += 2, out += 2 * y_plane) {
        const int32_t second = o + 1 < cout;
        int32_t a0, a1, b0, b1;
        TVM_MEMPLAN_LDRD_M(u, a0, a1);
        TVM_MEMPLAN_LDRD_M(u + 1, b0, b1);
        u += 2;
        tvm_memplan_scale ma = scales[o], mb = scales[o + 1];
        ma.fixed = mb.fixed = fixed; /* a constant, which drops the other path */
        int32_t i = 0;
#if defined(__ARM_FEATURE_DSP)
        /* two pairs of taps: one LDM of both channels' weights (LDM's register list must ascend, so its registers
         * are named), two LDRD of the two pixels' windows, eight SMLAD */
#pragma GCC unroll 16
        for (; i + 1 < pairs; i += 2) {
          register uint32_t wu_ __asm__("r0"), wv_ __asm__("r1"), wu1_ __asm__("r2"), wv1_ __asm__("r3");
          uint32_t xa_, xb_;
          __asm__("ldm %[u]!, {%[wu], %[wv], %[wu1], %[wv1]}\n\t"
                  "ldrd %[xa], %[xb], %[c0]\n\t"
                  "smlad %[a0], %[wu], %[xa], %[a0]\n\t"
                  "smlad %[a1], %[wu], %[xb], %[a1]\n\t"
                  "smlad %[b0], %[wv], %[xa], %[b0]\n\t"
                  "smlad %[b1], %[wv], %[xb], %[b1]\n\t"
                  "ldrd %[xa], %[xb], %[c1]\n\t"
                  "smlad %[a0], %[wu1], %[xa], %[a0]\n\t"
                  "smlad %[a1], %[wu1], %[xb], %[a1]\n\t"
                  "smlad %[b0], %[wv1], %[xa], %[b0]\n\t"
                  "smlad %[b1], %[wv1], %[xb], %[b1]"
                  : [a0] "+r"(a0), [a1] "+r"(a1), [b0] "+r"(b0), [b1] "+r"(b1), [u] "+r"(u), [wu] "=&r"(wu_),
                    [wv] "=&r"(wv_), [wu1] "=&r"(wu1_), [wv1] "=&r"(wv1_), [xa] "=&r"(xa_), [xb] "=&r"(xb_)
                  : [c0] "Uv"(columns[i]), [c1] "Uv"(columns[i + 1]), "m"(*(const uint64_t(*)[2])u));
        }
#endif
#pragma GCC unroll 16
        for (; i < pairs; ++i, ++u) { /* two LDRD, four SMLAD */
          uint32_t wu, wv, xa, xb;
          TVM_MEMPLAN_LDRD_M(u, wu, wv);
          TVM_MEMPLAN_LDRD_M(columns + i, xa, xb);
          a0 = tvm_memplan_smlad(wu, xa, a0), a1 = tvm_memplan_smlad(wu, xb, a1);
          b0 = tvm_memplan_smlad(wv, xa, b0), b1 = tvm_memplan_smlad(wv, xb, b1);
        }
        if (fixed) TVM_MEMPLAN_LDRD_M(u, ma.q, mb.q); /* (one LDRD, not two LDR) */
        ++u;
        out[0] = (int8_t)tvm_memplan_requantize(a0, ma, y_zp, low, high);
        if (two) out[1] = (int8_t)tvm_memplan_requantize(a1, ma, y_zp, low, high);
        if (second) {
          out[y_plane] = (int8_t)tvm_memplan_requantize(b0, mb, y_zp, low, high);
          if (two) out[y_plane + 1] = (int8_t)tvm_memplan_requantize(b1, mb, y_zp, low, high);
        }
      }
    }
  }
  return 0;
}
"""
)
