"""Where a split's time goes: chains timed alone and in the whole model, unsplit and in tiles, side by side.

    TVM_NUM_THREADS=2 python scripts/profile_split.py "zoo:mobilenet_v2?width=0.35&resolution=144" \\
        --chains "lv..lv41 (rows)" "lv21..lv39" --parts 2,4,8,16 --out results/profile_split.md

For each chain and number of parts: the simulated peak of the model with that chain split (nothing
else), the chain's kernel launches after TVM's fusion, the iterations of its reduction blocks
(multiply-adds of convolutions and matmuls, window reads of pools; row tiles recompute their halos),
the chain compiled alone and timed whole and split, and the whole model timed unsplit and split; where the
chain can run as one kernel per chain (``SplitChoice.fused``), its launches and both times with the tiles
fused too. Each set of variants is timed in the same interleaved rounds with the default CPU schedules.
``--list`` prints the model's chains instead.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, s_tir

from tvm_memplan.deploy.chain_latency import ChainLatency
from tvm_memplan.deploy.measure import Device
from tvm_memplan.deploy.results import write_atomically
from tvm_memplan.deploy.targets import get_target
from tvm_memplan.frontend import load_model, to_relax
from tvm_memplan.relax.pipeline import stage_passes
from tvm_memplan.relax.split import chain_module, find_chains, normalize, program_of, split_chains
from tvm_memplan.split.simulate import SplitChoice, peak, split_program

_KERNEL_CALLS = (tvm.ir.Op.get("relax.call_tir"), tvm.ir.Op.get("relax.call_tir_inplace"))
_REDUCE = 2  # IterVar.CommReduce


def reduction_steps(mod: tvm.IRModule) -> int:
    """Iterations of every reduction block of ``main``'s kernels after legalization: the
    multiply-adds of convolutions and matmuls, the window reads of pools (however a kernel was
    emitted: split tiles read their rows through TE kernels of their own)."""
    legalized = relax.transform.LegalizeOps()(mod)
    total = 0
    for block in legalized["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and any(value.op.same_as(op) for op in _KERNEL_CALLS):
                total += _kernel_reduction_steps(legalized[value.args[0]])
    return total


def _kernel_reduction_steps(func: tvm.tirx.PrimFunc) -> int:
    steps = []

    def visit(node) -> None:
        if isinstance(node, s_tir.SBlock) and any(int(iv.iter_type) == _REDUCE for iv in node.iter_vars):
            steps.append(int(np.prod([int(iv.dom.extent) for iv in node.iter_vars])))

    tvm_ffi.structural_walk(func, visit, order="pre")
    return sum(steps)


def launches(mod: tvm.IRModule, target: tvm.target.Target) -> int:
    """Kernel calls of ``main`` after TVM's legalization and fusion."""
    with target:
        fused = tvm.transform.Sequential(stage_passes(target, layout="nchw").dataflow)(mod)
    return sum(
        1
        for block in fused["main"].body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call) and any(b.value.op.same_as(op) for op in _KERNEL_CALLS)
    )


STATISTICS = {"median": np.median, "min": np.min}
"""How the samples of one variant become its time: the median, or the minimum (on a machine other
processes share, what the variant costs when nothing interferes)."""


def profile(spec: str, names: list[str], parts: list[int], rounds: int, statistic: str = "median") -> list[dict]:
    model = load_model(spec)
    mod = normalize(to_relax(model))
    chains = {c.name: c for c in find_chains(mod)}
    missing = [n for n in names if n not in chains]
    if missing:
        raise SystemExit(f"{spec}: no chain {missing[0]!r} (--list shows them)")
    deploy_target = get_target("host")
    target = deploy_target.tvm_target()
    measurer = ChainLatency(mod, deploy_target, Device(), cache=None)
    program = program_of(mod)
    rows = []
    for name in names:
        chain = chains[name]
        alone = chain_module(mod, chain)
        row = {
            "chain": name,
            "kind": chain.kind,
            "unsplit": {
                "peak": peak(program).bytes,
                "launches": launches(alone, target),
                "macs": reduction_steps(alone),
            },
        }
        for count in parts:
            choice = [SplitChoice(chain, count)]
            split_alone = split_chains(alone, choice)
            modules = [(alone, split_alone), (mod, split_chains(mod, choice))]
            if chain.fusable:  # the tiles as one kernel (one tile at a time, and on the workers), same rounds
                fused = [SplitChoice(chain, count, fused=True)]
                on_workers = [SplitChoice(chain, count, fused=True, workers=measurer.workers)]
                variants = [fused, on_workers]
                if chain.spatial and chain.has_halo(count, on_workers[0].concurrent_tiles):
                    # halo rows kept in a line buffer (each worker's tiles in order) instead of recomputed
                    variants.append([SplitChoice(chain, count, fused=True, workers=measurer.workers, rolling=True)])
                modules = [(*pair, *(split_chains(pair[0], v) for v in variants)) for pair in modules]
            summarize = STATISTICS[statistic]
            chain_ms, model_ms = (
                [float(summarize(s)) for s in measurer.compare(*variants, rounds=rounds)] for variants in modules
            )
            row[count] = {
                "peak": peak(split_program(program, choice)).bytes,
                "workers_peak": peak(split_program(program, on_workers)).bytes if chain.fusable else None,
                "rolling_peak": peak(split_program(program, variants[2])).bytes
                if chain.fusable and len(variants) > 2
                else None,
                "launches": launches(split_alone, target),
                "macs": reduction_steps(split_alone),
                "chain_ms": chain_ms,
                "model_ms": model_ms,
                "fused_launches": launches(modules[0][2], target) if chain.fusable else None,
            }
            print(f"{name} x{count}: {row[count]}", flush=True)
        rows.append(row)
    return rows


def markdown(spec: str, rows: list[dict], parts: list[int], rounds: int, statistic: str = "median") -> str:
    threads = os.environ.get("TVM_NUM_THREADS", "unset")
    lines = [
        f"## Where a split's time goes: {Path(spec).name if Path(spec).is_file() else spec} ({datetime.date.today()})",
        "",
        f"Target `host`, {platform.machine()} with {os.cpu_count()} cores, TVM_NUM_THREADS={threads}. One chain split "
        "at a time (nothing else split). Peak: the simulator's, whole model. Launches: the chain's kernels after TVM's "
        "fusion. Reduction steps: iterations of its kernels' reduction blocks (the multiply-adds of convolutions and "
        f"matmuls, the window reads of pools; halos recomputed). Times: {statistic}s over "
        f"{rounds} interleaved rounds x 25 single runs, the chain compiled alone and the whole model, each unsplit, "
        "split into per-kernel tiles and (fused columns) split with the chain's tiles run as one kernel, side by "
        "side in the same rounds; fused: one tile after another, each stage's loops parallel as scheduled (the "
        "merged kernel before issue 25); on workers: one loop nest whose outer loop runs the independent tiles "
        "of a spatial chain on the target's threads (stages serial inside a tile, each worker with its own scratch; "
        "its peak in brackets); line buffer: the same loop nest, each worker's tiles in order, every stage keeping "
        "the rows its next tile reads again instead of recomputing them (its peak in brackets). "
        "Produced by `scripts/profile_split.py`.",
        "",
        "| chain | parts | peak KiB | launches | reduction steps (M) | chain alone ms: unsplit / split (added µs) "
        "| whole model ms: unsplit / split (overhead) | fused: launches | fused: chain alone ms (added µs) "
        "| fused: whole model ms (overhead) | on workers: chain alone ms (added µs) [peak KiB] "
        "| on workers: whole model ms (overhead) | line buffer: chain alone ms (added µs) [peak KiB] "
        "| line buffer: whole model ms (overhead) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        base = row["unsplit"]
        lines.append(
            f"| {row['chain']} ({row['kind']}) | 1 | {base['peak'] / 1024:.1f} | {base['launches']} | "
            f"{base['macs'] / 1e6:.2f} | | | | | | | | | |"
        )
        for count in parts:
            r = row[count]
            (cb, ca, *cf), (mb, ma, *mf) = r["chain_ms"], r["model_ms"]
            fused = (
                f"{r['fused_launches']} | {cf[0]:.3f} ({(cf[0] - cb) * 1e3:+.0f}) | {mf[0]:.3f} ({mf[0] / mb - 1:+.1%})"
                f" | {cf[1]:.3f} ({(cf[1] - cb) * 1e3:+.0f}) [{r['workers_peak'] / 1024:.1f}] | {mf[1]:.3f} "
                f"({mf[1] / mb - 1:+.1%})"
                if cf
                else "not fusable | | | | "
            )
            rolling = (
                f"{cf[2]:.3f} ({(cf[2] - cb) * 1e3:+.0f}) [{r['rolling_peak'] / 1024:.1f}] | {mf[2]:.3f} "
                f"({mf[2] / mb - 1:+.1%})"
                if len(cf) > 2
                else "no halo | "
            )
            lines.append(
                f"| | {count} | {r['peak'] / 1024:.1f} | {r['launches']} | {r['macs'] / 1e6:.2f} "
                f"({r['macs'] / base['macs'] - 1:+.0%}) | {cb:.3f} / {ca:.3f} ({(ca - cb) * 1e3:+.0f}) | "
                f"{mb:.3f} / {ma:.3f} ({ma / mb - 1:+.1%}) | {fused} | {rolling} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--chains", nargs="*", default=[])
    parser.add_argument("--parts", default="2,4,8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--statistic", choices=list(STATISTICS), default="median", help="of each variant's samples (default median)"
    )
    parser.add_argument("--list", action="store_true", help="print the model's chains and exit")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.list:
        mod = normalize(to_relax(load_model(args.model)))
        for chain in find_chains(mod):
            print(f"{chain.name:40s} {chain.kind:9s} units {chain.units}")
        return 0
    parts = [int(p) for p in args.parts.split(",")]
    rows = profile(args.model, args.chains, parts, args.rounds, args.statistic)
    text = markdown(args.model, rows, parts, args.rounds, args.statistic)
    if args.out:
        write_atomically(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
