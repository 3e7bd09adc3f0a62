"""The machine the LQ kernels run on, and its limits measured by micro-kernels on the same run:
the popcount and FMA rates of the best register tile, and the warm read bandwidth per working-set
size. Every limit is a best case (roofline-style bounds), so no kernel may beat it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tvm
from tvm import s_tir, te, tirx

from . import kernels
from .calibrate import default_target
from .timing import Timing, thread_count, time_kernel

# Each limit is the best rate a micro-kernel reaches over a few register tiles, so a limit is
# the ISA's ceiling on this machine, not one tile's: a single 8x2 tile of 16-float vectors needs
# 32 accumulators, which AVX2's 16 ymm registers cannot hold, and that spilling probe came out
# 2-4x slower than the fp32 kernels it was meant to bound.

# (rows, vectors) register tiles tried by the peak probes (the kernels' own shapes among them:
# 16x1 is LQ's W1A1 tile); a tile with more accumulators than the ISA has vector registers is skipped.
PEAK_TILES: tuple[tuple[int, int], ...] = (
    (2, 2),
    (4, 1),
    (4, 2),
    (6, 2),
    (4, 3),
    (8, 1),
    (8, 2),
    (16, 1),
    (8, 3),
    (12, 2),
)
# Passes of a peak probe over its L1 data: long enough (~ms) that the thread launch is noise.
PEAK_REPS = 4096
VECTOR_REGISTERS = {"avx512": 32, "x86": 16, "neon": 32}
# Working-set sizes of the read-bandwidth curve: 16 KB (L1) to 256 MB (DRAM), x4 apart.
READ_SIZES: tuple[int, ...] = tuple(16 << (10 + 2 * i) for i in range(8))
# Each read probe call streams at least this many bytes, so the thread launch is amortized.
READ_BYTES_PER_CALL = 64 << 20


ISAS = ("native", "avx2")


def isa_target(isa: str) -> tvm.target.Target:
    """This machine's target, or (``avx2``) the same CPU with AVX-512 switched off, so an AVX-512
    machine can time the AVX2 kernels a Zen 3 or Haswell-class CPU would run."""
    from ..errors import UserError

    target = default_target()
    if isa == "native":
        return target
    if isa != "avx2":
        raise UserError(f"--isa must be one of {', '.join(ISAS)}, got {isa!r}")
    if not tvm.target.codegen.target_has_features("avx2", target):
        raise UserError(f"--isa avx2 needs an x86 CPU with AVX2; this one is {target.attrs['mcpu']}")
    config = {
        "kind": "llvm",
        "mcpu": str(target.attrs["mcpu"]),
        "mattr": ["-avx512f"],
        "num-cores": int(target.attrs["num-cores"]),
    }
    return tvm.target.Target(config)


def isa_name(target: tvm.target.Target) -> str:
    """The vector ISA the kernels are built for, as the tables name it."""
    flavor = kernels.kernel_flavor(target)
    if flavor == "avx512":
        return "AVX-512 (VPOPCNTDQ)"
    if flavor == "neon":
        return "NEON"
    return "AVX2" if tvm.target.codegen.target_has_features("avx2", target) else "x86-64 (SSE)"


def cpu_name() -> str:
    """The CPU model as the OS reports it (/proc/cpuinfo on Linux)."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":")[0].strip() in ("model name", "Model", "Hardware"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def blas_core() -> str:
    """Which kernel family numpy's OpenBLAS picked (``OPENBLAS_CORETYPE`` can force one)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "unknown"
    found = [str(i.get("architecture")) for i in threadpool_info() if i.get("internal_api") == "openblas"]
    return found[0] if found else "unknown"


def _register_loop_rate(
    target: tvm.target.Target, timing: Timing, kind: str, rows: int, vectors: int, reps: int
) -> float:
    """Vector steps per second of a ``rows`` x ``vectors`` accumulator tile on L1-resident data.

    The inner step is the kernels' own: a popcount step is xor + popcount + add on one vector
    of V u32 lanes, an FMA step one fused multiply-add on V floats (V = the ISA's vector width).
    Accumulators live in a local buffer (registers once unrolled) across ``reps`` passes over
    64 words per task: what a kernel could reach if the epilogue, cache misses and the thread
    launch were free.
    """
    lanes = kernels.LANES[kernels.kernel_flavor(target)]
    dtype = "uint32" if kind == "popcount" else "float32"
    tasks, nw = 2 * thread_count(), 64
    x = te.placeholder((tasks, rows, nw), dtype, name="x")
    w = te.placeholder((tasks, vectors, nw, lanes), dtype, name="w")
    r = te.reduce_axis((0, reps), name="r")
    k = te.reduce_axis((0, nw), name="k")

    def step(t: tirx.Var, a: tirx.Var, b: tirx.Var, v: tirx.Var) -> tirx.PrimExpr:
        if kind == "popcount":
            return tirx.popcount(x[t, a, k] ^ w[t, b, k, v]).astype("int32")
        return x[t, a, k] * w[t, b, k, v]

    acc = te.compute(
        (tasks, rows, vectors, lanes), lambda t, a, b, v: te.sum(step(t, a, b, v), axis=[r, k]), name="acc"
    )
    sch = s_tir.Schedule(te.create_prim_func([x, w, acc]))
    block = sch.get_sblock("acc")
    store = sch.cache_write(block, 0, "local")
    t, a, b, v, rr, kk = sch.get_loops(block)
    sch.reorder(t, rr, kk, a, b, v)
    sch.parallel(t)
    sch.reverse_compute_at(store, t)
    sch.unroll(a)
    sch.unroll(b)
    sch.vectorize(v)
    sch.decompose_reduction(block, rr)
    lib = tvm.tirx.build(sch.mod, target=target)
    rng = np.random.default_rng(0)
    shapes = ((tasks, rows, nw), (tasks, vectors, nw, lanes))
    if kind == "popcount":
        operands = [rng.integers(0, 2**32, shape, dtype=np.uint32) for shape in shapes]
        out = np.zeros((tasks, rows, vectors, lanes), np.int32)
    else:
        operands = [rng.uniform(0.5, 1.0, shape).astype(np.float32) for shape in shapes]
        out = np.zeros((tasks, rows, vectors, lanes), np.float32)
    args = [tvm.runtime.tensor(a, tvm.cpu()) for a in (*operands, out)]
    seconds = time_kernel(lib, args, timing, best=True) / 1e6
    return tasks * reps * nw * rows * vectors / seconds


def _best_tile_rate(target: tvm.target.Target, timing: Timing, kind: str, reps: int) -> float:
    budget = VECTOR_REGISTERS[kernels.kernel_flavor(target)]
    return max(
        _register_loop_rate(target, timing, kind, rows, vectors, reps)
        for rows, vectors in PEAK_TILES
        if rows * vectors <= budget
    )


def popcount_peak(target: tvm.target.Target, timing: Timing) -> float:
    """Vector popcount steps (xor + popcount + add on V lanes) per second, L1-resident, best tile."""
    return _best_tile_rate(target, timing, "popcount", reps=PEAK_REPS)


def fma_peak(target: tvm.target.Target, timing: Timing) -> float:
    """Float multiply-adds per second (V-lane FMA steps x V), L1-resident, best tile: the fp32 kernels' ceiling."""
    return kernels.LANES[kernels.kernel_flavor(target)] * _best_tile_rate(target, timing, "fma", reps=PEAK_REPS)


def read_bandwidth(target: tvm.target.Target, nbytes: int, timing: Timing) -> float:
    """Bytes per second a parallel vectorized sum reads from a warm ``nbytes`` array.

    Each task reads four streams at once (more hardware-prefetch streams, more loads in
    flight) and each call passes over the array until it has read ``READ_BYTES_PER_CALL``, so
    small, cache-resident arrays are not timed against the thread launch. Each pass xors in
    its index: a plain integer sum repeated over passes is one sum times ``passes`` to LLVM,
    which then reads the array once.
    """
    lanes = 2 * kernels.LANES[kernels.kernel_flavor(target)]
    tasks, streams = 2 * thread_count(), 4
    rows = max(1, nbytes // (4 * lanes * tasks * streams))
    passes = max(1, READ_BYTES_PER_CALL // (4 * lanes * tasks * streams * rows))
    a = te.placeholder((tasks, streams, rows, lanes), "uint32", name="a")
    p = te.reduce_axis((0, passes), name="p")
    k = te.reduce_axis((0, rows), name="k")
    s = te.compute(
        (tasks, streams, lanes), lambda t, c, v: te.sum(a[t, c, k, v] ^ p.astype("uint32"), axis=[p, k]), name="s"
    )
    sch = s_tir.Schedule(te.create_prim_func([a, s]))
    block = sch.get_sblock("s")
    store = sch.cache_write(block, 0, "local")
    t, c, v, pp, kk = sch.get_loops(block)
    sch.reorder(t, pp, kk, c, v)
    sch.parallel(t)
    sch.reverse_compute_at(store, t)
    sch.unroll(c)
    sch.vectorize(v)
    sch.decompose_reduction(block, pp)
    lib = tvm.tirx.build(sch.mod, target=target)
    data = tvm.runtime.tensor(np.ones((tasks, streams, rows, lanes), np.uint32), tvm.cpu())
    out = tvm.runtime.tensor(np.zeros((tasks, streams, lanes), np.uint32), tvm.cpu())
    return passes * tasks * streams * rows * lanes * 4 / (time_kernel(lib, [data, out], timing, best=True) / 1e6)


def machine_limits(target: tvm.target.Target, timing: Timing, read_sizes: Sequence[int] = READ_SIZES) -> dict:
    """Popcount step rate, FMA rate, and the warm read bandwidth per working-set size (bytes → B/s)."""
    return {
        "popcount_steps_per_s": popcount_peak(target, timing),
        "fma_per_s": fma_peak(target, timing),
        "read_bytes_per_s": {int(size): read_bandwidth(target, size, timing) for size in read_sizes},
    }


def best_limits(*measured: dict) -> dict:
    """The fastest of several measurements of the same limits (a shared machine only ever slows a probe)."""
    out = dict(measured[0])
    for key in ("popcount_steps_per_s", "fma_per_s"):
        out[key] = max(m[key] for m in measured)
    sizes = measured[0]["read_bytes_per_s"]
    out["read_bytes_per_s"] = {size: max(m["read_bytes_per_s"][size] for m in measured) for size in sizes}
    return out


def read_time_bound(nbytes: int, read_bytes_per_s: dict) -> float:
    """Seconds to read ``nbytes`` from a warm working set of that size, at best.

    Uses the bandwidth measured at the largest probed size not above ``nbytes``: a smaller
    working set sits in the same or a faster cache level, so the bound holds between the
    probed sizes too. For the same reason a size is credited with the fastest rate measured
    at any larger size (noise can make 16 MB read slower than 64 MB).
    """
    sizes = sorted(read_bytes_per_s, key=int)
    fitting = [size for size in sizes if int(size) <= nbytes] or sizes[:1]
    return nbytes / max(read_bytes_per_s[size] for size in sizes if int(size) >= int(fitting[-1]))


def machine_info(target: tvm.target.Target, limits: dict) -> dict:
    """What the kernel table ran on: CPU, ISA, threads, target, numpy's BLAS kernels, and the limits."""
    return {
        "cpu": cpu_name(),
        "isa": isa_name(target),
        "threads": thread_count(),
        "target": str(target),
        "numpy_blas": blas_core(),
        **limits,
    }
