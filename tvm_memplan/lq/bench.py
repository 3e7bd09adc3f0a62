"""``lq-bench``: the quantizer thesis's table (accuracy, size, latency per bit width) plus kernel timings.

Accuracy rows: the digits MLP at fp32 and at each (wbits, abits), every dense layer quantized,
accuracy from the compiled TVM model on the held-out split. Kernel rows: one dense layer as a
Relax function (pack + LQ dense) side by side with the scheduled fp32 TVM kernel and numpy
(OpenBLAS), each timed as a whole VM call, plus the machine's limits measured by micro-kernels
on the same run: the popcount and FMA rates of the best register tile, and the warm read
bandwidth per working-set size. Every limit is a best case, so no kernel may beat it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from . import kernels
from .calibrate import LQConfig, apply_layers, build, default_target, quantize_module
from .digits import MLP, DigitsSplit, load_digits_28, mlp_to_onnx, train_mlp
from .machine import best_limits, machine_info, machine_limits, read_time_bound
from .quantizer import fit_activations, fit_weights
from .relax_pass import FloatDense, LQLayer, find_dense_layers, parameter_bytes
from .timing import Timing, time_kernel, time_numpy, time_vm

FLOAT_BITS = 32
SETTINGS: tuple[tuple[int, int], ...] = ((32, 32), (4, 4), (3, 3), (2, 2), (1, 1), (1, 2), (2, 1))
KERNEL_SHAPES: tuple[tuple[int, int], ...] = ((4096, 4096), (784, 512))
KERNEL_ROWS: tuple[int, ...] = (1, 64)
KERNEL_BITS: tuple[tuple[int, int], ...] = ((2, 2), (1, 1))


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
