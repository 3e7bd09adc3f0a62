#!/usr/bin/env python
"""Write the LQ benchmark tables as Markdown: the seed's accuracy/size/latency table on the digits MLP,
the kernel rows side by side with the scheduled fp32 TVM dense and numpy, and (``--seeds N``) the
accuracy change per bit width over N training seeds, so one lucky split is not the whole story.

    TVM_NUM_THREADS=2 python scripts/bench_lq.py -o bench_lq.md [--seeds 4] [--rounds 3] [--isa avx2]

``--isa avx2`` times the AVX2 kernels on an AVX-512 CPU and makes numpy's OpenBLAS use its AVX2
(Haswell) kernels too (OPENBLAS_CORETYPE, set before numpy loads).

Timings repeat ``--rounds`` times, interleaved; each number is the minimum over rounds of the
per-round medians (other processes on a shared machine only ever make a run slower).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))


def _early_isa(argv: list[str]) -> str:
    """``--isa`` read before numpy loads: OpenBLAS picks its kernels once, at import."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--isa", default="native")
    return parser.parse_known_args(argv)[0].isa


if _early_isa(sys.argv[1:]) == "avx2":
    os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")

from tvm_memplan.lq import accuracy, bench  # noqa: E402
from tvm_memplan.lq.digits import load_digits_28  # noqa: E402
from tvm_memplan.lq.machine import ISAS, best_limits, isa_target  # noqa: E402
from tvm_memplan.lq.timing import Timing  # noqa: E402

TIMED = ("latency_us", "lq_us", "fp32_tvm_us", "fp32_numpy_us", "lq_dense_us", "lq_pack_us")


def best_of(runs: list[list[dict]]) -> list[dict]:
    """Row-wise minimum of the timed fields over rounds (everything else from the first round)."""
    out = []
    for rows in zip(*runs, strict=True):
        merged = dict(rows[0])
        for key in TIMED:
            if key in merged:
                merged[key] = min(row[key] for row in rows)
        if "fp32_tvm_us" in merged:
            merged["speedup_vs_fp32_tvm"] = merged["fp32_tvm_us"] / merged["lq_us"]
        out.append(merged)
    return out


def seed_table(seeds: int, epochs: int, cache_dir: Path | None) -> str:
    """Accuracy change (points vs fp32) per setting, per training seed, plain and fine-tuned calibration."""
    split = load_digits_28()
    settings = [s for s in bench.SETTINGS if s != (32, 32)]
    lines = [
        "| seed | calibration | fp32 | " + " | ".join(f"W{w}A{a}" for w, a in settings) + " |",
        "|---:|---|---:|" + "---:|" * len(settings),
    ]
    worst: dict[bool, dict[tuple[int, int], float]] = {False: {}, True: {}}
    quick = Timing(number=1, repeat=1, min_repeat_ms=1)
    for seed in range(seeds):
        mlp = bench.trained_mlp(split, seed, epochs, 512, cache_dir)
        for finetune in (False, True):
            rows = bench.accuracy_rows(split, mlp, [(32, 32), *settings], finetune=finetune, timing=quick)
            base = rows[0]["accuracy"]
            cells = []
            for setting, row in zip(settings, rows[1:], strict=True):
                delta = 100 * (row["accuracy"] - base)
                worst[finetune][setting] = min(delta, worst[finetune].get(setting, delta))
                cells.append(f"{delta:+.2f}")
            mode = "fine-tuned" if finetune else "plain"
            lines.append(f"| {seed} | {mode} | {100 * base:.2f} % | " + " | ".join(cells) + " |")
    for finetune in (False, True):
        mode = "fine-tuned" if finetune else "plain"
        lines.append(f"| worst | {mode} | | " + " | ".join(f"{worst[finetune][s]:+.2f}" for s in settings) + " |")
    return "\n".join(lines)


def networks_section(cache_dir: Path | None) -> str:
    """The default ``quantize`` command on MLPs trained by scikit-learn on its bundled data sets."""
    rows = []
    for network in accuracy.NETWORKS:
        print(f"  {network.label}", file=sys.stderr)
        rows.append(accuracy.evaluate(network, cache_dir=cache_dir))
    return "\n".join(
        [
            "## Default `tvm-memplan quantize` on networks it was not developed on",
            "",
            "scikit-learn MLPClassifier (seed 0, Adam, 200 iterations at most) on a stratified 70/30 split, "
            "exported to ONNX as Gemm + Relu/Tanh; `tvm-memplan quantize MODEL --calib CALIB --wbits W --abits A` "
            f"with nothing else, calibrated on the first {accuracy.CALIB_ROWS} training rows; accuracy of the "
            "compiled library on the held-out rows, float accuracy by onnxruntime. Binary classifiers have one "
            "logit (class 1 when positive). Cells: accuracy (change in points, parameter bytes / float bytes).",
            "",
            accuracy.markdown(rows),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=Path("bench_lq.md"))
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (default 3)")
    parser.add_argument("--seeds", type=int, default=0, help="also tabulate accuracy over this many training seeds")
    parser.add_argument("--finetune", action="store_true", help="main table with fine-tuned calibration")
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--no-kernels", action="store_true")
    parser.add_argument("--no-accuracy", action="store_true")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "tvm_memplan")
    parser.add_argument("--isa", choices=ISAS, default="native", help="native kernels, or AVX2 ones on an AVX-512 CPU")
    parser.add_argument(
        "--networks",
        action="store_true",
        help="also the default quantize command on unseen scikit-learn networks (a few minutes)",
    )
    args = parser.parse_args(argv)

    start = time.time()
    runs = [
        bench.run(
            accuracy=not args.no_accuracy,
            kernel=not args.no_kernels,
            epochs=args.epochs,
            finetune=args.finetune,
            cache_dir=args.cache_dir,
            target=isa_target(args.isa),
        )
        for _ in range(max(1, args.rounds))
    ]
    result = {"rows": best_of([r["rows"] for r in runs]), "kernels": best_of([r["kernels"] for r in runs])}
    if "machine" in runs[0]:
        result["machine"] = best_limits(*(r["machine"] for r in runs))
        bench.add_bounds(result["kernels"], result["machine"])
    parts = ["# LQ dense benchmark", ""]
    if result["rows"] or result["kernels"]:
        parts += [
            f"Calibration: {'fine-tuned' if args.finetune else 'plain'} (the seed's table: every layer at the "
            f"setting). {len(runs)} interleaved rounds, minimum of per-round medians; TVM_NUM_THREADS="
            f"{os.environ['TVM_NUM_THREADS']}. fp32 TVM = hand-scheduled register-blocked dense "
            "(tvm_memplan.lq.kernels.schedule_fp32_dense); numpy = OpenBLAS through numpy.",
            "",
            bench.markdown(result),
        ]
    if args.seeds:
        title = "## Accuracy change over training seeds (points vs fp32, compiled TVM models, 540 test digits)"
        parts += ["", title, "", seed_table(args.seeds, args.epochs, args.cache_dir)]
    if args.networks:
        parts += ["", networks_section(args.cache_dir)]
    parts += ["", f"_{time.time() - start:.0f} s_", ""]
    args.output.write_text("\n".join(parts))
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
