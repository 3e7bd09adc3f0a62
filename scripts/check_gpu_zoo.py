"""Which zoo models run correctly on this machine's software GPU devices, at small sizes, as a Markdown table.

    tvm-memplan setup-gpu
    python scripts/check_gpu_zoo.py --target opencl --out results/gpu_zoo_small.md
    python scripts/check_gpu_zoo.py --target vulkan --out results/gpu_zoo_small_vulkan.md  # lavapipe

Each row is ``measure MODEL --target T --compare``: both pipelines are built with the default GPU
schedules, run on the local device (PoCL for opencl), checked against onnxruntime, and the VM's
storage requests are traced. Sizes are small so that the software device finishes in seconds; the
latencies are a CPU emulating a GPU and say nothing about a phone.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tvm_memplan.deploy import error_line
from tvm_memplan.deploy.measure import measure
from tvm_memplan.errors import UserError

MODELS = [
    "zoo:mcu_cnn",
    "zoo:mlp",
    "zoo:mobilenet_v2?width=0.35&resolution=32",
    "zoo:squeezenet1_0?resolution=64",
    "zoo:googlenet?resolution=32",
    "zoo:densenet121?resolution=32",
    "zoo:resnext50_32x4d?resolution=32",
    "zoo:nasnet_a_mobile?resolution=32",
    "zoo:inception_v3?resolution=75",
    "zoo:xception?resolution=71",
    "zoo:bert_tiny?resolution=16",
]


def row(spec: str, target: str) -> str:
    start = time.perf_counter()
    try:
        results = measure(spec, target, compare=True, repeat=3, min_repeat_ms=1)
    except (UserError, RuntimeError, AssertionError) as exc:  # AssertionError: a dlight rule
        return f"| {spec.removeprefix('zoo:')} | failed: {error_line(exc)[:160]} | | | | | | | |"
    seconds = time.perf_counter() - start
    stock, memplan = results["stock"], results["memplan"]
    equal = "yes" if memplan.requested_bytes == memplan.planned_bytes else "NO"
    return (f"| {spec.removeprefix('zoo:')} | {'yes' if stock.correct else 'NO'} / {'yes' if memplan.correct else 'NO'} "
            f"| {max(stock.max_abs_diff, memplan.max_abs_diff):.1e} | {stock.requested_bytes / 1024:,.1f} "
            f"| {memplan.requested_bytes / 1024:,.1f} | {equal} | {memplan.zero_offset_calls} | {stock.latency_ms:,.1f} / {memplan.latency_ms:,.1f} "
            f"| {seconds:,.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="opencl")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--models", nargs="*", default=MODELS)
    args = parser.parse_args()
    lines = [
        f"# Zoo models on the local {args.target} device at small sizes (`scripts/check_gpu_zoo.py`)",
        "",
        "The default GPU schedules (tvm_memplan's rule for convolutions and pools, then dlight), stock and memplan pipelines, checked against onnxruntime. "
        "Requested = what the VM's `alloc_storage` calls asked for in one run (outputs included); "
        "`= plan` says memplan's requests equal its plan. Latency is a software device on a shared "
        "2-core CPU (median of 3): it says nothing about a GPU. In-place/concat aliasing is on; kernels read tensors "
        "at their arena offsets (an `elem_offset` parameter); `ensure_zero_offset` counts memplan's calls in one run "
        "(each one at a nonzero offset would copy a tensor out of the arena).",
        "",
        "| model | correct stock / memplan | max abs diff | stock requested KiB | memplan requested KiB | = plan | `ensure_zero_offset` | latency ms stock / memplan | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for spec in args.models:
        lines.append(row(spec, args.target))
        print(lines[-1], flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
