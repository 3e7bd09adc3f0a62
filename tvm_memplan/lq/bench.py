"""``lq-bench``: the seed's table (accuracy, size, latency per bit width) plus kernel timings.

Accuracy rows: the digits MLP at fp32 and at each (wbits, abits), every dense layer quantized,
accuracy from the compiled TVM model on the held-out split. Kernel rows: one dense layer as a
Relax function (pack + LQ dense) side by side with the scheduled fp32 TVM kernel and numpy
(OpenBLAS), each timed as a whole VM call, plus the machine's popcount and bandwidth limits
measured by two micro-kernels on the same run.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

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
    """TVM's pool uses one thread unless TVM_NUM_THREADS is set (field notes, section 4)."""
    return int(os.environ.get("TVM_NUM_THREADS", "1"))


def time_vm(vm: relax.VirtualMachine, args: Sequence[tvm.runtime.Tensor], timing: Timing) -> float:
    """Median µs of a whole ``main`` call."""
    result = vm.time_evaluator(
        "main", tvm.cpu(), number=timing.number, repeat=timing.repeat, min_repeat_ms=timing.min_repeat_ms
    )(*args)
    return float(result.median) * 1e6


def time_kernel(lib: tvm.runtime.Module, args: Sequence[tvm.runtime.Tensor], timing: Timing) -> float:
    result = lib.time_evaluator(
        lib.entry_name, tvm.cpu(), number=timing.number, repeat=timing.repeat, min_repeat_ms=timing.min_repeat_ms
    )(*args)
    return float(result.median) * 1e6


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
            config = LQConfig(wbits, abits, finetune=finetune)
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


def _register_loop_peak(target: tvm.target.Target, timing: Timing, kind: str, reps: int) -> float:
    """Vector steps per second of the kernels' register tile on L1-resident data.

    The tile of both kernels: 8 broadcast scalars x 2 weight vectors = 16 accumulators (the LQ
    kernel's 4 rows x Kx=2 by Kw=2 at W2A2, the fp32 kernel's 8 rows x 32 floats), ``reps``
    passes over 4 KB per task: what a kernel could reach if the epilogue, cache misses and the
    thread launch were free. A popcount step is xor + popcount + add on one vector of V u32
    lanes; an FMA step is one fused multiply-add on 16 floats.
    """
    lanes = kernels.LANES[kernels.kernel_flavor(target)] if kind == "popcount" else 16
    dtype = "uint32" if kind == "popcount" else "float32"
    tasks, rows, vectors, nw = 2 * thread_count(), 8, 2, 64
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
    t, a, b, v, rr, kk = sch.get_loops(block)
    sch.reorder(t, rr, kk, a, b, v)
    sch.parallel(t)
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
    seconds = time_kernel(lib, args, timing) / 1e6
    return tasks * reps * nw * rows * vectors / seconds


def popcount_peak(target: tvm.target.Target, timing: Timing) -> float:
    """Vector popcount steps (xor + popcount + add on V lanes) per second, L1-resident."""
    return _register_loop_peak(target, timing, "popcount", reps=2048)


def fma_peak(target: tvm.target.Target, timing: Timing) -> float:
    """Float multiply-adds per second (16-lane FMA steps x 16), L1-resident: the fp32 kernel's ceiling."""
    return 16 * _register_loop_peak(target, timing, "fma", reps=2048)


def read_bandwidth(target: tvm.target.Target, nbytes: int, timing: Timing) -> float:
    """Bytes per second a parallel vectorized sum reads from an ``nbytes`` array."""
    lanes = 16
    tasks = 8 * thread_count()
    rows = max(1, nbytes // (4 * lanes * tasks))
    a = te.placeholder((tasks, rows, lanes), "uint32", name="a")
    k = te.reduce_axis((0, rows), name="k")
    s = te.compute((tasks, lanes), lambda t, v: te.sum(a[t, k, v], axis=k), name="s")
    sch = s_tir.Schedule(te.create_prim_func([a, s]))
    block = sch.get_sblock("s")
    t, v, kk = sch.get_loops(block)
    sch.reorder(t, kk, v)
    sch.parallel(t)
    sch.vectorize(v)
    sch.decompose_reduction(block, kk)
    lib = tvm.tirx.build(sch.mod, target=target)
    data = tvm.runtime.tensor(np.ones((tasks, rows, lanes), np.uint32), tvm.cpu())
    out = tvm.runtime.tensor(np.zeros((tasks, lanes), np.uint32), tvm.cpu())
    return tasks * rows * lanes * 4 / (time_kernel(lib, [data, out], timing) / 1e6)


def machine_limits(
    target: tvm.target.Target, timing: Timing, dram_bytes: int = 256 << 20, l3_bytes: int = 8 << 20
) -> dict[str, float]:
    """Popcount step rate, FMA rate, DRAM read bandwidth (an array 8x the L3), L3-resident bandwidth."""
    return {
        "popcount_steps_per_s": popcount_peak(target, timing),
        "fma_per_s": fma_peak(target, timing),
        "dram_bytes_per_s": read_bandwidth(target, dram_bytes, timing),
        "l3_bytes_per_s": read_bandwidth(target, l3_bytes, timing),
    }


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
                    "fp32_numpy_us": time_numpy(lambda: x @ weight + bias, timing),
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


def add_bounds(rows: list[dict], limits: dict[str, float]) -> list[dict]:
    """Lower bounds on each kernel's time from the measured machine limits, and how close it gets."""
    for row in rows:
        popcount_us = row["popcount_steps"] / limits["popcount_steps_per_s"] * 1e6
        l3_us = row["lq_bytes_moved"] / limits["l3_bytes_per_s"] * 1e6
        row.update(
            {
                "popcount_bound_us": popcount_us,
                "l3_bound_us": l3_us,
                "dram_bound_us": row["lq_bytes_moved"] / limits["dram_bytes_per_s"] * 1e6,
                "fp32_dram_bound_us": row["fp32_bytes_moved"] / limits["dram_bytes_per_s"] * 1e6,
                "fp32_fma_bound_us": row["M"] * row["N"] * row["O"] / limits["fma_per_s"] * 1e6,
                "dense_vs_bound": max(popcount_us, l3_us) / row["lq_dense_us"],
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
) -> dict:
    """Everything ``lq-bench`` prints: ``{"rows": [...], "kernels": [...], "machine": {...}}``."""
    target = target or default_target()
    result: dict = {"rows": [], "kernels": []}
    if accuracy:
        split = load_digits_28()
        mlp = trained_mlp(split, seed, epochs, hidden, cache_dir)
        result["rows"] = accuracy_rows(split, mlp, settings, finetune=finetune, target=target, timing=timing)
    if kernel:
        # This VM's throughput switches between two states about 2x apart; the limits are taken
        # before and after the kernel rows and the faster kept, so a bound is never from the slow state.
        before = machine_limits(target, timing)
        rows = kernel_rows(target, timing=timing)
        after = machine_limits(target, timing)
        limits = {key: max(before[key], after[key]) for key in before}
        result["kernels"] = add_bounds(rows, limits)
        result["machine"] = {"threads": thread_count(), "target": str(target), **limits}
    return result


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
            "| LQ dense (µs) | pack (µs) | popcount bound (µs) | L3 bound (µs) | DRAM bound (µs) "
            "| fp32 FMA bound (µs) | fp32 DRAM bound (µs) |",
            "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in kernel:
            bounds = " | ".join(
                f"{r[key]:.1f}" if key in r else "-"
                for key in ("popcount_bound_us", "l3_bound_us", "dram_bound_us", "fp32_fma_bound_us", "fp32_dram_bound_us")
            )
            lines.append(
                f"| {r['M']} | {r['N']}→{r['O']} | W{r['wbits']}A{r['abits']} | {r['lq_us']:.1f} | {r['fp32_tvm_us']:.1f} "
                f"| {r['fp32_numpy_us']:.1f} | {r['fp32_tvm_us'] / r['lq_us']:.1f}x | {r['lq_dense_us']:.1f} "
                f"| {r['lq_pack_us']:.1f} | {bounds} |"
            )
        lines.append("")
    machine = result.get("machine")
    if machine:
        lines.append(
            f"TVM_NUM_THREADS={machine['threads']}, target {machine['target']}: "
            f"{machine['popcount_steps_per_s'] / 1e9:.2f} G popcount steps/s (xor+popcount+add on one vector), "
            f"{2 * machine['fma_per_s'] / 1e9:.0f} GFLOP/s fp32 FMA, "
            f"{machine['dram_bytes_per_s'] / 1e9:.1f} GB/s DRAM read, {machine['l3_bytes_per_s'] / 1e9:.1f} GB/s L3 read."
        )
    return "\n".join(lines)
