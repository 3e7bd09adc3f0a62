#!/usr/bin/env python3
"""Stock TVM against tvm_memplan on this machine's GPU devices: latency, memory, correctness, kernels.

Per model and device, in one run on one machine:
- ``stock``: TVM's planner (StaticPlanBlockMemory) and ``memplan``: the arena, both with the default
  GPU schedules (tvm_memplan's ThreadPerOutput for convolutions and pools, dlight for the rest);
- for ``--dlight-models``, memplan with dlight's rules alone (``schedule="none"``: the kernels TVM
  ships), and the LLVM build on this CPU, for reference;
- per-kernel times for ``--kernels`` under both schedule sets: each VM call timed between device
  synchronisations over ``--kernel-runs`` runs (the sum exceeds the model's latency by the syncs).
Latency is ``tvm-memplan measure``'s, each variant of a model built once and timed in ``--rounds``
interleaved rounds of ``--repeat`` timings (median and interquartile spread over all), outputs checked
against onnxruntime, storage requests traced. OpenCL on PoCL and Vulkan on lavapipe run on this CPU:
their latencies are a software device's and say nothing about a phone's GPU; ``cuda`` runs on an NVIDIA
GPU, and the apache-tvm wheel has its runtime already (no setup-gpu; nvcc or cuda-bindings' NVRTC compile).
The table is rewritten (atomically) after each model, so a run cut short keeps the rows measured; a model
that fails becomes a FAILED row (traceback on stderr), the others still run, and the exit status is 1.

    tvm-memplan setup-gpu --tvm-src TVM_V0.27_SOURCE      # or $TVM_MEMPLAN_TVM_SRC
    python scripts/bench_gpu.py --targets opencl vulkan --out results/bench_gpu.md
    python scripts/bench_gpu.py --targets cuda --out results/bench_gpu_cuda.md
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import json
import os
import platform
import shlex
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from tvm_memplan.deploy.build import build_artifacts
from tvm_memplan.deploy.measure import Device, Measurement, measure, measure_artifact, reference_outputs
from tvm_memplan.deploy.results import write_atomically
from tvm_memplan.deploy.targets import get_target
from tvm_memplan.frontend import load_model
from tvm_memplan.planner import plan_model

KERNEL_MODEL = "zoo:mobilenet_v2?width=0.35&resolution=144"
MODELS = [
    KERNEL_MODEL,
    "zoo:mcu_cnn",
    "zoo:mobilenet_v2",
    "zoo:squeezenet1_0",
    "zoo:googlenet",
    "zoo:bert_tiny",
]
SCHEDULES = {"default": "ThreadPerOutput + dlight", "none": "dlight only"}


SOFTWARE_DEVICES = {"pthread": "PoCL", "llvmpipe": "lavapipe"}
"""Markers in the device names of the OpenCL and Vulkan drivers that run kernels on the CPU."""


def device_name(target: str) -> str:
    if get_target(target).device == "cpu":
        return f"llvm: {platform.processor() or platform.machine()}"
    dev = tvm.device(get_target(target).device, 0)
    name = f"{target}: {dev.device_name}"
    if get_target(target).device == "cuda":
        name += f" (sm_{dev.compute_version.replace('.', '')}, {dev.total_global_memory / 2**30:,.0f} GiB)"
    return name


def devices_note(names: list[str]) -> str:
    """Which devices are software (kernels on this CPU) and which are GPUs, for the table's header."""
    software = [name for name in names if any(marker in name for marker in SOFTWARE_DEVICES)]
    hardware = [name for name in names if name not in software and not name.startswith("llvm:")]
    notes = []
    if software:
        drivers = sorted({driver for marker, driver in SOFTWARE_DEVICES.items() for n in software if marker in n})
        notes.append(
            f"**{', '.join(software)} run kernels on this CPU ({', '.join(drivers)}): latencies are a software "
            "device's, not a GPU's.**"
        )
    if hardware:
        notes.append(f"**{', '.join(hardware)}: a GPU.**")
    return " ".join(notes)


def schedules_of(target: str, label: str) -> str:
    """The schedules a variant's kernels come from (on the CPU: TVM's default or tvm_memplan's CPU rules)."""
    if get_target(target).device == "cpu":
        return "tvm_memplan CPU" if label == "memplan" else "TVM default"
    return SCHEDULES["none" if label == "dlight" else "default"]


def display(spec: str) -> str:
    """A zoo model by its spec, an ONNX file by its name."""
    return spec.removeprefix("zoo:") if spec.startswith("zoo:") else Path(spec).name


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def row(spec: str, device: str, pipeline: str, schedules: str, m: Measurement) -> str:
    requested = f"{m.requested_bytes / 1024:,.1f}" if m.requested_bytes is not None else "?"
    equal = "yes" if m.requested_bytes == m.planned_bytes else "NO"
    copies = "?" if m.zero_offset_calls is None else m.zero_offset_calls
    return (
        f"| {display(spec)} | {device} | {pipeline} | {schedules} | {m.latency_ms:,.3f} "
        f"| {m.latency_spread_ms:,.3f} | {requested} | {m.planned_bytes / 1024:,.1f} | {equal} | {copies} "
        f"| {'yes' if m.correct else 'NO'} | {m.max_abs_diff:.1e} |"
    )


def kernel_times(spec: str, target: str, schedule: str, runs: int) -> tuple[dict[str, float], int]:
    """Median ms per kernel (and VM builtin) over ``runs`` runs, and ensure_zero_offset calls per run."""
    model = load_model(spec)
    deploy_target = get_target(target)
    plan = plan_model(model, deploy_target.tvm_target(), schedule=schedule)
    dev = tvm.device(deploy_target.device, 0)
    vm = relax.VirtualMachine(plan.build(), dev)
    args = [tvm.runtime.tensor(x, dev) for x in model.random_inputs(0).values()]
    vm["main"](*args)  # compile the device kernels before timing
    per_run: list[dict[str, float]] = []
    calls: collections.Counter = collections.Counter()
    started: dict[str, float] = {}

    def instrument(_func, symbol: str, before: bool, _ret, *_args) -> int:
        dev.sync()
        if before:
            calls[symbol] += 1
            started[symbol] = time.perf_counter()
        else:
            per_run[-1][symbol] += (time.perf_counter() - started[symbol]) * 1e3
        return 0

    vm.set_instrument(instrument)
    for _ in range(runs):
        per_run.append(collections.defaultdict(float))
        vm["main"](*args)
    medians = {name: float(np.median([run[name] for run in per_run])) for name in per_run[0]}
    return medians, calls["vm.builtin.ensure_zero_offset"] // runs


def kernel_section(spec: str, target: str, runs: int, top: int) -> list[str]:
    times = {schedule: kernel_times(spec, target, schedule, runs) for schedule in SCHEDULES}
    lines = [f"## Per-kernel times: {display(spec)} on {device_name(target)}", ""]
    for schedule, (per_kernel, copies) in times.items():
        total = sum(per_kernel.values())
        lines += [
            f"{SCHEDULES[schedule]} (memplan): {total:,.1f} ms summed over {len(per_kernel)} kernels and "
            f"VM builtins (median of runs), `ensure_zero_offset` calls per run: {copies}",
            "",
            "| kernel | ms | share |",
            "|---|---:|---:|",
        ]
        for name, ms in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"| `{name}` | {ms:,.2f} | {100 * ms / total:.0f} % |")
        lines.append("")
    return lines


def measure_rounds(
    spec: str, target: str, variants: dict[str, tuple[str, dict]], rounds: int, repeat: int, min_repeat_ms: int
) -> dict[str, Measurement]:
    """Each variant (label: (pipeline, build options)) built once, then timed in ``rounds`` interleaved
    rounds (order reversed every other round) so that drift on the shared machine hits all alike."""
    problem = get_target(target).runtime_problem()
    if problem:
        raise SystemExit(problem)
    model = load_model(spec)
    inputs = model.random_inputs(0)
    reference = reference_outputs(model, inputs)
    device = Device()
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as scratch:
        artifacts: dict[str, Path] = {}
        by_options: dict[str, list[str]] = {}
        for label, (_, options) in variants.items():
            by_options.setdefault(json.dumps(options, sort_keys=True), []).append(label)
        for key, labels in by_options.items():
            outputs = {variants[label][0]: Path(scratch) / f"{label}.so" for label in labels}
            built = build_artifacts(spec, target, outputs, **json.loads(key))
            artifacts.update({label: built[variants[label][0]] for label in labels})
        order = list(variants)
        last: dict[str, Measurement] = {}
        times: dict[str, list[float]] = {label: [] for label in order}
        for index in range(rounds):
            for label in order if index % 2 == 0 else order[::-1]:
                last[label] = measure_artifact(device, artifacts[label], inputs, reference, repeat, min_repeat_ms)
                times[label] += last[label].repeats_ms
    results = {}
    for label, measured in last.items():
        q25, median, q75 = np.percentile(times[label], [25, 50, 75])
        results[label] = dataclasses.replace(
            measured, latency_ms=float(median), latency_spread_ms=float(q75 - q25), repeats_ms=times[label]
        )
    return results


def document(args: argparse.Namespace, rows: list[str], kernels: list[str], started: float, load_before: str) -> str:
    """The results file: how it was measured, the table, the per-kernel section."""
    names = [device_name(t) for t in args.targets]
    lines = [
        "# GPU backends: stock TVM against tvm_memplan (`scripts/bench_gpu.py`)",
        "",
        f"`python scripts/bench_gpu.py {shlex.join(sys.argv[1:])}`",
        "",
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, host {platform.machine()} with "
        f"{os.cpu_count()} cores (load average {load_before} before, {load()} now, "
        f"{time.time() - started:,.0f} s), TVM {tvm.__version__}, TVM_NUM_THREADS={os.environ['TVM_NUM_THREADS']}. "
        + (f"{devices_note(names)} " if devices_note(names) else "")
        + "Latency: median and interquartile spread of "
        f"{args.rounds} x {args.repeat} timings (each the mean of back-to-back calls filling at least "
        f"{args.min_repeat_ms} ms, the device synchronised at its end), the variants of a model "
        "built once and timed in interleaved rounds. Requested: the VM's `alloc_storage` "
        "calls in one run (outputs included); `= plan`: requested equals the plan (memplan's arena or "
        "TVM's blocks, plus outputs); `ensure_zero_offset`: calls in one run (on OpenCL and Vulkan each one at a "
        "nonzero offset copies a tensor outside the plan; no copy on the CPU and CUDA, which move the offset into "
        "the pointer, but still a VM call). Correct: outputs against onnxruntime. Schedules: tvm_memplan's GPU rule "
        "for convolutions and pools ahead of dlight, dlight alone (the kernels TVM ships), or the LLVM build "
        "on the host CPU with tvm_memplan's CPU schedules.",
        "",
        "| model | device | pipeline | schedules | latency ms | spread ms | requested KiB | planned KiB | = plan "
        "| `ensure_zero_offset` | correct | max abs diff |",
        "|---|---|---|---|---:|---:|---:|---:|:---:|---:|:---:|---:|",
        *rows,
        "",
        *kernels,
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=MODELS)
    parser.add_argument(
        "--targets", nargs="+", default=["opencl"], help="deploy targets: cuda, opencl, vulkan (host: the CPU)"
    )
    parser.add_argument("--dlight-models", nargs="*", default=[KERNEL_MODEL])
    parser.add_argument("--kernels", default=KERNEL_MODEL, help="the model of the per-kernel section ('': none)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of stock, memplan (and dlight)")
    parser.add_argument("--repeat", type=int, default=4, help="timings per variant and round")
    parser.add_argument("--min-repeat-ms", type=int, default=50)
    parser.add_argument("--kernel-runs", type=int, default=5)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    started, load_before = time.time(), load()
    rows: list[str] = []
    failed: list[str] = []
    for target in args.targets:
        device = device_name(target)
        for spec in args.models:
            printed = len(rows)
            variants = {"stock": ("stock", {}), "memplan": ("memplan", {})}
            if spec in args.dlight_models:
                variants["dlight"] = ("memplan", {"schedule": "none"})
            try:
                results = measure_rounds(spec, target, variants, args.rounds, args.repeat, args.min_repeat_ms)
            except Exception as exc:  # noqa: BLE001 - one model's failure is a row, the others still run
                traceback.print_exc()
                reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1].replace("|", "/")[:200]
                cells = [display(spec), device, f"FAILED: {reason}", *[""] * 7, "NO", ""]
                rows.append("| " + " | ".join(cells) + " |")
                failed.append(f"{display(spec)} on {target}")
                results = {}
            for label, m in results.items():
                rows.append(row(spec, device, m.pipeline, schedules_of(target, label), m))
            if spec in args.dlight_models and results:
                host = measure(spec, "host", repeat=args.rounds * args.repeat, min_repeat_ms=args.min_repeat_ms)
                rows.append(row(spec, device_name("host"), "memplan", "tvm_memplan CPU", host["memplan"]))
            print(*rows[printed:], sep="\n", flush=True)
            if args.out:
                write_atomically(args.out, document(args, rows, [], started, load_before))
    kernels = kernel_section(args.kernels, args.targets[0], args.kernel_runs, args.top) if args.kernels else []
    text = document(args, rows, kernels, started, load_before)
    print(text)
    if args.out:
        write_atomically(args.out, text)
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
