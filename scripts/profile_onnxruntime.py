#!/usr/bin/env python3
"""Where onnxruntime's time goes, node by node: the reference beside ``scripts/profile_kernels.py``.

onnxruntime's own profiler (``SessionOptions.enable_profiling``) on its CPU execution provider, with as many
intra-op threads as TVM_NUM_THREADS (as ``bench_latency.py`` runs it), after its graph optimizations (the
NCHWc convolutions MLAS runs, with their fused activations and residual adds): per node the median of its
kernel times over the runs after the warm-up, in graph order, and the sum per operator type. Put beside
``profile_kernels.py``'s table of the same model on the same machine, it shows which layers lose to MLAS.

    TVM_NUM_THREADS=2 python scripts/profile_onnxruntime.py exports/resnet50.torchscript.onnx \\
        --out results/profile_onnxruntime_resnet50.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np


def profile(model_bytes: bytes, inputs: dict[str, np.ndarray], threads: int, runs: int, warmup: int) -> list[dict]:
    """One row per node in the order onnxruntime first ran them: name, operator, median microseconds."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    with tempfile.TemporaryDirectory(prefix="profile-onnxruntime-") as tmp:
        options.profile_file_prefix = str(Path(tmp) / "ort")
        session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
        for _ in range(warmup + runs):
            session.run(None, inputs)
        events = json.loads(Path(session.end_profiling()).read_text())
    times: dict[str, list[int]] = defaultdict(list)
    operators: dict[str, str] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            node = event["name"].removesuffix("_kernel_time")
            times[node].append(event["dur"])
            operators[node] = event["args"].get("op_name", "?")
    return [
        {"node": node, "operator": operators[node], "us": statistics.median(durations[warmup:] or durations)}
        for node, durations in times.items()
    ]


def table(name: str, rows: list[dict], threads: int, runs: int) -> str:
    total = sum(row["us"] for row in rows)
    by_operator: dict[str, float] = defaultdict(float)
    for row in rows:
        by_operator[row["operator"]] += row["us"]
    lines = [
        f"## onnxruntime's node time of {name} ({threads} intra-op threads)",
        "",
        f"Sum over the nodes: {total:,.0f} us (onnxruntime's profiler, median of {runs} runs after the warm-up).",
        "",
        "| operator | nodes | us | share |",
        "|---|---:|---:|---:|",
    ]
    counts = defaultdict(int)
    for row in rows:
        counts[row["operator"]] += 1
    for operator, us in sorted(by_operator.items(), key=lambda item: -item[1]):
        lines.append(f"| {operator} | {counts[operator]} | {us:,.0f} | {100 * us / total:.1f} % |")
    lines += ["", "In the order they ran:", "", "| node | operator | us |", "|---|---|---:|"]
    lines += [f"| {row['node']} | {row['operator']} | {row['us']:,.0f} |" for row in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a zoo spec or an ONNX file")
    parser.add_argument("--runs", type=int, default=25, help="profiled runs after the warm-up (default 25)")
    parser.add_argument("--warmup", type=int, default=5, help="runs left out first (default 5)")
    parser.add_argument("--out", type=Path, help="write the table here (default: print it)")
    args = parser.parse_args()

    from tvm_memplan.deploy.results import write_or_print
    from tvm_memplan.frontend import load_model

    model = load_model(args.model)
    rng = np.random.default_rng(0)
    inputs = {name: rng.standard_normal(shape).astype(dtype) for name, shape, dtype in model.input_specs()}
    threads = int(os.environ.get("TVM_NUM_THREADS", 0) or 0) or os.cpu_count() or 1
    rows = profile(model.onnx_model.SerializeToString(), inputs, threads, args.runs, args.warmup)
    text = table(model.name, rows, threads, args.runs)
    write_or_print(args.out, text)


if __name__ == "__main__":
    main()
