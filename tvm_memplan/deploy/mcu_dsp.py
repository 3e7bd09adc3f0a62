"""The C micro-kernel behind the Cortex-M int8 convolutions: dual 16-bit multiply-accumulates (SMLAD).

The schedule tensorizes :func:`tvm_memplan.quant.kernels.conv2d_dot`'s innermost block (4 output
channels x 4 input channels, int8) into a call of ``tvm_memplan_dot_4x4_smlad``
(:mod:`tvm_memplan.schedule.cpu.int8_dot`). TVM's C codegen declares that call as an external
function; :func:`with_micro_kernels` replaces the declaration by this inline definition, so the C
compiler inlines it into the kernel and keeps the accumulators in registers.

On a core with the DSP extension (``__ARM_FEATURE_DSP``: M4, M7, M33, M55) a word of 4 input bytes
becomes two words of two int16 with ``SXTB16`` (bytes 0 and 2, then bytes 1 and 3 after a rotation
by 8), and so does each output channel's word of 4 weights; two ``SMLAD`` then add the four products.
Pairing the same bytes on both sides makes the sum exact, as CMSIS-NN's ``read_and_pad`` +
``__SMLAD`` inner loops do. Elsewhere (the host build) the same sum is plain C.
"""

from __future__ import annotations

import re

from ..schedule.cpu.int8_smlad import SMLAD_MICRO_KERNEL

MICRO_KERNELS = f"""
/* tvm-memplan's Cortex-M micro-kernel: for s < steps, i, k < 4:
 *   acc[i] += x[s * x_stride + k] * w[s * w_stride + 4 i + k]   (int8 x, w; int32 acc) */
#include <stdint.h>
#include <string.h>
#if defined(__ARM_FEATURE_DSP)
#include <arm_acle.h>
/* bytes 1 and 3 of a word as two int16 (SXTB16 of the word rotated by 8, one instruction) */
static inline __attribute__((always_inline)) int32_t tvm_memplan_sxtb16_ror8(uint32_t word) {{
  int32_t pairs;
  __asm__("sxtb16 %0, %1, ror #8" : "=r"(pairs) : "r"(word));
  return pairs;
}}
#define TVM_MEMPLAN_DOT4(acc, weights) \\
  acc = __smlad(tvm_memplan_sxtb16_ror8(weights), x_odd, __smlad(__sxtb16(weights), x_even, acc))
#endif
static inline __attribute__((always_inline)) int32_t {SMLAD_MICRO_KERNEL}(
    void* acc, void* x, int32_t x_stride, void* w, int32_t w_stride, int32_t steps) {{
  int32_t* c = (int32_t*)acc;
  const int8_t* a = (const int8_t*)x;
  const int8_t* b = (const int8_t*)w;
  int32_t c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3];
  for (int32_t s = 0; s < steps; ++s, a += x_stride, b += w_stride) {{
#if defined(__ARM_FEATURE_DSP)
    uint32_t word, w0, w1, w2, w3;
    memcpy(&word, a, 4);
    memcpy(&w0, b, 4);
    memcpy(&w1, b + 4, 4);
    memcpy(&w2, b + 8, 4);
    memcpy(&w3, b + 12, 4);
    const int32_t x_even = __sxtb16(word), x_odd = tvm_memplan_sxtb16_ror8(word);
    TVM_MEMPLAN_DOT4(c0, w0);
    TVM_MEMPLAN_DOT4(c1, w1);
    TVM_MEMPLAN_DOT4(c2, w2);
    TVM_MEMPLAN_DOT4(c3, w3);
#else
    c0 += a[0] * b[0] + a[1] * b[1] + a[2] * b[2] + a[3] * b[3];
    c1 += a[0] * b[4] + a[1] * b[5] + a[2] * b[6] + a[3] * b[7];
    c2 += a[0] * b[8] + a[1] * b[9] + a[2] * b[10] + a[3] * b[11];
    c3 += a[0] * b[12] + a[1] * b[13] + a[2] * b[14] + a[3] * b[15];
#endif
  }}
  c[0] = c0;
  c[1] = c1;
  c[2] = c2;
  c[3] = c3;
  return 0;
}}
"""

_DECLARATION = re.compile(
    r'#ifdef __cplusplus\nextern "C"\n#endif\nTVM_DLL int32_t ' + SMLAD_MICRO_KERNEL + r"\([^)]*\);\n"
)


def with_micro_kernels(source: str) -> str:
    """TVM's C kernels with the micro-kernel defined before its first use (nothing changes in a
    source that does not call it)."""
    if SMLAD_MICRO_KERNEL not in source:
        return source
    stripped = _DECLARATION.sub("", source)
    first = stripped.index("#ifdef __cplusplus")
    return stripped[:first] + MICRO_KERNELS + stripped[first:]
