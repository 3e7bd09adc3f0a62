"""The C micro-kernel behind the Cortex-M int8 convolutions: dual 16-bit multiply-accumulates (SMLAD).

The schedule tensorizes :func:`tvm_memplan.quant.dot_kernels.conv2d_dot`'s innermost block (4 output
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

from ..quant.mcu_kernels import C_KERNELS, ROW_KERNELS
from ..schedule.cpu.int8_smlad import SMLAD_MICRO_KERNELS
from .mcu_layers_c import LAYER_KERNELS

MICRO_KERNELS = f"""
/* tvm-memplan's Cortex-M micro-kernels: for s < steps, i, k < 4 (int8 x, w; int32 acc):
 *   {SMLAD_MICRO_KERNELS[1]}: acc[i] += x[s * x_stride + k] * w[s * w_stride + 4 i + k]
 *   {SMLAD_MICRO_KERNELS[2]}: the same for two pixels, the second's input at x + 4, its accumulators
 *   at acc + acc_stride */
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
/* a pixel's 4 input bytes as pairs of int16: bytes 0 and 2, bytes 1 and 3 */
#define TVM_MEMPLAN_PIXEL(name, from)                                  \\
  uint32_t name##_word;                                                \\
  memcpy(&name##_word, from, 4);                                       \\
  const int32_t name##_even = __sxtb16(name##_word), name##_odd = tvm_memplan_sxtb16_ror8(name##_word)
/* acc + the 4 products of a pixel and the 4 weights at w, paired the same way: two SMLAD */
static inline __attribute__((always_inline)) int32_t tvm_memplan_lane(
    int32_t acc, const int8_t* w, int32_t even, int32_t odd) {{
  uint32_t weights;
  memcpy(&weights, w, 4);
  return __smlad(tvm_memplan_sxtb16_ror8(weights), odd, __smlad(__sxtb16(weights), even, acc));
}}
#define TVM_MEMPLAN_LANE(acc, lane, name) acc = tvm_memplan_lane(acc, b + 4 * (lane), name##_even, name##_odd)
#else
#define TVM_MEMPLAN_PIXEL(name, from) const int8_t* name = (from)
#define TVM_MEMPLAN_LANE(acc, lane, name)                                                                  \\
  acc += name[0] * b[4 * (lane)] + name[1] * b[4 * (lane) + 1] + name[2] * b[4 * (lane) + 2] + \\
         name[3] * b[4 * (lane) + 3]
#endif
static inline __attribute__((always_inline)) int32_t {SMLAD_MICRO_KERNELS[1]}(
    void* acc, void* x, int32_t x_stride, void* w, int32_t w_stride, int32_t steps) {{
  int32_t* c = (int32_t*)acc;
  const int8_t* a = (const int8_t*)x;
  const int8_t* b = (const int8_t*)w;
  int32_t c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3];
  for (int32_t s = 0; s < steps; ++s, a += x_stride, b += w_stride) {{
    TVM_MEMPLAN_PIXEL(x0, a);
    TVM_MEMPLAN_LANE(c0, 0, x0), TVM_MEMPLAN_LANE(c1, 1, x0), TVM_MEMPLAN_LANE(c2, 2, x0), TVM_MEMPLAN_LANE(c3, 3, x0);
  }}
  c[0] = c0, c[1] = c1, c[2] = c2, c[3] = c3;
  return 0;
}}
/* two pixels x 2 of the 4 lanes: 4 accumulators, which stay in registers with the operands */
static inline __attribute__((always_inline)) void tvm_memplan_dot_2x2_smlad(
    int32_t* c, int32_t* d, const int8_t* a, int32_t x_stride, const int8_t* b, int32_t w_stride, int32_t steps) {{
  int32_t c0 = c[0], c1 = c[1], d0 = d[0], d1 = d[1];
  for (int32_t s = 0; s < steps; ++s, a += x_stride, b += w_stride) {{
    TVM_MEMPLAN_PIXEL(x0, a);
    TVM_MEMPLAN_PIXEL(x1, a + 4);
    TVM_MEMPLAN_LANE(c0, 0, x0), TVM_MEMPLAN_LANE(d0, 0, x1), TVM_MEMPLAN_LANE(c1, 1, x0), TVM_MEMPLAN_LANE(d1, 1, x1);
  }}
  c[0] = c0, c[1] = c1, d[0] = d0, d[1] = d1;
}}
/* all 4 lanes for two pixels hold 8 accumulators, more than the registers left: two passes of 2 lanes */
static inline __attribute__((always_inline)) int32_t {SMLAD_MICRO_KERNELS[2]}(
    void* acc, int32_t acc_stride, void* x, int32_t x_stride, void* w, int32_t w_stride, int32_t steps) {{
  int32_t* c = (int32_t*)acc;
  const int8_t* a = (const int8_t*)x;
  const int8_t* b = (const int8_t*)w;
  tvm_memplan_dot_2x2_smlad(c, c + acc_stride, a, x_stride, b, w_stride, steps);
  tvm_memplan_dot_2x2_smlad(c + 2, c + acc_stride + 2, a, x_stride, b + 8, w_stride, steps);
  return 0;
}}
"""

_EXTERNAL = (*SMLAD_MICRO_KERNELS.values(), *C_KERNELS, *ROW_KERNELS)
_DECLARATION = re.compile(
    r'#ifdef __cplusplus\nextern "C"\n#endif\nTVM_DLL int32_t ' + f"(?:{'|'.join(_EXTERNAL)})" + r"\([^)]*\);\n"
)


REQUANTIZATIONS = ("exact", "fixed")
"""How the whole-layer C kernels requantize (``build --requantize``): ``exact``, MLAS's float rounding, the
codes of onnxruntime's run exactly; ``fixed``, integers as CMSIS-NN does (``TVM_MEMPLAN_FIXED_POINT``: one
``SMMLAR`` per output instead of a float multiply and two conversions; residual adds keep MLAS's float
formula), each kernel within 1 LSB of onnxruntime's codes."""


def with_micro_kernels(source: str, requantize: str = "exact") -> str:
    """TVM's C kernels with the micro-kernels and the whole-layer kernels
    (:mod:`tvm_memplan.deploy.mcu_layers_c`) defined before their first use, in place of TVM's
    declarations (nothing changes in a source that calls none). ``requantize``: one of
    :data:`REQUANTIZATIONS`."""
    if requantize not in REQUANTIZATIONS:
        raise ValueError(f"requantize must be one of {', '.join(REQUANTIZATIONS)}, not {requantize!r}")
    definitions = "".join(
        text
        for names, text in (
            (SMLAD_MICRO_KERNELS.values(), MICRO_KERNELS),
            ((*C_KERNELS, *ROW_KERNELS), LAYER_KERNELS),
        )
        if any(name in source for name in names)
    )
    if not definitions:
        return source
    if requantize == "fixed":
        definitions = "#define TVM_MEMPLAN_FIXED_POINT 1\n" + definitions
    stripped = _DECLARATION.sub("", source)
    first = stripped.index("#ifdef __cplusplus")
    return stripped[:first] + definitions + stripped[first:]
