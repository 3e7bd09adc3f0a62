"""Compile time and run time of one chain's fused tiles: the chain alone, split into N fused tiles.

    TVM_NUM_THREADS=2 python scripts/time_fused_chain.py EXPORTS/mobilenet_v2_035.torchscript.onnx \\
        --chain "lv..lv41 (rows)" --parts 8,16,32 --label "tile loop" --out results/time_fused_chain.md

For each number of tiles and each way of handling halos (recomputed, or kept in a line buffer): the seconds
``tvm.compile`` takes for the chain compiled alone with its tiles fused into one kernel (the project's
pipeline in ``--layout``, as the split search compiles it: ``auto``, the default, is the blocked NCHW[x]c
layout where the CPU's vectors hold a channel block, ``nchw`` the plain one), whether its output equals the
unsplit chain's bit for bit, and the chain unsplit and split timed side by side in interleaved rounds
(fastest runs). ``--label`` names the code being measured, so that rows from two checkouts (run with each
on ``PYTHONPATH``) can stand in one table; ``--append`` adds rows to an existing table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from tvm_memplan.deploy.results import write_atomically
from tvm_memplan.deploy.targets import get_target
from tvm_memplan.errors import UserError
from tvm_memplan.frontend import load_model, to_relax
from tvm_memplan.relax.layout import layout_block
from tvm_memplan.relax.pipeline import pipeline
from tvm_memplan.relax.split import chain_module, find_chains, normalize, split_chains
from tvm_memplan.schedule.cpu import cpu_spec
from tvm_memplan.split.chain import SplitChoice

HEADER = (
    "| code | layout | tiles | halo rows | compile s | bit-identical | unsplit ms | split ms (added µs) |\n"
    "|---|---|---|---|---|---|---|---|\n"
)


def _build(mod: tvm.IRModule, target: tvm.target.Target, layout: str) -> tuple[relax.VirtualMachine, float]:
    started = time.perf_counter()
    with target:
        executable = tvm.compile(mod, target, relax_pipeline=pipeline(target, order="program", layout=layout))
    return relax.VirtualMachine(executable, tvm.cpu()), time.perf_counter() - started


def layout_name(target: tvm.target.Target, layout: str) -> str:
    """``NCHW`` or ``NCHW{x}c``: the layout ``layout`` gives on ``target``."""
    block = layout_block(target, layout)
    return f"NCHW{block}c" if block else "NCHW"


def rows(model: str, name: str, parts: list[int], rounds: int, label: str, layout: str = "auto") -> list[str]:
    mod = normalize(to_relax(load_model(model)))
    chains = {c.name: c for c in find_chains(mod)}
    if name not in chains:
        raise UserError(f"no chain {name!r} in {model} (scripts/profile_split.py --list prints them)")
    chain = chains[name]
    alone = chain_module(mod, chain)
    target = get_target("host").tvm_target()
    workers = cpu_spec(target).threads
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    inputs = [
        tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.ty.shape.values]).astype(str(p.ty.dtype)), dev)
        for p in alone["main"].params
    ]
    whole, _ = _build(alone, target, layout)
    expected = whole["main"](*inputs).numpy()
    whole_timer = whole.time_evaluator("main", dev, number=1, repeat=25)
    out = []
    for count in parts:
        for rolling in (False, True):
            choice = SplitChoice(chain, count, True, workers, rolling=rolling)
            if rolling and not chain.has_halo(count, choice.concurrent_tiles):
                continue
            # in a blocked layout row slices, which it carries into NCHW[x]c, as the split search does
            in_place = layout_block(target, layout) is None
            vm, seconds = _build(split_chains(alone, [choice], in_place), target, layout)
            same = np.array_equal(vm["main"](*inputs).numpy(), expected)
            timer = vm.time_evaluator("main", dev, number=1, repeat=25)
            before: list[float] = []
            after: list[float] = []
            for _ in range(rounds):
                before.extend(whole_timer(*inputs).results)
                after.extend(timer(*inputs).results)
            unsplit, split = min(before) * 1e3, min(after) * 1e3
            halo = "line buffer" if rolling else "recomputed"
            row = (
                f"| {label} | {layout_name(target, layout)} | {count} | {halo} | {seconds:.1f} | "
                f"{'yes' if same else 'NO'} | {unsplit:.3f} | "
                f"{split:.3f} ({(split - unsplit) * 1e3:+.0f}) |"
            )
            print(row, flush=True)
            out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--chain", required=True)
    parser.add_argument("--parts", default="8,16,32")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--label", default="this checkout")
    parser.add_argument(
        "--layout", choices=("auto", "nchw"), default="auto", help="activation layout (default auto: blocked)"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--append", action="store_true", help="add the rows to the table in --out")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p.strip()]
    if not parts or not all(p.strip().isdigit() and int(p) >= 2 for p in parts):
        print(f"error: --parts takes tile counts of at least 2, comma-separated (got {args.parts!r})", file=sys.stderr)
        return 2
    try:
        found = rows(args.model, args.chain, [int(p) for p in parts], args.rounds, args.label, args.layout)
    except (UserError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.out:
        kept = args.out.read_text() if args.append and args.out.exists() else HEADER
        write_atomically(args.out, kept + "".join(f"{row}\n" for row in found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
