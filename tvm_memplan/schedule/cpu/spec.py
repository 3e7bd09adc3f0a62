"""What a CPU target offers a schedule: vector width, register count, threads."""

from __future__ import annotations

import os
from dataclasses import dataclass

import tvm


@dataclass(frozen=True)
class CpuSpec:
    """The machine facts the default schedules are sized by."""

    lanes: int
    """float32 lanes of one vector register (AVX-512 16, AVX2 8, NEON/SSE 4)."""
    registers: int
    """Vector registers; a register tile of accumulators uses most of them."""
    threads: int
    """Cores the target may use; loops are parallelized when there is work for all of them."""
    vector_codegen: bool
    """Whether the code generator emits vector instructions for vectorized loops (LLVM does;
    the C target leaves vectorization to the C compiler, so loops are unrolled instead)."""
    int8_dot: str | None = None
    """The CPU's int8 dot-product instruction the integer convolutions tensorize with
    (``"avx512vnni"``: ``vpdpbusd``; ``"avx2"``: ``vpmaddwd`` on widened bytes; ``"neon-dotprod"``:
    Armv8.2's ``sdot``, where the target enables it, e.g. ``mattr`` ``+dotprod``; ``"dsp-smlad"``: a
    Cortex-M's ``SMLAD`` through a C micro-kernel), or None."""

    float_min_max: bool = False
    """Whether C's ``fmaxf``/``fminf`` are one instruction each (VMAXNM/VMINNM of the Cortex-M7's
    and M55's FPU; the M4's FPv4 has none): the int8 kernels then clamp with them."""

    @property
    def accumulators(self) -> int:
        """Vector accumulators a register tile may hold, leaving room for operands."""
        return self.registers - 4


def cpu_spec(target: tvm.target.Target) -> CpuSpec:
    """The :class:`CpuSpec` of an ``llvm`` or ``c`` target (generic 4-lane SIMD when unknown)."""
    kind = target.kind.name
    triple = str(target.attrs.get("mtriple", ""))
    if kind == "c" and str(target.attrs.get("mcpu", "")).startswith("cortex-m"):
        # A microcontroller: one core, scalar float code (the C compiler vectorizes nothing), and the FPU's
        # 32 single-precision registers (FPv4-SP/FPv5 on the M4/M7, the M55's). On the emulated M7 this
        # tile beats the generic 4 x 16 one: MobileNetV2-0.35 @ 144 86.2M -> 76.3M instructions, int8 136M -> 118M.
        # The DSP extension's dual 16-bit multiply-accumulate (SMLAD) runs the int8 convolutions
        # (the M4, M7 and M55 have it; the M0/M0+/M3 do not).
        dsp = str(target.attrs["mcpu"]) in ("cortex-m4", "cortex-m7", "cortex-m55")
        return CpuSpec(
            lanes=1,
            registers=32,
            threads=1,
            vector_codegen=False,
            int8_dot="dsp-smlad" if dsp else None,
            float_min_max=str(target.attrs["mcpu"]) in ("cortex-m7", "cortex-m55"),
        )
    lanes, registers = 4, 16
    if triple.startswith(("aarch64", "arm64")):
        lanes, registers = 4, 32
    elif kind == "llvm" and triple.startswith(("x86_64", "i686", "")) and not triple.startswith(("arm", "thumb")):
        if _has_feature("avx512f", target):
            lanes, registers = 16, 32
        elif _has_feature("avx2", target) or _has_feature("avx", target):
            lanes, registers = 8, 16
    int8_dot = None
    if kind == "llvm" and lanes == 16 and _has_feature("avx512vnni", target):
        int8_dot = "avx512vnni"
    elif kind == "llvm" and lanes >= 8 and _has_feature("avx2", target):
        int8_dot = "avx2"
    elif kind == "llvm" and triple.startswith(("aarch64", "arm64")) and _has_feature("dotprod", target):
        int8_dot = "neon-dotprod"
    cores = int(target.attrs.get("num-cores", 0) or 0)
    threads = cores or int(os.environ.get("TVM_NUM_THREADS", 0) or 0) or os.cpu_count() or 1
    return CpuSpec(lanes=lanes, registers=registers, threads=threads, vector_codegen=kind == "llvm", int8_dot=int8_dot)


def _has_feature(feature: str, target: tvm.target.Target) -> bool:
    try:
        return bool(tvm.target.codegen.target_has_features(feature, target))
    except (RuntimeError, ValueError):  # a target LLVM cannot describe (cross triples without the backend)
        return False
