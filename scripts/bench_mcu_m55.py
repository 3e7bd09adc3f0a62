"""Int8 instructions on the emulated Cortex-M55 with and without Helium (MVE), kernel family by family.

    python scripts/bench_mcu_m55.py --out results/bench_mcu_m55.md

Each model is quantized as ``scripts/bench_mcu.py`` quantizes its int8 rows and written once with
``build --emit-c --target cortex-m55``. The same C is then built twice and run under ``qemu -icount``
(``measure --per-kernel``): with the M55's own flags, where ``__ARM_FEATURE_MVE`` selects the Helium
1x1, dense and depthwise kernels (:mod:`tvm_memplan.deploy.mcu_mve`), and with ``-mcpu=cortex-m55+nomve`` (the
Makefile's ``CPU_FLAGS``), where the SMLAD kernels run. ``+nomve`` also stops GCC from vectorizing TVM's
own loops with MVE, so the rows of TVM's kernels (grouped convolutions, pooling) move too. The output
files of both runs are compared byte for byte.
Needs gcc-arm-none-eabi, libnewlib-arm-none-eabi, qemu-system-arm.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

from bench_mcu import quantized

from tvm_memplan.deploy.emit_c import emit_c
from tvm_memplan.deploy.standalone import measure_c

NO_MVE = "-mcpu=cortex-m55+nomve -mthumb -mfloat-abi=hard"
MODELS = ("zoo:mcu_cnn", "zoo:mobilenet_v2?width=0.35&resolution=144")


def families(result) -> dict[str, int]:
    """Instructions per kernel family (a kernel's name without TVM's number)."""
    found: dict[str, int] = defaultdict(int)
    for call in result.kernels:
        found[re.sub(r"\d+$", "", call["kernel"])] += call["instructions"]
    return found


def measure(directory: Path, cpu_flags: str | None):
    """``measure --per-kernel`` of the C in ``directory`` on the emulated M55, built with ``cpu_flags``
    (None: the Makefile's)."""
    saved = os.environ.pop("CPU_FLAGS", None)
    try:
        if cpu_flags:
            os.environ["CPU_FLAGS"] = cpu_flags
        return measure_c(directory, "qemu-cortex-m55", timeout=3600, per_kernel=True)
    finally:
        os.environ.pop("CPU_FLAGS", None)
        if saved is not None:
            os.environ["CPU_FLAGS"] = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help=f"model specs (default: {', '.join(MODELS)})")
    parser.add_argument("--out", type=Path, default=Path("results/bench_mcu_m55.md"))
    args = parser.parse_args()
    lines = [
        "# Int8 on the emulated Cortex-M55: Helium (MVE) against the SMLAD kernels\n\n",
        f"Written by `python scripts/bench_mcu_m55.py --out {args.out}`: the same `build --emit-c --target "
        "cortex-m55` C built with the M55's flags (MVE: the Helium 1x1, dense and depthwise kernels) and with "
        f"`CPU_FLAGS='{NO_MVE}'` (the SMLAD kernels), each run once under `qemu -icount` with "
        "`measure --per-kernel`. Instructions retired, in millions. `+nomve` also keeps GCC from "
        "vectorizing TVM's own loops with MVE, so the rows of TVM's kernels move as well.\n",
    ]
    with tempfile.TemporaryDirectory() as scratch:
        for spec in args.model or MODELS:
            helium = Path(scratch) / "helium"
            smlad = Path(scratch) / "smlad"
            shutil.rmtree(helium, ignore_errors=True)
            shutil.rmtree(smlad, ignore_errors=True)
            emit_c(quantized(spec, Path(scratch)), helium, "cortex-m55")
            shutil.copytree(helium, smlad)
            with_mve, without = measure(helium, None), measure(smlad, NO_MVE)
            outputs = sorted(helium.glob("output*.bin"))
            same = bool(outputs) and all(o.read_bytes() == (smlad / o.name).read_bytes() for o in outputs)
            a, b = families(with_mve), families(without)
            lines += [
                f"\n## {spec.removeprefix('zoo:')}\n\n",
                f"Whole run: {without.instructions / 1e6:,.2f} M without MVE, {with_mve.instructions / 1e6:,.2f} M "
                f"with it ({with_mve.instructions / without.instructions:.2f}x). Outputs of the two builds "
                f"{'identical byte for byte' if same else 'DIFFER'}; against onnxruntime: "
                f"{'agree' if with_mve.correct else 'DO NOT agree'} (max abs diff {with_mve.max_abs_diff:.1e}) "
                f"and {'agree' if without.correct else 'DO NOT agree'} ({without.max_abs_diff:.1e}).\n\n",
                "| kernels | SMLAD (M) | Helium (M) | ratio |\n|---|---:|---:|---:|\n",
            ]
            for name in sorted(b, key=lambda k: -b[k]):
                ratio = f"{a[name] / b[name]:.2f}" if b[name] else "-"
                lines.append(f"| {name} | {b[name] / 1e6:,.3f} | {a[name] / 1e6:,.3f} | {ratio} |\n")
            print("".join(lines[-(len(b) + 3) :]), flush=True)
    args.out.write_text("".join(lines))


if __name__ == "__main__":
    main()
