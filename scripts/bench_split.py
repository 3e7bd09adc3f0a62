"""Fine-grained splitting (seed 003) per model: arena before and after, latency before and after
side by side, onnxruntime for perspective, search time cold and warm.

    TVM_NUM_THREADS=2 python scripts/bench_split.py zoo:mcu_cnn "zoo:mobilenet_v2?width=0.35&resolution=144" \\
        --fused-tiles off auto --out results/bench_split.md

Each model is searched once per ``--fused-tiles`` setting (a row each): ``off`` runs every kernel of a
split chain once per tile; ``auto`` lets the search run a chain's tiles as one kernel where that measured
faster. The split column marks fused chains; launches are the kernel calls of one inference.

"Before" is today's best coarse-grained plan (order search + in-place + concat elimination); "after"
is the same pipeline on the split model. Latencies are the whole model compiled both ways with the
default CPU schedules, timed in interleaved rounds; the search's own estimate (chains timed alone)
is listed too. Every split plan is verified: outputs against onnxruntime, the VM's allocations
against the plan.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from tvm_memplan.deploy.results import write_atomically
from tvm_memplan.deploy.split import search_split
from tvm_memplan.frontend import load_model, to_relax
from tvm_memplan.planner import plan_model
from tvm_memplan.relax.ir_utils import top_level_bindings
from tvm_memplan.relax.pipeline import stage_passes
from tvm_memplan.verify import verify_plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_latency import OnnxRuntime  # noqa: E402


def _spread(samples: list[float]) -> tuple[float, float]:
    q25, median, q75 = np.percentile(samples, [25, 50, 75])
    return float(median), float(q75 - q25)


_KERNEL_CALLS = (tvm.ir.Op.get("relax.call_tir"), tvm.ir.Op.get("relax.call_tir_inplace"))


def launches(mod: tvm.IRModule) -> int:
    """Kernel calls of one inference: ``main``'s calls after TVM's fusion and the tile passes."""
    target = tvm.target.Target("llvm")
    with target:
        fused = tvm.transform.Sequential(stage_passes(target, layout="nchw").dataflow)(mod)
    calls = [b.value for b in top_level_bindings(fused["main"]) if isinstance(b.value, relax.Call)]
    return sum(any(call.op.same_as(op) for op in _KERNEL_CALLS) for call in calls)


def bench(spec: str, budget: float, seconds: float, order_seconds: float, fused_tiles: str = "off") -> dict:
    model = load_model(spec)
    with tempfile.TemporaryDirectory() as scratch:
        cache = Path(scratch) / "latency.jsonl"
        started = time.perf_counter()
        outcome = search_split(model, budget=budget, seconds=seconds, cache=cache, fused_tiles=fused_tiles)
        cold = time.perf_counter() - started
        started = time.perf_counter()
        again = search_split(model, budget=budget, seconds=seconds, cache=cache, fused_tiles=fused_tiles)
        warm = time.perf_counter() - started
    # split plans are built in NCHW (``--split acg`` does not tile blocked tensors yet): so is the coarse one
    coarse = plan_model(model, order_seconds=order_seconds, layout="nchw")
    split = plan_model(model, prepare=outcome.prepare(), order_seconds=order_seconds, layout="nchw")
    verified = verify_plan(split)
    threads = int(os.environ.get("TVM_NUM_THREADS", "1"))
    inputs = model.random_inputs(0)
    ort_ms, ort_spread = _spread(OnnxRuntime(spec, threads).time(inputs, 20))
    result = outcome.result
    beyond = [p for p in result.front if p.peak_bytes < result.best.peak_bytes]
    return {
        "model": spec,
        "fused_tiles": fused_tiles,
        "launches": (launches(outcome.prepare()(to_relax(model))), launches(to_relax(model))),
        "coarse_arena": coarse.total("arena_bytes"),
        "split_arena": split.total("arena_bytes"),
        "before": _spread(outcome.samples_before_ms),
        "after": _spread(outcome.samples_after_ms),
        "estimate": result.best.latency_ms / result.original.latency_ms - 1 if result.original.latency_ms else 0.0,
        "onnxruntime": (ort_ms, ort_spread),
        "chains": len(outcome.chains),
        "split": ", ".join(f"{c.chain.name} x{c.parts}{' fused' if c.fused else ''}" for c in outcome.choices)
        or "none",
        "search_s": (cold, warm),
        "warm_measurements": again.cache_misses,
        "correct": verified.ok,
        "problems": verified.problems,
        "beyond": min(beyond, key=lambda p: p.peak_bytes) if beyond else None,
        "original_ms": result.original.latency_ms,
        "bottleneck": "; ".join(outcome.bottleneck[:3]),
        "stopped": result.stopped,
    }


def markdown(rows: list[dict], budget: float) -> str:
    threads = os.environ.get("TVM_NUM_THREADS", "unset (1 thread)")
    lines = [
        f"## Fine-grained splitting: arena and latency ({datetime.date.today()})",
        "",
        f"Target `host` ({tvm.target.Target.from_device('cpu')}), {platform.machine()} with {os.cpu_count()} cores, "
        f"TVM_NUM_THREADS={threads}, latency budget {budget:.0%}. Arena = the planner's arena for the whole model "
        "(coarse: order search + in-place + concat elimination; split: the same on the split model). Latency: "
        "whole model, default CPU schedules, median (IQR) over 3 interleaved rounds x 5 repeats. Search: seconds "
        "of a first search (empty latency cache) / a second one (cache filled by the first). Produced by "
        "`scripts/bench_split.py`.",
        "",
        "| model | fused tiles | coarse arena KiB | split arena KiB | reduction | latency before ms | after ms "
        "| overhead (search's estimate) "
        "| onnxruntime ms | chains found / split (fused: one kernel per chain) | launches unsplit / split "
        "| search s cold / warm | correct, VM = plan | smaller on the front | bottleneck now |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        before, after = r["before"], r["after"]
        beyond = r["beyond"]
        front = (
            f"{r['coarse_arena'] / beyond.peak_bytes:.2f}x at {beyond.latency_ms / r['original_ms'] - 1:+.1%}"
            if beyond
            else "—"
        )
        lines.append(
            f"| {r['model']} | {r['fused_tiles']} | {r['coarse_arena'] / 1024:.1f} | {r['split_arena'] / 1024:.1f} | "
            f"{r['coarse_arena'] / r['split_arena']:.2f}x | {before[0]:.3f} ({before[1]:.3f}) | {after[0]:.3f} "
            f"({after[1]:.3f}) | "
            f"{after[0] / before[0] - 1:+.1%} ({r['estimate']:+.1%}) | {r['onnxruntime'][0]:.3f} | "
            f"{r['chains']} / {r['split']} | {r['launches'][1]} / {r['launches'][0]} | "
            f"{r['search_s'][0]:.0f} / {r['search_s'][1]:.0f} | "
            f"{'yes' if r['correct'] else 'NO: ' + '; '.join(r['problems'])} | {front} | {r['bottleneck']} |"
        )
    lines.append("")
    lines.append(
        "Why each search stopped: "
        + "; ".join(f"{r['model']} ({r['fused_tiles']}): {r['stopped']}" for r in rows)
        + "."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--latency-budget", type=float, default=0.05)
    parser.add_argument("--search-seconds", type=float, default=120.0)
    parser.add_argument("--order-seconds", type=float, default=10.0)
    parser.add_argument(
        "--fused-tiles", nargs="+", choices=["off", "on", "auto"], default=["off"], help="one row per setting"
    )
    parser.add_argument("--out", type=Path, default=Path("results") / "bench_split.md")
    args = parser.parse_args(argv)
    rows = []
    for spec in args.models:
        print(f"== {spec}", flush=True)
        for fused_tiles in args.fused_tiles:
            rows.append(bench(spec, args.latency_budget, args.search_seconds, args.order_seconds, fused_tiles))
    text = markdown(rows, args.latency_budget)
    write_atomically(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
