"""Fine-grained splitting per model: arena before and after, latency before and after side by side,
onnxruntime for perspective, search time cold and warm, the simulator's floor, and for a model that
misses its reduction target, the chain that holds it above the floor and what that chain costs fused.

    TVM_NUM_THREADS=2 python scripts/bench_split.py zoo:mcu_cnn "zoo:mobilenet_v2?width=0.35&resolution=144" \\
        --fused-tiles off auto --out results/bench_split.md

The full run (torchvision exports made by ``scripts/export_torch.py``, here in ``exports/``)::

    TVM_NUM_THREADS=2 python scripts/bench_split.py exports/mobilenet_v2_035.torchscript.onnx \\
        exports/mobilenet_v2.torchscript.onnx exports/squeezenet1_0.torchscript.onnx \\
        exports/googlenet.torchscript.onnx exports/inception_v3.torchscript.onnx \\
        exports/resnext50_32x4d.torchscript.onnx exports/efficientnet_b0.torchscript.onnx \\
        exports/mnasnet1_0.torchscript.onnx exports/shufflenet_v2_x1_0.torchscript.onnx \\
        --fused-tiles auto --search-seconds 120 --out results/bench_split_coverage.md

Each model is searched once per ``--fused-tiles`` setting (a row each): ``off`` runs every kernel of a
split chain once per tile; ``auto`` lets the search run a chain's tiles as one kernel where that measured
faster. The split column says, per chain, whether its tiles run fused (one kernel; halos recomputed or kept
in a line buffer) or per kernel;
launches are the kernel calls of one inference.

"Before" is today's best coarse-grained plan (order search + in-place + concat elimination); "after"
is the same pipeline on the split model. Latencies are the whole model compiled both ways with the
default CPU schedules, timed in interleaved rounds; the search's own estimate (chains timed alone)
is listed too. Every split plan is verified: outputs against onnxruntime, the VM's allocations
against the plan.

The floor is the simulator's lowest peak with every chain free to split, latency ignored (the same
search with every split costing nothing): what splitting can reach at most. Where a model misses its
reduction target (:data:`TARGETS`, or ``--target NAME=X``), the last column names the chain that holds
the kept plan's peak and that the floor plan splits, in the floor plan's parts: its measured cost against
the whole model's latency and the budget, and the reduction the floor plan simulates with it, as the floor
plan runs its tiles, fused one tile at a time and fused with a tile per worker. The floor runs every chain
one tile at a time; the kernels fast enough for the budget run a tile per worker and hold that many tiles.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from tvm_memplan.deploy.chain_latency import ChainLatency
from tvm_memplan.deploy.measure import Device
from tvm_memplan.deploy.results import write_atomically
from tvm_memplan.deploy.split import SplitOutcome, overhead_and_noise, search_split
from tvm_memplan.deploy.targets import get_target
from tvm_memplan.frontend import LoadedModel, load_model, to_relax
from tvm_memplan.planner import plan_model
from tvm_memplan.planning import DEFAULT_ALIGNMENT
from tvm_memplan.relax.ir_utils import top_level_bindings
from tvm_memplan.relax.layout import layout_block
from tvm_memplan.relax.pipeline import stage_passes
from tvm_memplan.relax.split import find_chains, in_order, normalize, program_of
from tvm_memplan.relax.split.rewrite import windows_in_place
from tvm_memplan.split.chain import SpatialChain, SplitChoice, in_channel_blocks
from tvm_memplan.split.search import Point, simulated_floor
from tvm_memplan.split.simulate import Program, peak, split_program
from tvm_memplan.verify import verify_plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_latency import OnnxRuntime  # noqa: E402


def _spread(samples: list[float]) -> tuple[float, float]:
    q25, median, q75 = np.percentile(samples, [25, 50, 75])
    return float(median), float(q75 - q25)


_KERNEL_CALLS = (tvm.ir.Op.get("relax.call_tir"), tvm.ir.Op.get("relax.call_tir_inplace"))


def launches(mod: tvm.IRModule, layout: str = "nchw", windows_in_place: bool = True) -> int:
    """Kernel calls of one inference: ``main``'s calls after TVM's fusion and the tile passes, in ``layout``
    on this machine's CPU (``mod`` split with the given ``windows_in_place``, as the planner splits it)."""
    target = tvm.target.Target.from_device("cpu")
    with target:
        fused = tvm.transform.Sequential(stage_passes(target, layout=layout).dataflow)(mod)
    calls = [b.value for b in top_level_bindings(fused["main"]) if isinstance(b.value, relax.Call)]
    return sum(any(call.op.same_as(op) for op in _KERNEL_CALLS) for call in calls)


TARGETS = {
    "mobilenet_v2_035": 6.0,
    "mobilenet_v2": 7.0,
    "googlenet": 3.0,
    "squeezenet1_0": 7.0,
    "inception_v3": 3.0,
}
"""Arena reductions against the coarse plan that issue 25 asks of these networks (MobileNetV2-0.35 at 144)."""


def model_key(spec: str) -> str:
    """``exports/mobilenet_v2_035.torchscript.onnx`` and ``zoo:mobilenet_v2?width=0.35&resolution=144`` both
    give ``mobilenet_v2_035``; ``zoo:googlenet`` gives ``googlenet``."""
    if spec.startswith("zoo:"):
        name, _, query = spec[4:].partition("?")
        width = dict(part.partition("=")[::2] for part in query.split("&") if part).get("width")
        return f"{name}_{width.replace('.', '')}" if width and float(width) != 1.0 else name
    return re.sub(r"(\.torchscript)?\.onnx$", "", Path(spec).name)


def holding_chain(program: Program, floor: Point, kept_live: tuple[str, ...]) -> SplitChoice | None:
    """The floor plan's split that removes the most bytes live at the kept plan's peak (the chain
    holding the kept plan above the floor), else the one whose tiles are live at the floor's own peak."""

    def tensors(choice: SplitChoice) -> set[str]:
        return {program.tensor(b) for b in choice.chain.bindings}

    live = {name.partition("#")[0] for name in kept_live}
    weight = {c: sum(program.sizes.get(t, 0) for t in tensors(c) & live) for c in floor.choices if c.chain.bindings}
    best = max(weight, key=weight.get, default=None)
    if best is not None and weight[best] > 0:
        return best
    at_floor = peak(split_program(program, list(floor.choices))).live
    heads = {name.split("#")[1] for name in at_floor if name.count("#") >= 2}
    return next((c for c in floor.choices if c.chain.head in heads), None)


def floor_report(
    model: LoadedModel,
    outcome: SplitOutcome,
    cache: Path,
    floor_seconds: float,
    measure: bool = True,
    layout: str = "nchw",
    fusable: bool = True,
) -> dict:
    """The simulator's floor (with ``fusable``, tiles may also run as one kernel) and (with ``measure``: for a
    model with a target) the chain that holds the kept plan above it, timed the ways it can run
    (:func:`holding_variants`)."""
    mod = normalize(to_relax(model))
    mod = in_order(mod, outcome.order) if outcome.order else mod
    # the search's program and chains (deploy.split): tensors sized as the layout holds them
    block = layout_block(tvm.target.Target.from_device("cpu"), layout)
    program = program_of(mod, DEFAULT_ALIGNMENT, block=block)
    chains = find_chains(mod, block)
    chains = in_channel_blocks(chains, block) if block else chains
    floor = simulated_floor(program, chains, floor_seconds, fused=fusable)
    report = {"floor": (peak(program).bytes, floor.peak_bytes), "held": None}
    held = holding_chain(program, floor, outcome.result.bottleneck.live) if measure else None
    report["built"] = []
    if held is not None:
        measurer = ChainLatency(mod, get_target("host"), Device(), cache=cache, layout=layout)
        report["held"] = (held.chain.name, held.parts, holding_variants(program, floor, held, measurer))
        report["built"] = floor_plan_built(mod, program, floor, measurer)
    return report


def floor_plan_built(
    mod: tvm.IRModule, program: Program, floor: Point, measurer: ChainLatency
) -> list[tuple[str, float, int]]:
    """``(how, measured overhead, simulated peak)`` of the whole floor plan, built and timed against the unsplit
    model side by side (3 interleaved rounds, read as the search's confirmation reads them): its tiles as the
    floor plan runs them (one at a time), and every chain that can be one kernel fused with a tile per worker
    (a gathered chain's tiles written where they end up; halos kept in a line buffer where tiles share rows).
    Whether the floor is out of the budget's reach, and what the fast kernels' parallel tiles cost in memory."""
    per_worker = []
    for choice in floor.choices:
        chain = replace(choice.chain, gathered=False) if isinstance(choice.chain, SpatialChain) else choice.chain
        if not chain.fusable:
            per_worker.append(choice)
            continue
        rolling = isinstance(chain, SpatialChain) and chain.has_halo(choice.parts, measurer.workers)
        per_worker.append(SplitChoice(chain, choice.parts, True, measurer.workers, rolling))
    ways = [("as the floor plan runs its tiles", list(floor.choices))]
    if per_worker != list(floor.choices):
        ways.append((f"fused, {measurer.workers} tiles at once", per_worker))
    built = []
    for how, choices in ways:
        before, after = measurer.compare_split(mod, choices)
        overhead = overhead_and_noise(before, after, measurer.round_samples)[0]
        built.append((how, overhead, peak(split_program(program, choices)).bytes))
    return built


def holding_variants(
    program: Program, floor: Point, held: SplitChoice, measurer: ChainLatency
) -> list[tuple[str, float, int]]:
    """``(how, measured ms, simulated peak)`` of the floor plan's chain ``held`` in its parts, each way its tiles
    can run, the rest of the floor plan as it is: as the floor plan runs it; and where its tiles can be one
    kernel (a gathered chain's written where they end up instead), fused one tile at a time (each stage
    parallel within the tile: the floor's memory) and fused with a tile per worker (one tile's buffers per
    worker), each the faster of halos recomputed and kept in a line buffer. The floor lets every chain run
    one tile at a time: where only the per-worker kernel is within the budget, this says what that costs in
    memory."""
    rest = [c for c in floor.choices if c is not held]
    chain = replace(held.chain, gathered=False) if isinstance(held.chain, SpatialChain) else held.chain
    ways = [("as the floor plan runs it" + (", per kernel" if not held.fused else ", fused"), [held])]
    if chain.fusable:
        spatial = isinstance(chain, SpatialChain)
        for workers in sorted({1, measurer.workers} if spatial else {1}):
            tried = [SplitChoice(chain, held.parts, True, workers)]
            if spatial and chain.has_halo(held.parts, tried[0].concurrent_tiles):
                tried.append(SplitChoice(chain, held.parts, True, workers, rolling=True))
            at_once = "one tile at a time" if workers == 1 else f"{workers} tiles at once"
            ways.append((f"fused, {at_once}" if spatial else "fused", tried))
    found = []
    for how, tried in ways:
        timed = {choice: measurer.split_delta(choice) for choice in tried}
        fastest = min(timed, key=timed.get)
        label = how + (", line buffer" if fastest.rolling and len(tried) > 1 else "")
        found.append((label, timed[fastest], peak(split_program(program, [*rest, fastest])).bytes))
    return found


def bench(
    spec: str,
    budget: float,
    seconds: float,
    order_seconds: float,
    fused_tiles: str = "off",
    floor_seconds: float = 120.0,
    target: float | None = None,
    layout: str = "auto",
    floor_guided: bool = False,
) -> dict:
    model = load_model(spec)
    options = {"layout": layout, "order_seconds": order_seconds}
    with tempfile.TemporaryDirectory() as scratch:
        cache = Path(scratch) / "latency.jsonl"
        searches = []
        for _ in ("cold", "warm"):  # the second search reads the cache the first filled
            started = time.perf_counter()
            found = search_split(
                model,
                budget=budget,
                seconds=seconds,
                cache=cache,
                fused_tiles=fused_tiles,
                plan_options=options,
                floor_guided=floor_guided,
            )
            searches.append((found, time.perf_counter() - started))
        (outcome, cold), (again, warm) = searches
        floor = floor_report(model, outcome, cache, floor_seconds, target is not None, layout, fused_tiles != "off")
    coarse = plan_model(model, **options)
    split = plan_model(model, prepare=outcome.prepare(), **options)
    verified = verify_plan(split)
    in_place = layout_block(tvm.target.Target.from_device("cpu"), layout) is None
    with windows_in_place(in_place):
        split_model = outcome.prepare()(to_relax(model))
    threads = int(os.environ.get("TVM_NUM_THREADS", "1"))
    inputs = model.random_inputs(0)
    ort_ms, ort_spread = _spread(OnnxRuntime(spec, threads).time(inputs, 20))
    result = outcome.result
    beyond = [p for p in result.front if p.peak_bytes < result.best.peak_bytes]
    return {
        "model": spec,
        "target": target,
        **floor,
        "fused_tiles": fused_tiles,
        "layout": _layout_name(layout),
        "launches": (launches(split_model, layout, in_place), launches(to_relax(model), layout)),
        "coarse_arena": coarse.total("arena_bytes"),
        "split_arena": split.total("arena_bytes"),
        "before": _spread(outcome.samples_before_ms),
        "after": _spread(outcome.samples_after_ms),
        "fastest": outcome.overhead,
        "estimate": result.best.latency_ms / result.original.latency_ms - 1 if result.original.latency_ms else 0.0,
        "onnxruntime": (ort_ms, ort_spread),
        "chains": len(outcome.chains),
        "split": "; ".join(f"{c.chain.name} x{c.parts} {c.variant}" for c in outcome.choices) or "none",
        "search_s": (cold, warm),
        "warm_measurements": again.cache_misses,
        "correct": verified.ok,
        "problems": verified.problems,
        "beyond": min(beyond, key=lambda p: p.peak_bytes) if beyond else None,
        "original_ms": result.original.latency_ms,
        "bottleneck": "; ".join(outcome.bottleneck[:3]),
        "stopped": result.stopped,
    }


def _layout_name(layout: str) -> str:
    """The layout ``layout`` gives on this machine's CPU: ``NCHW`` or ``NCHW{x}c``."""
    block = layout_block(tvm.target.Target.from_device("cpu"), layout)
    return f"NCHW{block}c" if block else "NCHW"


def built(r: dict) -> str:
    """The floor plan built column: each way, the whole model's measured overhead and the simulated reduction."""
    coarse = r["floor"][0]
    return "; ".join(f"{how}: {overhead:+.1%}, {coarse / bytes_:.2f}x" for how, overhead, bytes_ in r["built"]) or "—"


def missed(r: dict, budget: float) -> str:
    """The target column: met, or the floor, the chain holding the kept plan above it and its measured cost."""
    reduction = r["coarse_arena"] / r["split_arena"]
    if r["target"] is None:
        return "—"
    if reduction >= r["target"]:
        return f"{r['target']:g}x: met"
    coarse, floor = r["floor"]
    text = f"{r['target']:g}x: missed; floor {coarse / floor:.2f}x" + (
        " (below the target)" if coarse < r["target"] * floor else ""
    )
    if r["held"] is None:
        return text + "; no floor chain at the kept plan's peak"
    name, parts, ways = r["held"]
    timed = "; ".join(
        f"{how}: {delta:+.3f} ms ({delta / r['original_ms'] if r['original_ms'] else 0.0:+.1%} of the model), "
        f"{coarse / bytes_:.2f}x"
        for how, delta, bytes_ in ways
    )
    return f"{text}; held by {name} x{parts} (budget {budget:.0%}): {timed}"


def markdown(rows: list[dict], budget: float, command: str) -> str:
    threads = os.environ.get("TVM_NUM_THREADS", "unset (1 thread)")
    lines = [
        f"## Fine-grained splitting: arena and latency ({datetime.date.today()})",
        "",
        f"Target `host` ({tvm.target.Target.from_device('cpu')}), {platform.machine()} with {os.cpu_count()} cores, "
        f"TVM_NUM_THREADS={threads}, latency budget {budget:.0%}. Arena = the planner's arena for the whole model "
        "(coarse: order search + in-place + concat elimination; split: the same on the split model). Latency: "
        "whole model, default CPU schedules, median (IQR) over 3 interleaved rounds (up to 9 where the split's "
        "overhead was within the samples' noise of the budget) x 25 single runs; overhead: of the medians / of the "
        "fastest runs, round by round, median of the rounds (what the search's confirmation judges). Search: seconds "
        "of a first search (empty latency cache) / a second one (cache filled by the first). Floor: the "
        "simulator's lowest peak with every chain free to split and latency ignored, against its coarse peak. "
        "Split: each chain kept, its parts, and whether its tiles run fused (one kernel) or per kernel. Target: "
        "the reduction asked of the model; where missed, the chain of the floor plan that holds the kept plan's "
        "peak, in the floor plan's parts, with its measured cost (chain timed alone, split minus whole) and the "
        "reduction the floor plan simulates with it, for each way its tiles can run: as the floor plan runs them, "
        "fused one tile at a time (stages parallel within a tile) and fused with a tile per worker (each worker "
        "holding a tile's buffers). Floor plan built: the whole floor plan against the unsplit model, side by "
        "side (3 rounds, read as the confirmation reads them), as the floor runs its tiles and with every chain "
        "that can be one kernel fused with a tile per worker, with the reduction the simulator gives each. "
        "Produced by `scripts/bench_split.py`.",
        "",
        "| model | layout | fused tiles | coarse arena KiB | split arena KiB | reduction | floor (simulated) "
        "| latency before ms | after ms | overhead median / fastest (search's estimate) "
        "| onnxruntime ms | chains found / split | launches unsplit / split "
        "| search s cold / warm | correct, VM = plan | smaller on the front | bottleneck now | target "
        "| floor plan built: overhead, reduction |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        before, after = r["before"], r["after"]
        beyond = r["beyond"]
        front = (
            f"{r['coarse_arena'] / beyond.peak_bytes:.2f}x at {beyond.latency_ms / r['original_ms'] - 1:+.1%}"
            if beyond
            else "—"
        )
        coarse, floor = r["floor"]
        lines.append(
            f"| {r['model']} | {r['layout']} | {r['fused_tiles']} | "
            f"{r['coarse_arena'] / 1024:.1f} | {r['split_arena'] / 1024:.1f} | "
            f"{r['coarse_arena'] / r['split_arena']:.2f}x | {coarse / floor:.2f}x ({floor / 1024:.0f} KiB) | "
            f"{before[0]:.3f} ({before[1]:.3f}) | {after[0]:.3f} ({after[1]:.3f}) | "
            f"{after[0] / before[0] - 1:+.1%} / {r['fastest']:+.1%} ({r['estimate']:+.1%}) | "
            f"{r['onnxruntime'][0]:.3f} | "
            f"{r['chains']} / {r['split']} | {r['launches'][1]} / {r['launches'][0]} | "
            f"{r['search_s'][0]:.0f} / {r['search_s'][1]:.0f} | "
            f"{'yes' if r['correct'] else 'NO: ' + '; '.join(r['problems'])} | {front} | {r['bottleneck']} | "
            f"{missed(r, budget)} | {built(r)} |"
        )
    lines.append("")
    lines.append(
        "Why each search stopped: "
        + "; ".join(f"{r['model']} ({r['fused_tiles']}): {r['stopped']}" for r in rows)
        + "."
    )
    lines += ["", f"Command: `{command}`"]
    return "\n".join(lines) + "\n"


def parse_target(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=REDUCTION (e.g. googlenet=3), got {text!r}")
    return name, float(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--latency-budget", type=float, default=0.05)
    parser.add_argument("--search-seconds", type=float, default=120.0)
    parser.add_argument("--order-seconds", type=float, default=10.0)
    parser.add_argument("--floor-seconds", type=float, default=120.0, help="time limit of the floor's search")
    parser.add_argument(
        "--target",
        type=parse_target,
        action="append",
        default=[],
        metavar="NAME=X",
        help="reduction target of a model (its file name without .torchscript.onnx); adds to the issue's",
    )
    parser.add_argument(
        "--fused-tiles", nargs="+", choices=["off", "on", "auto"], default=["off"], help="one row per setting"
    )
    parser.add_argument(
        "--layout",
        choices=["auto", "nchw", "blocked"],
        default="auto",
        help="activation layout of the search's timings, the coarse and the split plans (default auto)",
    )
    parser.add_argument("--floor-guided", action="store_true", help="the search times the floor plan's moves first")
    parser.add_argument("--out", type=Path, default=Path("results") / "bench_split.md")
    args = parser.parse_args(argv)
    targets = {**TARGETS, **dict(args.target)}
    rows = []
    for spec in args.models:
        print(f"== {spec}", flush=True)
        for fused_tiles in args.fused_tiles:
            rows.append(
                bench(
                    spec,
                    args.latency_budget,
                    args.search_seconds,
                    args.order_seconds,
                    fused_tiles,
                    args.floor_seconds,
                    targets.get(model_key(spec)),
                    args.layout,
                    args.floor_guided,
                )
            )
    threads = os.environ.get("TVM_NUM_THREADS")
    command = (f"TVM_NUM_THREADS={threads} " if threads else "") + shlex.join(
        ["python", "scripts/bench_split.py", *(sys.argv[1:] if argv is None else argv)]
    )
    text = markdown(rows, args.latency_budget, command)
    write_atomically(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
