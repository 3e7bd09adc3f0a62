#!/usr/bin/env python3
"""Stock TVM vs memplan, side by side: latency and the memory the VM requested, as a Markdown table.

Both pipelines are built from one staged module (identical kernels) and measured in interleaved
rounds (stock, memplan, memplan, stock, ...) so that drift on a shared machine hits both alike.
Every round is appended to the results log, as ``tvm-memplan measure`` does.

    python scripts/bench_latency.py                                  # zoo:mobilenet_v2, zoo:mcu_cnn on this CPU
    python scripts/bench_latency.py zoo:squeezenet1_0 --rounds 5 --repeat 10
    python scripts/bench_latency.py zoo:mcu_cnn --rpc-tracker 127.0.0.1:9190 --rpc-key arm64-emu
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np

from tvm_memplan.deploy.build import PIPELINES, build_artifacts
from tvm_memplan.deploy.measure import Device, measure_artifact, reference_outputs
from tvm_memplan.deploy.results import DEFAULT_LOG, ResultsLog
from tvm_memplan.frontend import load_model


def bench(model: str, target: str, rounds: int, repeat: int, device: Device, log: ResultsLog) -> dict:
    loaded = load_model(model)
    inputs = loaded.random_inputs(0)
    reference = reference_outputs(loaded, inputs)
    with tempfile.TemporaryDirectory() as scratch:
        artifacts = build_artifacts(model, target, {p: Path(scratch) / f"{p}.so" for p in PIPELINES})
        runs: dict[str, list] = {p: [] for p in PIPELINES}
        for index in range(rounds):
            order = PIPELINES if index % 2 == 0 else PIPELINES[::-1]
            for pipeline in order:
                result = measure_artifact(device, artifacts[pipeline], inputs, reference, repeat, source=model)
                log.append(result.summary())
                runs[pipeline].append(result)
    row = {"model": model}
    for pipeline, results in runs.items():
        times = [ms for r in results for ms in r.repeats_ms]
        q25, median, q75 = np.percentile(times, [25, 50, 75])
        row[pipeline] = {
            "latency_ms": float(median),
            "spread_ms": float(q75 - q25),
            "requested_bytes": results[0].requested_bytes,
            "planned_bytes": results[0].planned_bytes,
            "correct": all(r.correct for r in results),
            "threads": results[0].tvm_num_threads,
        }
    return row


def _mib(nbytes: int | None) -> str:
    return "unknown" if nbytes is None else f"{nbytes / 2**20:.3f}"


def markdown(rows: list[dict], device: str, target: str, rounds: int, repeat: int) -> str:
    threads = rows[0]["memplan"]["threads"] or "unset (1 thread)"
    lines = [
        f"## Stock TVM vs memplan: latency and requested memory ({datetime.date.today()})",
        "",
        f"Device `{device}`, target `{target}`, TVM_NUM_THREADS={threads}, host {platform.machine()} with "
        f"{os.cpu_count()} cores; {rounds} interleaved rounds x {repeat} repeats per pipeline; latency is the "
        "median over all repeats, spread the interquartile range. Produced by `scripts/bench_latency.py`.",
        "",
        "| model | stock ms (IQR) | memplan ms (IQR) | memplan / stock | stock requested MiB | memplan requested MiB "
        "| memplan planned MiB | requested = plan | correct |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        stock, memplan = row["stock"], row["memplan"]
        equal = memplan["requested_bytes"] == memplan["planned_bytes"]
        lines.append(
            f"| {row['model']} | {stock['latency_ms']:.3f} ({stock['spread_ms']:.3f}) "
            f"| {memplan['latency_ms']:.3f} ({memplan['spread_ms']:.3f}) "
            f"| {memplan['latency_ms'] / stock['latency_ms']:.3f} "
            f"| {_mib(stock['requested_bytes'])} | {_mib(memplan['requested_bytes'])} | {_mib(memplan['planned_bytes'])} "
            f"| {'yes' if equal else 'NO'} | {'yes' if stock['correct'] and memplan['correct'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["zoo:mobilenet_v2", "zoo:mcu_cnn"])
    parser.add_argument("--target", default="host")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds per pipeline (default 4)")
    parser.add_argument("--repeat", type=int, default=5, help="timed repeats per round (default 5)")
    parser.add_argument("--rpc-tracker")
    parser.add_argument("--rpc-key")
    parser.add_argument("--out", default="results/latency.md", help="Markdown output (default results/latency.md)")
    parser.add_argument("--log", default=str(DEFAULT_LOG))
    args = parser.parse_args()

    if not args.rpc_tracker:
        os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    device = Device(args.rpc_tracker, args.rpc_key)
    log = ResultsLog(args.log)
    rows = []
    for model in args.models:
        print(f"benchmarking {model} ...", file=sys.stderr, flush=True)
        rows.append(bench(model, args.target, args.rounds, args.repeat, device, log))
    text = markdown(rows, device.name, args.target, args.rounds, args.repeat)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
