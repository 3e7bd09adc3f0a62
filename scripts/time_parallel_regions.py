"""What a fused tile kernel pays for running its stages parallel one tile at a time: launches against barriers.

    TVM_NUM_THREADS=2 python scripts/time_parallel_regions.py --rows 16,64,256 --out results/parallel_regions.md

A fused chain that runs one tile at a time (:attr:`~tvm_memplan.split.chain.SplitChoice.workers` = 1) runs
every stage of a tile as a parallel loop, and TVM's CPU code generator launches the thread pool once per
parallel loop: tiles x stages launches. TVM's ``pragma_parallel_launch_point`` opens one parallel region
instead, its parallel loops share the region's threads, and ``pragma_parallel_barrier_when_finish`` puts a
barrier after each stage. This times one kernel of ``--tiles`` x ``--stages`` stages (each a row-wise update of
``rows x --cols`` float32 reading the stage before it, rows shifted by one, so a stage depends on its
predecessor's other rows) written three ways: a parallel loop per stage (a launch each), one parallel region with
a barrier after each stage, and serial loops; all three must give the same tensor. Nothing of the package is
involved: the figures say what the thread pool costs on this machine and ``TVM_NUM_THREADS``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
from pathlib import Path

import numpy as np
import tvm
from tvm import tirx

from tvm_memplan.deploy.results import write_atomically

WAYS = ("a launch per stage", "one region, barriers", "serial")


def stages_kernel(way: str, tiles: int, stages: int, rows: int, cols: int) -> tirx.PrimFunc:
    """``tiles`` x ``stages`` row-wise updates of ``A[s + 1] = A[s] (rows shifted by one) * 0.5 + 1``, the rows
    of each stage a parallel loop (``a launch per stage``), the same inside one parallel region with a barrier
    after each stage (``one region, barriers``), or a serial loop."""
    buffer = tirx.decl_buffer((stages + 1, rows, cols), "float32", name="A")
    s, i, j = tirx.Var("s", "int32"), tirx.Var("i", "int32"), tirx.Var("j", "int32")
    value = buffer[s, tirx.floormod(i + 1, rows), j] * tirx.const(0.5, "float32") + tirx.const(1.0, "float32")
    body = tirx.For(j, 0, cols, tirx.ForKind.VECTORIZED, tirx.BufferStore(buffer, value, [s + 1, i, j]))
    body = tirx.For(i, 0, rows, tirx.ForKind.SERIAL if way == "serial" else tirx.ForKind.PARALLEL, body)
    if way == "one region, barriers":
        body = tirx.AttrStmt(tirx.const(0, "int32"), "pragma_parallel_barrier_when_finish", 1, body)
    body = tirx.For(s, 0, stages, tirx.ForKind.SERIAL, body)
    body = tirx.For(tirx.Var("tile", "int32"), 0, tiles, tirx.ForKind.SERIAL, body)
    if way == "one region, barriers":
        body = tirx.AttrStmt(tirx.const(0, "int32"), "pragma_parallel_launch_point", 1, body)
    return tirx.PrimFunc([buffer], body).with_attr({"global_symbol": "stages", "tir.noalias": True})


def time_ways(tiles: int, stages: int, rows: int, cols: int, number: int, repeat: int) -> dict[str, float]:
    """Median µs per call of each way (:data:`WAYS`); raises if a way's tensor differs from the serial one's."""
    dev = tvm.cpu()
    start = np.random.default_rng(0).standard_normal((stages + 1, rows, cols)).astype("float32")
    timed, results = {}, {}
    for way in WAYS:
        kernel = tvm.IRModule({"stages": stages_kernel(way, tiles, stages, rows, cols)})
        executable = tvm.compile(kernel, tvm.target.Target.from_device("cpu"))
        tensor = tvm.runtime.tensor(start, dev)
        executable["stages"](tensor)
        results[way] = tensor.numpy()
        evaluator = executable.mod.time_evaluator("stages", dev, number=number, repeat=repeat)
        timed[way] = float(np.median(evaluator(tensor).results)) * 1e6
    for way in WAYS[:-1]:
        if not np.array_equal(results[way], results["serial"]):
            raise AssertionError(f"{way}: the tensor differs from the serial kernel's")
    return timed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", type=int, default=16)
    parser.add_argument("--stages", type=int, default=12)
    parser.add_argument("--rows", default="16,64,256", help="rows of a stage, comma-separated (one table row each)")
    parser.add_argument("--cols", type=int, default=256, help="float32 per row")
    parser.add_argument("--number", type=int, default=200, help="calls per timing")
    parser.add_argument("--repeat", type=int, default=7, help="timings (their median is reported)")
    parser.add_argument("--out", type=Path, default=Path("results/parallel_regions.md"))
    args = parser.parse_args(argv)
    threads = os.environ.get("TVM_NUM_THREADS", "unset (1 thread)")
    regions = args.tiles * args.stages
    lines = [
        f"## Parallel stages one tile at a time: launches against barriers ({datetime.date.today()})",
        "",
        f"`scripts/time_parallel_regions.py`: {platform.machine()} with {os.cpu_count()} cores "
        f"(`{tvm.target.Target.from_device('cpu').attrs['mcpu']}`), TVM_NUM_THREADS={threads}; one kernel of "
        f"{args.tiles} tiles x {args.stages} stages ({regions} parallel loops), each stage `rows` x {args.cols} "
        f"float32; median of {args.repeat} timings of {args.number} calls. Per stage: (way - serial) / "
        f"{regions}, what each stage's parallelism costs or saves against running it serially.",
        "",
        "| rows | stage KiB | " + " | ".join(f"{way} µs" for way in WAYS) + " | launch per stage, per stage µs "
        "| barriers, per stage µs |",
        "|---:|---:|" + "---:|" * (len(WAYS) + 2),
    ]
    for rows in (int(r) for r in args.rows.split(",")):
        timed = time_ways(args.tiles, args.stages, rows, args.cols, args.number, args.repeat)
        serial = timed["serial"]
        per_stage = [(timed[way] - serial) / regions for way in WAYS[:-1]]
        lines.append(
            f"| {rows} | {rows * args.cols * 4 / 1024:.1f} | "
            + " | ".join(f"{timed[way]:.2f}" for way in WAYS)
            + " | "
            + " | ".join(f"{value:+.2f}" for value in per_stage)
            + " |"
        )
        print(lines[-1], flush=True)
    write_atomically(args.out, "\n".join(lines) + "\n")
    print(args.out)


if __name__ == "__main__":
    main()
