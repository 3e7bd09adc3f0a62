#!/usr/bin/env python3
"""Compile time of ``tvm_memplan.pipeline`` against an earlier checkout of the package, side by side.

Per model, ``tvm.compile(to_relax(model), target, relax_pipeline=tvm_memplan.pipeline(target))`` is timed
in a fresh Python process for this checkout and for ``--baseline-src`` (a checkout of an earlier commit,
imported through PYTHONPATH), alternating between the two so that load on a shared machine hits both
alike. Imports (the package's passes and schedule rules) and ONNX loading are outside the timed span.
The table reports the median per side and their ratio, the figure a "compile time stays within 2x" bar
is judged by.

    git worktree add --detach ../baseline 2ecc009^
    python scripts/bench_compile_time.py resnet50.onnx squeezenet1_0.onnx --baseline-src ../baseline \
        --out results/bench_compile_time.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def _worker(model: str, target: str) -> None:
    """Run in the child process: print the seconds of one ``tvm.compile`` (``target`` a Target's JSON)."""
    import time

    import tvm

    import tvm_memplan
    from tvm_memplan.frontend import load_model, to_relax

    tvm_target = tvm.target.Target(json.loads(target))
    mod = to_relax(load_model(model))
    tvm_memplan.pipeline(tvm_target)  # imports the passes and schedule rules: a once-per-process cost, not timed
    started = time.perf_counter()
    with tvm_target:
        tvm.compile(mod, tvm_target, relax_pipeline=tvm_memplan.pipeline(tvm_target))
    print(json.dumps({"seconds": time.perf_counter() - started, "package": tvm_memplan.__file__}))


def compile_seconds(source: Path, model: str, target: str, timeout: float) -> float:
    """Seconds one compile of ``model`` takes with the package in ``source``, in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    with tempfile.TemporaryDirectory() as cwd:  # so that no checkout is imported from the working directory
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--worker", model, "--target", target],
            capture_output=True,
            text=True,
            env=env,
            cwd=cwd,
            timeout=timeout,
        )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"error: compiling {model} with the package in {source} failed: {tail}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(result["package"]).resolve().is_relative_to(source.resolve()):
        raise SystemExit(f"error: the child imported {result['package']}, not the package in {source}")
    return float(result["seconds"])


def _git_revision(source: Path) -> str:
    done = subprocess.run(["git", "-C", str(source), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*")
    parser.add_argument("--baseline-src", type=Path, help="a checkout of an earlier commit (its repository root)")
    parser.add_argument("--target", default="host", help="as `tvm-memplan build --target` takes it")
    parser.add_argument("--repeat", type=int, default=2, help="compiles per side and model (default 2)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one compile may take")
    parser.add_argument("--out", type=Path, default=Path("results/compile_time.md"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.target)
        return
    if not args.models or args.baseline_src is None:
        parser.error("give one or more models and --baseline-src")
    if not (args.baseline_src / "tvm_memplan" / "__init__.py").is_file():
        raise SystemExit(f"error: {args.baseline_src} is not a checkout of tvm_memplan (no tvm_memplan/__init__.py)")
    for model in args.models:
        if not model.startswith("zoo:") and not Path(model).is_file():
            raise SystemExit(f"error: no such model file: {model}")
    models = [model if model.startswith("zoo:") else str(Path(model).resolve()) for model in args.models]
    from tvm_memplan.deploy.targets import get_target

    target = str(get_target(args.target, None).tvm_target())  # a JSON object, as the children parse it
    sides = {"baseline": args.baseline_src, "current": HERE}
    rows = []
    for model in models:
        seconds: dict[str, list[float]] = {name: [] for name in sides}
        for attempt in range(args.repeat):
            order = list(sides) if attempt % 2 == 0 else list(reversed(sides))
            for name in order:
                seconds[name].append(compile_seconds(sides[name], model, target, args.timeout))
        base, now = (statistics.median(seconds[name]) for name in sides)
        rows.append((Path(model).name, base, now, now / base))
        print(f"{Path(model).name}: baseline {base:.1f} s, current {now:.1f} s, {now / base:.2f}x", flush=True)
    ratios = [ratio for *_, ratio in rows]
    lines = [
        f"## Compile time: this checkout ({_git_revision(HERE)}) against {_git_revision(args.baseline_src)} "
        f"({datetime.date.today().isoformat()})",
        "",
        f"Target `{target}`; `tvm.compile` with `tvm_memplan.pipeline(target)` (each checkout's defaults) from "
        f"the imported module (imports not timed), in a fresh process per compile, the two checkouts alternating; "
        f"median of "
        f"{args.repeat} per side. Produced by `scripts/bench_compile_time.py`.",
        "",
        "| model | baseline s | current s | current / baseline |",
        "|---|---:|---:|---:|",
        *(f"| {name} | {base:.1f} | {now:.1f} | {ratio:.2f}x |" for name, base, now, ratio in rows),
        "",
        f"Median ratio {statistics.median(ratios):.2f}x; largest {max(ratios):.2f}x.",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_suffix(args.out.suffix + ".partial")
    partial.write_text("\n".join(lines))
    partial.replace(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
