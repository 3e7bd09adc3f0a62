"""Plan, split and verify third-party ONNX exports (``scripts/export_torch.py``), as a Markdown table.

    python scripts/export_torch.py --out exports/
    TVM_NUM_THREADS=2 python scripts/check_exports.py exports/*.onnx --out results/exports.md

Per file, two runs of ``tvm-memplan plan FILE --split acg``, each a separate process (a crash or an
error is one row, not the end of the table):

1. the product's answer: the latency budget (default 5 %), the plan the search keeps;
2. the most-split plan on that run's Pareto front, asked for with ``--memory-limit`` (the
   fastest plan that fits) and ``--verify``: built, run, compared with stock TVM and onnxruntime,
   and the VM's storage requests traced against the plan. This checks that the rewrite is right
   on the exporter's graph whatever the timing noise made run 1 keep. Its latencies come from the
   cache of run 1.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import onnx

from tvm_memplan.deploy.results import write_atomically

RECHECK_TIME = 4
"""Run 2 searches again, under a memory limit, from run 1's measurements: a few times run 1's time limit
so that a busy machine does not stop it short of the plan run 1 found."""


def _plan(path: Path, extra: list[str], cache: Path, timeout: int) -> tuple[dict | None, str]:
    command = [
        sys.executable,
        "-m",
        "tvm_memplan.cli.main",
        "plan",
        str(path),
        "--split",
        "acg",
        "--json",
        "--split-cache",
        str(cache),
        *extra,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return None, f"exit {done.returncode}: {lines[-1][:160] if lines else ''}"
    return json.loads(done.stdout), ""


def _ops(path: Path) -> str:
    counts = Counter(node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node)
    return ", ".join(f"{op} {n}" for op, n in counts.most_common(6))


def row(path: Path, budget: float, seconds: float, cache: Path, timeout: int, layout: str) -> str:
    start = time.perf_counter()
    name = path.name.removesuffix(".onnx")
    run = ["--layout", layout, "--latency-budget", str(budget), "--search-seconds", str(seconds)]
    kept, error = _plan(path, run, cache, timeout)
    if kept is None:
        return f"| {name} | {_ops(path)} | failed: {error} | | | | | | |"
    coarse = kept["peak_before_bytes"]
    smallest = min(kept["pareto_front"], key=lambda p: p["peak_bytes"])
    checked, error = (
        (kept, "")
        if smallest["peak_bytes"] >= coarse
        else _plan(
            path,
            [
                "--layout",
                layout,
                "--memory-limit",
                str(smallest["peak_bytes"]),
                "--search-seconds",
                str(RECHECK_TIME * seconds),
                "--verify",
            ],
            cache,
            timeout,
        )
    )
    if checked is None:
        verified = f"failed: {error}"
    elif "verify" not in checked:
        verified = "nothing to split"
    else:
        v = checked["verify"]
        verified = (
            f"{'yes' if v['identical_to_stock'] and not v['problems'] else 'NO'}, "
            f"{v['max_abs_diff_vs_onnxruntime']:.1e}, "
            f"{'= plan' if v['vm_storage_bytes'] == v['planned_storage_bytes'] else 'NOT = plan'} "
            f"({checked['peak_after_bytes'] / 1024:,.0f} KiB)"
        )
    subgraphs = ", ".join(f"{s['chain']} x{s['parts']}" for s in kept["split_subgraphs"]) or "none"
    return (
        f"| {name} | {_ops(path)} | {kept['split_candidates']} | {coarse / 1024:,.0f} "
        f"| {kept['peak_after_bytes'] / 1024:,.0f} ({coarse / kept['peak_after_bytes']:.2f}x) "
        f"| {kept['latency_before_ms']:.2f} / {kept['latency_after_ms']:.2f} | {subgraphs} "
        f"| {smallest['peak_bytes'] / 1024:,.0f} ({coarse / smallest['peak_bytes']:.2f}x) at "
        f"{smallest['latency_ms']:.2f} ms | {verified} | {time.perf_counter() - start:,.0f} |"
    )


def header(budget: float, seconds: float, layout: str) -> list[str]:
    return [
        "# Third-party ONNX exports: planned, split and verified (`scripts/check_exports.py`)",
        "",
        f"Files from `scripts/export_torch.py` (torchvision, timm and transformers networks with random weights; "
        f"`torchscript` = `torch.onnx.export(dynamo=False)`, `dynamo` = the `torch.export` exporter). "
        f"Host CPU, `--layout {layout}`, latency budget {budget:.0%}, search {seconds:g} s. Coarse = the arena "
        f"without splitting (order search, in-place, concat elimination); kept = the plan the search keeps within "
        f"the budget (latency measured on this machine, whole model both ways); smallest = the most-split point of "
        f"the Pareto front with its estimated latency; checked = that plan built with `--memory-limit` and "
        f"`--verify`: identical to stock TVM, max abs diff against onnxruntime, the VM's storage requests against "
        f"the plan.",
        "",
        "| file | most frequent ONNX ops | chains | coarse KiB | kept KiB | latency ms before / after "
        "| split chains (parts) | smallest on the front | checked: correct, diff, VM | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--latency-budget", type=float, default=0.05)
    parser.add_argument("--search-seconds", type=float, default=30)
    parser.add_argument("--cache", type=Path, default=Path("exports_split_cache.jsonl"))
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per plan run")
    parser.add_argument(
        "--layout",
        choices=("nchw", "auto", "blocked"),
        default="nchw",
        help="activation layout of both runs (default nchw: the front's peaks are the simulator's NCHW bytes, which "
        "run 2 asks for as a planned arena; blocked tensors pad channels to whole blocks, so there a front point can "
        "miss its own peak)",
    )
    args = parser.parse_args()
    lines = header(args.latency_budget, args.search_seconds, args.layout)
    for path in args.files:
        lines.append(row(path, args.latency_budget, args.search_seconds, args.cache, args.timeout, args.layout))
        print(lines[-1], flush=True)
    if args.out:
        write_atomically(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
