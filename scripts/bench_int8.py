"""Int8 (QDQ) networks side by side: arenas, weights, latency against onnxruntime, LSB differences.

    TVM_NUM_THREADS=2 python scripts/bench_int8.py --threads 2 --out results/bench_int8.md

Each float model is quantized with onnxruntime's ``quantize_static`` (``tvm-memplan quantize --int8``:
QDQ, per-channel int8 weights, int8 activations, MinMax on random normal calibration inputs: the
weights are the zoo's random ones, so only the arithmetic is meaningful, not accuracy). Then, in one
run: the float and int8 arenas and the int8 liveness bound; the initializer bytes; whether the VM's
storage requests equal the plan; latency of our int8 build, onnxruntime on the same int8 file at
the same threads, and our float build (medians over interleaved rounds); the largest output
difference from onnxruntime's default session in output LSB beside onnxruntime's own
optimized-vs-unoptimized spread; the top class agreement on the same inputs (20 by default).

Weights are counted twice: the ONNX files' initializers (the int8 file adds per-channel weight scales
and zero points, int32 biases with their own scales and zero points) and the tensors the built VM
executables hold (:mod:`tvm_memplan.deploy.artifact`): int8 weights, int32 biases with the input's
zero point folded in, one float32 requantization multiplier per output channel, lookup tables.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tvm_memplan.quant.reference import TopClassAgreement

ROUNDS = 5
"""Interleaved rounds per model; each round times our int8 build, onnxruntime and our float build in turn."""

DEFAULT_MODELS = [
    "zoo:mcu_cnn",
    "zoo:mobilenet_v2?width=0.35&resolution=144",
    "zoo:squeezenet1_0",
    "zoo:mobilenet_v2",
    "zoo:googlenet",
]


def _tvm_timer(executable, inputs: dict[str, np.ndarray]) -> Callable[[], list[float]]:
    """One round of a VM's latency: 3 repeats of at least 50 ms, in ms."""
    import tvm
    from tvm import relax

    dev = tvm.cpu()
    vm = relax.VirtualMachine(executable, dev)
    args = [tvm.runtime.tensor(a, dev) for a in inputs.values()]
    evaluator = vm.time_evaluator("main", dev, number=1, repeat=3, min_repeat_ms=50)
    return lambda: [r * 1e3 for r in evaluator(*args).results]


def _onnxruntime_timer(path: Path, inputs: dict[str, np.ndarray], threads: int) -> Callable[[], list[float]]:
    """One round of onnxruntime's latency on ``path``: 3 repeats of at least 50 ms, in ms."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    session.run(None, inputs)

    def round_() -> list[float]:
        repeats = []
        for _ in range(3):
            start, runs = time.perf_counter(), 0
            while time.perf_counter() - start < 0.05:
                session.run(None, inputs)
                runs += 1
            repeats.append((time.perf_counter() - start) / runs * 1e3)
        return repeats

    return round_


def interleaved_medians(timers: dict[str, Callable[[], list[float]]], rounds: int = ROUNDS) -> dict[str, float]:
    """Median latency of each timer over ``rounds`` rounds that take turns (A, B, C, A, B, C, ...), so a
    change in the machine's speed during the run (other jobs, frequency) reaches every column alike."""
    samples: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(rounds):
        for name, timer in timers.items():
            samples[name] += timer()
    return {name: float(np.median(values)) for name, values in samples.items()}


def bench_model(
    spec: str, threads: int, samples: int, inputs_checked: int, order_seconds: float, tvm_target: Any = None
) -> dict:
    import onnx

    from tvm_memplan.deploy.artifact import constant_bytes
    from tvm_memplan.frontend import LoadedModel, load_model, to_relax
    from tvm_memplan.planner import plan_model
    from tvm_memplan.quant.calibrate import quantize_int8
    from tvm_memplan.quant.lower import LowerQDQ
    from tvm_memplan.quant.reference import lsb_difference, output_scales, run_onnxruntime, top_class_agreement
    from tvm_memplan.verify import run_vm

    float_model = load_model(spec)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="bench-int8-") as tmp:
        source, target = Path(tmp) / "float.onnx", Path(tmp) / "int8.onnx"
        onnx.save(float_model.onnx_model, str(source))
        calib = {
            name: rng.standard_normal((samples, *shape[1:])).astype(dtype)
            for name, shape, dtype in float_model.input_specs()
        }
        report = quantize_int8(source, target, calib)
        int8 = LoadedModel(float_model.name + ".int8", onnx.load(str(target)))
        lowering = []
        LowerQDQ(lowering.append)(to_relax(int8))
        float_plan = plan_model(float_model, tvm_target, order_seconds=order_seconds)
        int8_plan = plan_model(int8, tvm_target, order_seconds=order_seconds)
        int8_exe, float_exe = int8_plan.build(), float_plan.build()
        scale = output_scales(int8.onnx_model)[0]
        ours_lsb, spread_lsb, ours_first, fused_first, plain_first = [], [], [], [], []
        trace_ok = True
        for seed in range(inputs_checked):
            inputs = int8.random_inputs(seed)
            ours, trace = run_vm(int8_exe, inputs)
            expected = [a["arena_bytes"] for a in int8_plan.main.arenas] + [int(o.nbytes) for o in ours]
            trace_ok &= Counter(trace.storage_bytes) == Counter(expected)
            fused = run_onnxruntime(int8.onnx_model, inputs)[0]
            plain = run_onnxruntime(int8.onnx_model, inputs, optimized=False)[0]
            if scale is not None:
                ours_lsb.append(lsb_difference(ours[0], fused, scale))
                spread_lsb.append(lsb_difference(plain, fused, scale))
            ours_first.append(ours[0])
            fused_first.append(fused)
            plain_first.append(plain)
        inputs = int8.random_inputs(0)
        latency = interleaved_medians(
            {
                "ms_ours_int8": _tvm_timer(int8_exe, inputs),
                "ms_ort_int8": _onnxruntime_timer(target, inputs, threads),
                "ms_ours_float": _tvm_timer(float_exe, inputs),
            }
        )
        built_float, built_int8 = constant_bytes(float_exe), constant_bytes(int8_exe)
        top = top_class_agreement(ours_first, fused_first, plain_first, scale)
        return {
            "model": spec,
            "float_arena": float_plan.main.arena_bytes,
            "int8_arena": int8_plan.main.arena_bytes,
            "int8_bound": int8_plan.main.lower_bound_bytes,
            "weights_float": report.weight_bytes_float,
            "weights_int8": report.weight_bytes_int8,
            "built_float": built_float.total,
            "built_int8": built_int8.total,
            "built_int8_by_dtype": built_int8.by_dtype,
            "kept_float": len(lowering[0].kept_float),
            "trace_ok": trace_ok,
            **latency,
            "lsb": max(ours_lsb, default=None),
            "spread": max(spread_lsb, default=None),
            "top": top_class_cell(top),
        }


def top_class_cell(top: TopClassAgreement) -> str:
    """The agreement, whether it misses the issue's rule, and the default run's top-two margins (LSB)
    wherever a run's top class differs: a disagreement at a margin of 0-2 LSB is a near tie."""
    notes = [] if top.ok else ["fewer than onnxruntime's unoptimized run"]
    for run, margins in (("ours", top.ours_margins_lsb), ("unoptimized", top.unoptimized_margins_lsb)):
        if margins:
            notes.append(f"{run} differs at default-run margins of {', '.join(map(str, margins))} LSB")
    return str(top) + (f" ({'; '.join(notes)})" if notes else "")


def table(rows: list[dict], threads: int, cpu: str, load: tuple[float, float], isa: str) -> str:
    header = (
        f"## Int8 (QDQ) networks: tvm_memplan against onnxruntime ({threads} thread(s), {cpu})\n\n"
        f"Our kernels: {isa}. onnxruntime picks its kernels from this CPU's instruction set at run time.\n\n"
        f"Load average {load[0]:.1f} before the run, {load[1]:.1f} after (other jobs on the same cores make "
        f"the latencies noisy; the other columns do not depend on it). Latencies: medians over {ROUNDS} "
        "interleaved rounds of 3 repeats (our int8 build, onnxruntime, our float build in turn).\n\n"
        "Arenas in bytes. Weights twice: the ONNX files' initializers (the int8 file adds per-channel scales, zero "
        "points, int32 biases and their scales and zero points) and the tensors the built VM executables hold "
        "(int8 build: int8 weights and lookup tables, int32 biases, float32 requantization multipliers). "
        "LSB: largest output difference from onnxruntime's default session (in brackets: onnxruntime's own "
        "unoptimized-vs-default spread); top class: agreement with onnxruntime's default run, ours / "
        "onnxruntime's unoptimized run, and where either differs, how far apart the default run's top class "
        "and that run's class were in the default run (LSB).\n\n"
        "| model | float arena | int8 arena | int8 bound | int8/float | ONNX weights float → int8 "
        "| built weights float → int8 | built int8/float | int8 build by type | groups kept float "
        "| VM = plan | int8 ms (ours) | int8 ms (onnxruntime) | float ms (ours) | LSB (spread) | top class |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for r in rows:
        by_dtype = " + ".join(f"{n:,} {t}" for t, n in sorted(r["built_int8_by_dtype"].items(), key=lambda i: -i[1]))
        lines.append(
            f"| {r['model']} | {r['float_arena']:,} | {r['int8_arena']:,} | {r['int8_bound']:,} "
            f"| {r['int8_arena'] / r['float_arena']:.3f} | {r['weights_float']:,} → {r['weights_int8']:,} "
            f"| {r['built_float']:,} → {r['built_int8']:,} | {r['built_int8'] / r['built_float']:.4f} | {by_dtype} "
            f"| {r['kept_float']} | {'yes' if r['trace_ok'] else 'NO'} "
            f"| {r['ms_ours_int8']:.3f} | {r['ms_ort_int8']:.3f} "
            f"| {r['ms_ours_float']:.3f} | {r['lsb']} ({r['spread']}) | {r['top']} |"
        )
    return header + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=DEFAULT_MODELS, help="zoo specs or ONNX files (float)")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("TVM_NUM_THREADS", "1")))
    parser.add_argument("--samples", type=int, default=4, help="calibration samples (random normal)")
    parser.add_argument("--inputs", type=int, default=20, help="random inputs compared with onnxruntime")
    parser.add_argument("--order-seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path("results/bench_int8.md"))
    parser.add_argument(
        "--mcpu",
        help="build our kernels for this LLVM CPU (e.g. haswell: AVX2 on an AVX-512 "
        "machine); default: this machine's CPU",
    )
    args = parser.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)  # before TVM's thread pool starts
    from tvm_memplan.deploy.results import write_atomically

    load_before = os.getloadavg()[0]
    import tvm

    from tvm_memplan.schedule.cpu import cpu_spec

    target = tvm.target.Target({"kind": "llvm", "mcpu": args.mcpu}) if args.mcpu else None
    spec_of = cpu_spec(target or tvm.target.Target.from_device("cpu"))
    mcpu = args.mcpu or str(tvm.target.Target.from_device("cpu").attrs.get("mcpu", "host"))
    isa = (
        f"LLVM CPU `{mcpu}`, "
        f"{spec_of.lanes} float32 lanes, int8 convolutions with "
        f"{spec_of.int8_dot or 'no dot-product instruction'}"
    )
    rows = []
    for spec in args.models:
        rows.append(bench_model(spec, args.threads, args.samples, args.inputs, args.order_seconds, target))
        print(rows[-1], flush=True)
    write_atomically(args.out, table(rows, args.threads, _cpu_name(), (load_before, os.getloadavg()[0]), isa))


def _cpu_name() -> str:
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


if __name__ == "__main__":
    main()
