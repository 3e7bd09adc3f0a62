"""Where a network's time goes, kernel by kernel, on this machine's CPU.

Each PrimFunc of the model, scheduled as tvm_memplan builds it, is compiled alone, run on random
tensors of its parameter shapes (best of 5 x 20 runs), and weighted by how often ``main`` calls it.
The sum is the kernels' time without the VM's own overhead. ``--int8`` quantizes a float model first
(onnxruntime's static quantizer on random calibration data, as ``scripts/bench_int8.py`` does).

    TVM_NUM_THREADS=1 python scripts/profile_kernels.py exports/mobilenet_v2_035.torchscript.onnx --int8 \\
        --out results/profile_int8_mobilenet_v2_035.md

On a loaded machine ``--cpu-time`` times each kernel in process CPU time instead (best of 5 runs of at least
20 ms; holds at one thread, as ``bench_cpu_time.py``), and ``--rotate-mib N`` runs it on copies of its
arguments that together exceed N MiB, so that they come from a cache level that size spills (8 on a core with
1 MiB of L2: from L3, as a network's weights do between inferences) rather than staying warm in L1/L2.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np


def _called(func) -> Counter:
    """How often ``func``'s bindings call each GlobalVar (directly or through call_tir)."""
    import tvm
    from tvm import relax

    calls: Counter = Counter()
    for block in func.body.blocks:
        for binding in block.bindings:
            if isinstance(binding.value, relax.Call):
                for item in [binding.value.op, *binding.value.args]:
                    if isinstance(item, tvm.ir.GlobalVar):
                        calls[item.name_hint] += 1
    return calls


def _random_argument(buffer, rng: np.random.Generator) -> np.ndarray:
    shape, dtype = [int(d) for d in buffer.shape], str(buffer.dtype)
    if "int" in dtype:
        return rng.integers(-100, 100, size=shape).astype(dtype)
    return rng.random(shape).astype(dtype)


def profile(
    model,
    repeat: int = 5,
    number: int = 20,
    layout: str = "nchw",
    target=None,
    cpu_time: bool = False,
    rotate_mib: float = 0.0,
) -> list[dict]:
    """One row per kernel: name, calls, microseconds over all its calls, parameter shapes, kind; for ``target``
    (a ``tvm.target.Target`` this machine runs; this CPU by default). ``cpu_time`` and ``rotate_mib`` as the
    module docstring says."""
    import tvm
    from tvm import tirx

    from tvm_memplan.planner import plan_model
    from tvm_memplan.relax.pipeline import schedule_passes

    plan = plan_model(model, target, order="program", time_budget=1, layout=layout)
    with plan.target:
        module = tvm.transform.Sequential(schedule_passes(plan.target, plan.options))(plan.stock_staged)
    calls = _called(module["main"])
    dev, rng, rows = tvm.cpu(), np.random.default_rng(0), []
    for gvar, func in module.functions.items():
        if not isinstance(func, tirx.PrimFunc) or gvar.name_hint not in calls:
            continue
        library = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=plan.target)
        nbytes = sum(math.prod(int(d) for d in p.shape) * p.dtype.bits // 8 for p in func.params)
        copies = max(1, math.ceil(rotate_mib * 2**20 / max(nbytes, 1))) if rotate_mib else 1
        argument_sets = [
            [tvm.runtime.tensor(_random_argument(p, rng), dev) for p in func.params] for _ in range(copies)
        ]
        if cpu_time or copies > 1:
            seconds = _best_call(
                library["main"], argument_sets, repeat, time.process_time if cpu_time else time.perf_counter
            )
        else:
            seconds = library.time_evaluator("main", dev, number=number, repeat=repeat)(*argument_sets[0]).min
        script = func.script()
        rows.append(
            {
                "kernel": gvar.name_hint,
                "calls": calls[gvar.name_hint],
                "us": seconds * 1e6 * calls[gvar.name_hint],
                "shapes": [tuple(int(d) for d in p.shape) for p in func.params],
                "integer_path": _integer_path(script),
            }
        )
    return sorted(rows, key=lambda row: -row["us"])


def _best_call(kernel, argument_sets: list, repeat: int, clock, least: float = 0.02) -> float:
    """Seconds of one call by ``clock`` (``time.process_time``: CPU time): the best of ``repeat`` runs of at least
    ``least`` seconds, each call on the next of ``argument_sets`` (which ``time_evaluator`` cannot rotate)."""
    kernel(*argument_sets[0])
    best = math.inf
    for _ in range(repeat):
        calls, started = 0, clock()
        while (elapsed := clock() - started) < least or calls < 3:
            kernel(*argument_sets[calls % len(argument_sets)])
            calls += 1
        best = min(best, elapsed / calls)
    return best


def _integer_path(script: str) -> str:
    """Which integer vector kernel a PrimFunc is, by its reduction block (see ``tvm_memplan.quant.kernels``)."""
    if "dot_acc" in script:
        return "dot product"
    return "int32 vectors" if "dw_acc" in script else "no"


def family(kernel: str) -> str:
    """A kernel's name without the numbering TVM adds (``qconv2d12`` → ``qconv2d``)."""
    return re.sub(r"_?\d+$", "", kernel)


def table(name: str, rows: list[dict], threads: str, top: int, timing: str = "wall clock, best of 5 x 20 runs") -> str:
    total = sum(row["us"] for row in rows)
    families: dict[str, list[float]] = {}
    for row in rows:
        entry = families.setdefault(family(row["kernel"]), [0.0, 0])
        entry[0] += row["us"]
        entry[1] += row["calls"]
    lines = [
        f"## Kernel time of {name} (TVM_NUM_THREADS={threads})\n",
        f"Sum over the kernels: {total:,.0f} us (each kernel timed alone, {timing}, times its calls).\n",
        "| kernels | calls | us | share |",
        "|---|---:|---:|---:|",
    ]
    for kernel, (us, count) in sorted(families.items(), key=lambda item: -item[1][0]):
        lines.append(f"| {kernel} | {count} | {us:,.0f} | {100 * us / total:.1f} % |")
    lines += [
        "",
        f"The {top} slowest kernels:",
        "",
        "| kernel | calls | us | integer vectors | shapes |",
        "|---|---:|---:|:---:|---|",
    ]
    for row in rows[:top]:
        shapes = ", ".join("x".join(map(str, s)) for s in row["shapes"])
        lines.append(f"| {row['kernel']} | {row['calls']} | {row['us']:,.0f} | {row['integer_path']} | {shapes} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a zoo spec or an ONNX file")
    parser.add_argument("--int8", action="store_true", help="quantize the (float) model to int8 QDQ first")
    parser.add_argument(
        "--layout", choices=("nchw", "blocked"), default="nchw", help="activation layout (as tvm_memplan.pipeline)"
    )
    parser.add_argument(
        "--target",
        help='a TVM target this machine runs (default: this CPU), e.g. \'{"kind": "llvm", "mcpu": "znver2"}\'',
    )
    parser.add_argument("--cpu-time", action="store_true", help="process CPU time (a loaded machine, one thread)")
    parser.add_argument(
        "--rotate-mib", type=float, default=0.0, help="rotate copies of each kernel's arguments over this many MiB"
    )
    parser.add_argument("--top", type=int, default=12, help="kernels listed one by one")
    parser.add_argument("--out", type=Path, help="write the table here (default: print it)")
    args = parser.parse_args()
    import onnx

    from tvm_memplan.deploy.results import write_or_print
    from tvm_memplan.deploy.targets import get_target
    from tvm_memplan.frontend import LoadedModel, load_model
    from tvm_memplan.quant.calibrate import quantize_int8

    model = load_model(args.model)
    if args.int8:
        rng = np.random.default_rng(0)
        calib = {n: rng.standard_normal((4, *s[1:])).astype(d) for n, s, d in model.input_specs()}
        with tempfile.TemporaryDirectory(prefix="profile-kernels-") as tmp:
            source, quantized = Path(tmp) / "float.onnx", Path(tmp) / "int8.onnx"
            onnx.save(model.onnx_model, str(source))
            quantize_int8(source, quantized, calib)
            model = LoadedModel(model.name + ".int8", onnx.load(str(quantized)))
    threads = os.environ.get("TVM_NUM_THREADS", "unset")
    target = get_target(args.target).tvm_target() if args.target else None
    name = f"{model.name} ({args.layout}{', ' + str(target.attrs.get('mcpu', '')) if target else ''})"
    rows = profile(model, layout=args.layout, target=target, cpu_time=args.cpu_time, rotate_mib=args.rotate_mib)
    timed = args.cpu_time or args.rotate_mib
    timing = ("process CPU time" if args.cpu_time else "wall clock") + (
        f", arguments rotated over {args.rotate_mib:g} MiB" if args.rotate_mib else ""
    )
    timing += ", best of 5 runs of 20 ms or more" if timed else ", best of 5 x 20 runs"
    text = table(name, rows, threads, args.top, timing)
    write_or_print(args.out, text)


if __name__ == "__main__":
    main()
