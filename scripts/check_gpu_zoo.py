"""Which zoo models run correctly on this machine's software GPU devices, at small sizes, as a Markdown table.

    tvm-memplan setup-gpu --tvm-src TVM_V0.27_SOURCE      # or $TVM_MEMPLAN_TVM_SRC
    python scripts/check_gpu_zoo.py --target opencl --out results/gpu_zoo_small.md
    python scripts/check_gpu_zoo.py --target vulkan --out results/gpu_zoo_small_vulkan.md  # lavapipe
    python scripts/check_gpu_zoo.py --memplan-only --target vulkan --models ... --out results/gpu_zoo_ci_vulkan.md

Each row is ``measure MODEL --target T --compare``: both pipelines are built with the default GPU
schedules, run on the local device (PoCL for opencl), checked against onnxruntime, and the VM's
storage requests are traced. Sizes are small so that the software device finishes in seconds; the
latencies are a CPU emulating a GPU and say nothing about a phone.

``--memplan-only`` does what ``tests/backends/test_gpu_zoo.py`` does in CI (the memplan build only, program
order, ``plan --verify``'s checks on the device) and reports how long each model took from ONNX to checked
outputs: what the test costs per model.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from pathlib import Path

from tvm_memplan.deploy import error_line
from tvm_memplan.deploy.measure import measure
from tvm_memplan.errors import UserError
from tvm_memplan.frontend import load_model
from tvm_memplan.planner import plan_model
from tvm_memplan.verify import verify_plan

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
    return (
        f"| {spec.removeprefix('zoo:')} | {'yes' if stock.correct else 'NO'} / {'yes' if memplan.correct else 'NO'} "
        f"| {max(stock.max_abs_diff, memplan.max_abs_diff):.1e} | {stock.requested_bytes / 1024:,.1f} "
        f"| {memplan.requested_bytes / 1024:,.1f} | {equal} | {memplan.zero_offset_calls} | {stock.latency_ms:,.1f} / "
        f"{memplan.latency_ms:,.1f} "
        f"| {seconds:,.0f} |"
    )


CI_OPTIONS = {"order": "program", "time_budget": 1.0}
"""As in tests/backends/test_gpu_zoo.py."""


def memplan_row(spec: str, target: str) -> str:
    start = time.perf_counter()
    try:
        plan = plan_model(load_model(spec), {"kind": target, "host": "llvm"}, **CI_OPTIONS)
        result = verify_plan(plan, stock=False)
    except (UserError, RuntimeError, AssertionError) as exc:
        return f"| {spec.removeprefix('zoo:')} | failed: {error_line(exc)[:160]} | | | | |"
    seconds = time.perf_counter() - start
    return (
        f"| {spec.removeprefix('zoo:')} | {'yes' if result.ok else 'NO: ' + '; '.join(result.problems)[:120]} "
        f"| {result.max_abs_diff_vs_onnxruntime:.1e} | {'yes' if result.trace_matches_plan else 'NO'} "
        f"| {result.zero_offset_calls} | {seconds:,.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="opencl")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--memplan-only", action="store_true", help="what the CI test does, with its time per model")
    args = parser.parse_args()
    if args.memplan_only:
        lines = [
            f"# Zoo models on the local {args.target} device, the CI test's way (`scripts/check_gpu_zoo.py "
            "--memplan-only`)",
            "",
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores shared with "
            "other jobs "
            f"(load average {', '.join(f'{x:.1f}' for x in os.getloadavg())} at the start). Each row: import, plan "
            "(program order), "
            "build the memplan pipeline, run once on the device, compare with onnxruntime and the VM's storage "
            "requests with the "
            "plan, as `tests/backends/test_gpu_zoo.py` does. `wall s` is all of it. PoCL and lavapipe compile each "
            "kernel "
            "at its first launch and cache it on disk: MESA_SHADER_CACHE_DIR="
            f"{os.environ.get('MESA_SHADER_CACHE_DIR', '(default)')}, "
            f"POCL_CACHE_DIR={os.environ.get('POCL_CACHE_DIR', '(default)')} "
            "(an empty directory is what a fresh CI machine has).",
            "",
            "| model | correct, requests = plan | max abs diff | = plan | `ensure_zero_offset` | wall s |",
            "|---|---|---|---|---|---|",
        ]
        make_row = memplan_row
    else:
        lines = [
            f"# Zoo models on the local {args.target} device at small sizes (`scripts/check_gpu_zoo.py`)",
            "",
            "The default GPU schedules (tvm_memplan's rule for convolutions and pools, then dlight), stock and "
            "memplan pipelines, checked against onnxruntime. "
            "Requested = what the VM's `alloc_storage` calls asked for in one run (outputs included); "
            "`= plan` says memplan's requests equal its plan. Latency is a software device on a shared "
            "2-core CPU (median of 3): it says nothing about a GPU. In-place/concat aliasing is on; kernels read "
            "tensors "
            "at their arena offsets (an `elem_offset` parameter); `ensure_zero_offset` counts memplan's calls in one "
            "run "
            "(each one at a nonzero offset would copy a tensor out of the arena).",
            "",
            "| model | correct stock / memplan | max abs diff | stock requested KiB | memplan requested KiB | = plan "
            "| `ensure_zero_offset` | latency ms stock / memplan | wall s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        make_row = row
    for spec in args.models:
        lines.append(make_row(spec, args.target))
        print(lines[-1], flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
