"""``lq-bench``: the quantizer thesis's table (accuracy, size, latency per bit width) plus kernel timings.

Accuracy rows: the digits MLP at fp32 and at each (wbits, abits), every dense layer quantized,
accuracy from the compiled TVM model on the held-out split. Kernel rows: one dense layer as a
Relax function (pack + LQ dense) side by side with the scheduled fp32 TVM kernel and numpy
(OpenBLAS), each timed as a whole VM call, plus the machine's limits measured by micro-kernels
on the same run: the popcount and FMA rates of the best register tile, and the warm read
bandwidth per working-set size. Every limit is a best case, so no kernel may beat it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
from tvm import relax, s_tir, te, tirx

from . import kernels
from .calibrate import LQConfig, apply_layers, build, default_target, quantize_module
from .digits import MLP, DigitsSplit, load_digits_28, mlp_to_onnx, train_mlp
from .quantizer import fit_activations, fit_weights
from .relax_pass import FloatDense, LQLayer, find_dense_layers, parameter_bytes

FLOAT_BITS = 32
SETTINGS: tuple[tuple[int, int], ...] = ((32, 32), (4, 4), (3, 3), (2, 2), (1, 1), (1, 2), (2, 1))
KERNEL_SHAPES: tuple[tuple[int, int], ...] = ((4096, 4096), (784, 512))
KERNEL_ROWS: tuple[int, ...] = (1, 64)
KERNEL_BITS: tuple[tuple[int, int], ...] = ((2, 2), (1, 1))


@dataclass(frozen=True)
class Timing:
    """How long to time each function: TVM's time_evaluator arguments."""

    number: int = 10
    repeat: int = 7
    min_repeat_ms: int = 50


def thread_count() -> int:
    """TVM's pool uses one thread unless TVM_NUM_THREADS is set."""
    return int(os.environ.get("TVM_NUM_THREADS", "1"))


def time_vm(vm: relax.VirtualMachine, args: Sequence[tvm.runtime.Tensor], timing: Timing) -> float:
    """Median µs of a whole ``main`` call."""
    result = vm.time_evaluator(
        "main", tvm.cpu(), number=timing.number, repeat=timing.repeat, min_repeat_ms=timing.min_repeat_ms
    )(*args)
    return float(result.median) * 1e6


def time_kernel(
    lib: tvm.runtime.Module, args: Sequence[tvm.runtime.Tensor], timing: Timing, best: bool = False
) -> float:
    """Median µs of a PrimFunc call; ``best``: the fastest repeat instead (what a limit probe wants,
    since other processes on a shared machine only ever slow a repeat down)."""
    result = lib.time_evaluator(
        lib.entry_name, tvm.cpu(), number=timing.number, repeat=timing.repeat, min_repeat_ms=timing.min_repeat_ms
    )(*args)
    return float(min(result.results) if best else result.median) * 1e6


def time_numpy(fn: Callable[[], object], timing: Timing) -> float:
    """Median µs of a numpy call, best of OpenBLAS on one thread and on all threads.

    On this VM OpenBLAS with two threads is 4x slower than with one at M=64 (its threads fight
    TVM's still-spinning pool workers), so the baseline gets whichever is faster.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # scikit-learn brings it; without it numpy keeps its default threads
        return _time_call(fn, timing)
    best = float("inf")
    for threads in sorted({1, thread_count()}):
        with threadpool_limits(limits=threads, user_api="blas"):
            best = min(best, _time_call(fn, timing))
    return best


def _time_call(fn: Callable[[], object], timing: Timing) -> float:
    """Median µs of ``fn`` with the same repeat structure as time_evaluator."""
    fn()
    number = timing.number
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    number = max(number, int(timing.min_repeat_ms / 1e3 / max(once, 1e-9)) + 1)
    samples = []
    for _ in range(timing.repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
    return float(np.median(samples)) * 1e6


# ---------------------------------------------------------------------------------------------
# The seed's table on the digits MLP


def trained_mlp(split: DigitsSplit, seed: int, epochs: int, hidden: int, cache_dir: Path | None) -> MLP:
    """Train once per (seed, epochs, hidden); later runs load the weights from ``cache_dir``."""
    path = cache_dir / f"digits_mlp_s{seed}_e{epochs}_h{hidden}.npz" if cache_dir else None
    if path is not None and path.is_file():
        return MLP.load(path)
    mlp = train_mlp(split, seed=seed, epochs=epochs, hidden=hidden)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        mlp.save(path)
    return mlp


def _import(mlp: MLP, batch: int) -> tvm.IRModule:
    from tvm.relax.frontend.onnx import from_onnx

    return from_onnx(mlp_to_onnx(mlp), shape_dict={"x": [batch, mlp.w1.shape[0]]})


def accuracy_rows(
    split: DigitsSplit,
    mlp: MLP,
    settings: Sequence[tuple[int, int]] = SETTINGS,
    *,
    finetune: bool = False,
    calib_batch: int = 64,
    target: tvm.target.Target | None = None,
    timing: Timing = Timing(),
) -> list[dict]:
    """One row per (wbits, abits): accuracy of the compiled model on the test split, size, batch-1 latency.

    The float row runs on the scheduled fp32 kernel (FloatDense). Quantizers are calibrated on
    the training split.
    """
    target = target or default_target()
    dev = tvm.cpu()
    calib_mod = _import(mlp, calib_batch)
    test_mod = _import(mlp, len(split.x_test))
    one_mod = _import(mlp, 1)
    x_test = tvm.runtime.tensor(split.x_test, dev)
    x_one = tvm.runtime.tensor(split.x_test[:1], dev)
    rows = []
    for wbits, abits in settings:
        if wbits == FLOAT_BITS and abits == FLOAT_BITS:
            layers: dict[str, LQLayer] = {}
        else:
            # The seed's table: every layer at the setting, no first/last widening, no per-layer check.
            config = LQConfig(wbits, abits, finetune=finetune, edge_bits=0, check_layers=False)
            layers = quantize_module(calib_mod, {"x": split.x_train}, config, target).layers
        test = relax.VirtualMachine(build(apply_layers(test_mod, layers, target), target), dev)
        predicted = test["main"](x_test).numpy().argmax(axis=1)
        one = apply_layers(one_mod, layers, target)
        latency = time_vm(relax.VirtualMachine(build(one, target), dev), [x_one], timing)
        # The float size is the model's own parameters, not the fp32 kernel's padded panels.
        sized = one if layers else relax.transform.FoldConstant()(one_mod)
        rows.append(
            {
                "wbits": wbits,
                "abits": abits,
                "accuracy": float(np.mean(predicted == split.y_test)),
                "size_bytes": parameter_bytes(sized),
                "latency_us": latency,
            }
        )
    return rows


# ---------------------------------------------------------------------------------------------
# Machine limits
#
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


# ---------------------------------------------------------------------------------------------
# Kernel rows


def single_dense(m: int, weight: np.ndarray, bias: np.ndarray) -> tvm.IRModule:
    """``main(x) = x @ weight + bias`` as Relax (what ONNX Gemm imports to)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, weight.shape[0]), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(weight)))
            out = bb.emit_output(relax.op.add(y, relax.const(bias)))
        bb.emit_func_output(out)
    return bb.get()


def _random_layer(name: str, weight: np.ndarray, x: np.ndarray, bias: np.ndarray, wbits: int, abits: int) -> LQLayer:
    """Quantizers fitted on random data: kernel speed does not depend on the values."""
    wq = fit_weights(weight, wbits, iters=3)
    act = fit_activations(x, abits, "pm1", iters=3)
    return LQLayer(name, wq.code_bits(weight.T), wq.pm1_form()[0], act, bias.astype(np.float64))


def kernel_rows(
    target: tvm.target.Target | None = None,
    shapes: Sequence[tuple[int, int]] = KERNEL_SHAPES,
    rows: Sequence[int] = KERNEL_ROWS,
    bits: Sequence[tuple[int, int]] = KERNEL_BITS,
    timing: Timing = Timing(),
    limits: dict[str, float] | None = None,
) -> list[dict]:
    """LQ layer (pack + dense) vs scheduled fp32 TVM vs numpy, timed back to back per shape."""
    target = target or default_target()
    dev = tvm.cpu()
    flavor = kernels.kernel_flavor(target)
    lanes = kernels.LANES[flavor]
    rng = np.random.default_rng(0)
    out = []
    for n, o in shapes:
        weight = (rng.standard_normal((n, o)) / np.sqrt(n)).astype(np.float32)
        bias = rng.standard_normal(o).astype(np.float32)
        for m in rows:
            x = rng.standard_normal((m, n)).astype(np.float32)
            x_dev = tvm.runtime.tensor(x, dev)
            base = single_dense(m, weight, bias)
            site = find_dense_layers(relax.transform.FoldConstant()(base))[0].name
            fp32 = relax.VirtualMachine(build(FloatDense([site])(base), target), dev)
            for wbits, abits in bits:
                layer = _random_layer(site, weight, x, bias, wbits, abits)
                lq_mod = apply_layers(base, {site: layer}, target)
                lq = relax.VirtualMachine(build(lq_mod, target), dev)
                dense_us, pack_us = _kernel_parts(layer, m, lanes, flavor, target, x, timing)
                row = {
                    "M": m,
                    "N": n,
                    "O": o,
                    "wbits": wbits,
                    "abits": abits,
                    "lq_us": time_vm(lq, [x_dev], timing),
                    "fp32_tvm_us": time_vm(fp32, [x_dev], timing),
                    "fp32_numpy_us": time_numpy(lambda x=x, weight=weight, bias=bias: x @ weight + bias, timing),
                    "lq_dense_us": dense_us,
                    "lq_pack_us": pack_us,
                    "lq_weight_bytes": int(layer.kernel_arguments(lanes)["wp"].nbytes),
                    "fp32_weight_bytes": int(weight.nbytes),
                }
                row["speedup_vs_fp32_tvm"] = row["fp32_tvm_us"] / row["lq_us"]
                row.update(_work(layer, m, lanes))
                out.append(row)
    return add_bounds(out, limits) if limits else out


def _kernel_parts(
    layer: LQLayer, m: int, lanes: int, flavor: str, target: tvm.target.Target, x: np.ndarray, timing: Timing
) -> tuple[float, float]:
    """µs of the dense PrimFunc and of the packing PrimFunc alone."""
    dev = tvm.cpu()
    n, o = layer.shape
    kx, kw = layer.act.bits, layer.weight_bits.shape[0]
    pack = tvm.tirx.build(kernels.schedule_lq_pack(kernels.lq_pack_func(m, n, layer.act), flavor), target=target)
    dense = tvm.tirx.build(
        kernels.schedule_lq_dense(kernels.lq_dense_func(m, n, o, kx, kw, lanes), flavor), target=target
    )
    xp = tvm.runtime.tensor(np.zeros((kx, m, kernels.words(n)), np.uint32), dev)
    pack_us = time_kernel(pack, [tvm.runtime.tensor(x, dev), xp], timing)
    consts = layer.kernel_arguments(lanes)
    args = [xp] + [tvm.runtime.tensor(consts[k], dev) for k in ("wp", "ax", "aw", "bias")]
    args.append(tvm.runtime.tensor(np.zeros((m, o), np.float32), dev))
    return time_kernel(dense, args, timing), pack_us


def _work(layer: LQLayer, m: int, lanes: int) -> dict:
    """What bounds the dense kernel: vector popcount steps and bytes it must read and write."""
    n, o = layer.shape
    kx, kw = layer.act.bits, layer.weight_bits.shape[0]
    packed_weights = kw * (-(-o // lanes)) * kernels.words(n) * lanes * 4
    return {
        "popcount_steps": m * (-(-o // lanes)) * kernels.words(n) * kx * kw,
        "lq_bytes_moved": packed_weights + kx * m * kernels.words(n) * 4 + m * o * 4,
        "fp32_bytes_moved": 4 * (n * o + m * (n + o)),
    }


def add_bounds(rows: list[dict], limits: dict) -> list[dict]:
    """Lower bounds on each kernel's time from the measured machine limits, and how close it gets.

    The timings are warm (repeated calls), so the read bounds use the bandwidth of a working
    set of the kernel's own size: a 4 MB weight matrix is read from cache, not DRAM, and a
    DRAM bound would be slower than the kernel it bounds.
    """
    for row in rows:
        popcount_us = row["popcount_steps"] / limits["popcount_steps_per_s"] * 1e6
        read_us = read_time_bound(row["lq_bytes_moved"], limits["read_bytes_per_s"]) * 1e6
        row.update(
            {
                "popcount_bound_us": popcount_us,
                "read_bound_us": read_us,
                "fp32_read_bound_us": read_time_bound(row["fp32_bytes_moved"], limits["read_bytes_per_s"]) * 1e6,
                "fp32_fma_bound_us": row["M"] * row["N"] * row["O"] / limits["fma_per_s"] * 1e6,
                "dense_vs_bound": max(popcount_us, read_us) / row["lq_dense_us"],
            }
        )
    return rows


def run(
    *,
    accuracy: bool = True,
    kernel: bool = True,
    seed: int = 0,
    epochs: int = 60,
    hidden: int = 512,
    finetune: bool = False,
    settings: Sequence[tuple[int, int]] = SETTINGS,
    cache_dir: Path | None = None,
    timing: Timing = Timing(),
    target: tvm.target.Target | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Everything ``lq-bench`` prints: ``{"rows": [...], "kernels": [...], "machine": {...}}``;
    ``progress(phase, phases done, phases)`` before each phase."""
    target = target or default_target()
    result: dict = {"rows": [], "kernels": []}
    phases = (["training the MLP", "accuracy rows"] if accuracy else []) + (
        ["machine limits", "kernel timings", "machine limits again"] if kernel else []
    )
    step = iter(range(len(phases)))

    def report() -> None:
        if progress is not None:
            done = next(step)
            progress(phases[done], done, len(phases))

    if accuracy:
        report()
        split = load_digits_28()
        mlp = trained_mlp(split, seed, epochs, hidden, cache_dir)
        report()
        result["rows"] = accuracy_rows(split, mlp, settings, finetune=finetune, target=target, timing=timing)
    if kernel:
        # This VM's throughput switches between two states about 2x apart; the limits are taken
        # before and after the kernel rows and the faster kept, so a bound is never from the slow state.
        report()
        before = machine_limits(target, timing)
        report()
        rows = kernel_rows(target, timing=timing)
        report()
        limits = best_limits(before, machine_limits(target, timing))
        result["kernels"] = add_bounds(rows, limits)
        result["machine"] = machine_info(target, limits)
    return result


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


def _setting(row: dict) -> str:
    return "fp32" if row["wbits"] == FLOAT_BITS else f"W{row['wbits']}A{row['abits']}"


def markdown(result: dict) -> str:
    """The tables as Markdown (the CLI prints it, scripts/bench_lq.py writes it to a file)."""
    lines: list[str] = []
    rows = result.get("rows") or []
    if rows:
        base = next((r for r in rows if r["wbits"] == FLOAT_BITS), rows[0])
        lines += [
            "| setting | accuracy | vs fp32 (points) | size (bytes) | size / fp32 | batch-1 latency (µs) |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {_setting(r)} | {100 * r['accuracy']:.2f} % | {100 * (r['accuracy'] - base['accuracy']):+.2f} "
                f"| {r['size_bytes']:,} | {r['size_bytes'] / base['size_bytes']:.4f} | {r['latency_us']:.1f} |"
            )
        lines.append("")
    kernel = result.get("kernels") or []
    if kernel:
        lines += [
            "| M | N→O | W/A | LQ layer (µs) | fp32 TVM (µs) | numpy (µs) | speedup vs fp32 TVM "
            "| LQ dense (µs) | pack (µs) | popcount bound (µs) | read bound (µs) "
            "| fp32 FMA bound (µs) | fp32 read bound (µs) |",
            "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in kernel:
            bounds = " | ".join(
                f"{r[key]:.1f}" if key in r else "-"
                for key in ("popcount_bound_us", "read_bound_us", "fp32_fma_bound_us", "fp32_read_bound_us")
            )
            lines.append(
                f"| {r['M']} | {r['N']}→{r['O']} | W{r['wbits']}A{r['abits']} | {r['lq_us']:.1f} | "
                f"{r['fp32_tvm_us']:.1f} "
                f"| {r['fp32_numpy_us']:.1f} | {r['fp32_tvm_us'] / r['lq_us']:.1f}x | {r['lq_dense_us']:.1f} "
                f"| {r['lq_pack_us']:.1f} | {bounds} |"
            )
        lines.append("")
    machine = result.get("machine")
    if machine:
        curve = ", ".join(
            f"{_size(int(size))} {bw / 1e9:.0f}"
            for size, bw in sorted(machine["read_bytes_per_s"].items(), key=lambda i: int(i[0]))
        )
        lines.append(
            f"{machine.get('cpu', 'CPU')}, {machine.get('isa', 'ISA')} kernels, TVM_NUM_THREADS={machine['threads']}, "
            f"target {machine['target']}, numpy's OpenBLAS kernels: {machine.get('numpy_blas', 'unknown')}. Limits: "
            f"{machine['popcount_steps_per_s'] / 1e9:.2f} G popcount steps/s (xor+popcount+add on one vector), "
            f"{2 * machine['fma_per_s'] / 1e9:.0f} GFLOP/s fp32 FMA (best register tile), "
            f"warm read GB/s by working set: {curve}."
        )
    return "\n".join(lines)


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KB"
