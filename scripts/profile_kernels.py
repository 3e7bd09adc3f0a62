"""Where a network's time goes, kernel by kernel, on this machine's CPU.

Each PrimFunc of the model, scheduled as tvm_memplan builds it, is compiled alone, run on random
tensors of its parameter shapes (best of 5 x 20 runs), and weighted by how often ``main`` calls it.
The sum is the kernels' time without the VM's own overhead. ``--int8`` quantizes a float model first
(onnxruntime's static quantizer on random calibration data, as ``scripts/bench_int8.py`` does).

    TVM_NUM_THREADS=1 python scripts/profile_kernels.py exports/mobilenet_v2_035.torchscript.onnx --int8 \\
        --out results/profile_int8_mobilenet_v2_035.md
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
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


def profile(model, repeat: int = 5, number: int = 20, layout: str = "nchw", target=None) -> list[dict]:
    """One row per kernel: name, calls, microseconds over all its calls, parameter shapes, kind; for ``target``
    (a ``tvm.target.Target`` this machine runs; this CPU by default)."""
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
        arguments = [tvm.runtime.tensor(_random_argument(p, rng), dev) for p in func.params]
        seconds = library.time_evaluator("main", dev, number=number, repeat=repeat)(*arguments).min
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


def _integer_path(script: str) -> str:
    """Which integer vector kernel a PrimFunc is, by its reduction block (see ``tvm_memplan.quant.kernels``)."""
    if "dot_acc" in script:
        return "dot product"
    return "int32 vectors" if "dw_acc" in script else "no"


def family(kernel: str) -> str:
    """A kernel's name without the numbering TVM adds (``qconv2d12`` → ``qconv2d``)."""
    return re.sub(r"_?\d+$", "", kernel)


def table(name: str, rows: list[dict], threads: str, top: int) -> str:
    total = sum(row["us"] for row in rows)
    families: dict[str, list[float]] = {}
    for row in rows:
        entry = families.setdefault(family(row["kernel"]), [0.0, 0])
        entry[0] += row["us"]
        entry[1] += row["calls"]
    lines = [
        f"## Kernel time of {name} (TVM_NUM_THREADS={threads})\n",
        f"Sum over the kernels: {total:,.0f} us (each kernel timed alone, best of 5 x 20 runs, times its calls).\n",
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
    parser.add_argument("--top", type=int, default=12, help="kernels listed one by one")
    parser.add_argument("--out", type=Path, help="write the table here (default: print it)")
    args = parser.parse_args()
    import onnx

    from tvm_memplan.deploy.results import write_atomically
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
    text = table(name, profile(model, layout=args.layout, target=target), threads, args.top)
    if args.out:
        write_atomically(args.out, text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
