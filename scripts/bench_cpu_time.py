#!/usr/bin/env python3
"""Built models against onnxruntime in process CPU time at one thread: a comparison that holds on a shared machine.

On a machine that other jobs load, wall-clock times swing by 2x from one repeat to the next, and a second
thread waits for a core. The CPU time of a process at one thread is the time its one thread ran: a thread
that is descheduled does not accrue it. Each artifact (an ``.so`` that ``tvm-memplan build`` wrote, for
example one per checkout, ``--artifact before=DIR/model.so --artifact after=...``) and onnxruntime
(``intra_op_num_threads=1``) run in interleaved rounds on the same random input; the table gives the fastest
run of each, its ratio to onnxruntime's, and the largest output difference from onnxruntime's relative to
the largest output magnitude.

    TVM_NUM_THREADS=1 python scripts/bench_cpu_time.py mnasnet1_0.onnx --artifact before=old/mnasnet.so \\
        --artifact after=new/mnasnet.so --rounds 5 --repeat 8 --out results/cpu_time.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from tvm_memplan.errors import UserError
from tvm_memplan.frontend import load_model
from tvm_memplan.verify.run import flatten_outputs


def _relative_error(outputs: list[np.ndarray], expected: list[np.ndarray]) -> float:
    scale = max(float(np.abs(e).max()) for e in expected) or 1.0
    return max(float(np.abs(o - e).max()) for o, e in zip(outputs, expected, strict=True)) / scale


def bench(model: str, artifacts: dict[str, Path], rounds: int, repeat: int) -> dict[str, dict]:
    """The fastest run (ms of process CPU time) and the error against onnxruntime of each artifact and of
    onnxruntime itself, timed in interleaved rounds."""
    import onnxruntime as ort

    loaded = load_model(model)
    inputs = loaded.random_inputs(0)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(loaded.onnx_model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    expected = session.run(None, inputs)
    runs, rows = {}, {}
    for name, path in artifacts.items():
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())
        args = [tvm.runtime.tensor(x) for x in inputs.values()]
        rows[name] = {"error": _relative_error(flatten_outputs(vm["main"](*args)), expected)}
        runs[name] = lambda vm=vm, args=args: vm["main"](*args)
    runs["onnxruntime"] = lambda: session.run(None, inputs)
    rows["onnxruntime"] = {"error": 0.0}
    best = dict.fromkeys(runs, float("inf"))
    for index in range(rounds):
        order = list(runs) if index % 2 == 0 else list(reversed(runs))
        for name in order:
            runs[name]()  # warm-up
            for _ in range(repeat):
                started = time.process_time()
                runs[name]()
                best[name] = min(best[name], time.process_time() - started)
    for name, row in rows.items():
        row["ms"] = best[name] * 1e3
    return rows


def markdown(results: dict[str, dict[str, dict]], rounds: int, repeat: int, command: str) -> str:
    names = [n for n in next(iter(results.values())) if n != "onnxruntime"]
    lines = [
        f"`{command}`",
        "",
        f"## Process CPU time at one thread against onnxruntime ({datetime.date.today()})",
        "",
        f"Fastest of {rounds} interleaved rounds x {repeat} runs; TVM_NUM_THREADS=1, onnxruntime one intra-op thread; "
        f"load average {os.getloadavg()[0]:.1f} at the end. Produced by `scripts/bench_cpu_time.py`.",
        "",
        "| model | onnxruntime ms | " + " | ".join(f"{n} ms | {n} / onnxruntime" for n in names) + " | largest error |",
        "|---|---:|" + "---:|---:|" * len(names) + "---:|",
    ]
    for model, rows in results.items():
        ort_ms = rows["onnxruntime"]["ms"]
        cells = [f"{rows[n]['ms']:.3f} | {rows[n]['ms'] / ort_ms:.3f}x" for n in names]
        error = max(rows[n]["error"] for n in names)
        lines.append(f"| {Path(model).name} | {ort_ms:.3f} | " + " | ".join(cells) + f" | {error:.1e} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="the ONNX file (or zoo:NAME) the artifacts were built from")
    parser.add_argument("--artifact", action="append", required=True, metavar="NAME=PATH", help="a built .so")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--out", type=Path, help="append the Markdown table here (printed otherwise)")
    args = parser.parse_args()
    if os.environ.get("TVM_NUM_THREADS") != "1":
        print(
            "error: set TVM_NUM_THREADS=1 (process CPU time is one thread's time only at one thread)", file=sys.stderr
        )
        return 2
    artifacts = {}
    for item in args.artifact:
        name, _, path = item.partition("=")
        if not path or not Path(path).is_file():
            print(f"error: --artifact {item}: expected NAME=PATH of an existing .so", file=sys.stderr)
            return 2
        artifacts[name] = Path(path)
    try:
        rows = bench(args.model, artifacts, args.rounds, args.repeat)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    command = "TVM_NUM_THREADS=1 python " + shlex.join(["scripts/bench_cpu_time.py", *sys.argv[1:]])
    text = markdown({args.model: rows}, args.rounds, args.repeat, command)
    if args.out:
        with open(args.out, "a") as handle:
            handle.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
