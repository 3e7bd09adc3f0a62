"""Every zoo model on both software GPUs (PoCL, lavapipe): the memplan build for ``opencl`` and for
``vulkan`` runs on the device with outputs matching onnxruntime, and the VM's storage requests are
the plan (arena plus outputs) with no tensor copied out of the arena.

Kept within CI's time: the memplan pipeline only (stock is the same kernels; ``scripts/check_gpu_zoo.py``
compares both), small inputs, program order, one run. Per kernel, the time goes to building it
(glslangValidator on Vulkan) and to the device compiling it at its first launch (LLVM inside PoCL and
lavapipe), so the cost follows a model's kernel count, not its input size. The slowest models come
first, so that the suite's parallel workers (``pytest -n 2``) start them early.
"""

from __future__ import annotations

import pytest

from tvm_memplan.frontend import load_model
from tvm_memplan.planner import plan_model
from tvm_memplan.verify import verify_plan

from .conftest import device_ready

MODELS = [
    "zoo:densenet121?resolution=29",
    "zoo:nasnet_a_mobile?resolution=16",
    "zoo:googlenet?resolution=31",
    "zoo:mlp",
    "zoo:mobilenet_v2?width=0.35&resolution=32",
    "zoo:squeezenet1_0?resolution=29",
    "zoo:resnext50_32x4d?resolution=16",
    "zoo:xception?resolution=16",
    "zoo:inception_v3?resolution=75",
    "zoo:bert_tiny?resolution=16",
]
"""DenseNet-121, GoogLeNet, SqueezeNet and Inception-v3 at the smallest input they build at (smaller
inputs would not save much: the kernels cost the time). mcu_cnn runs on both devices in
tests/cli/test_plan.py (plan --verify, stock included)."""
CI_OPTIONS = {"order": "program", "time_budget": 1.0}
"""No order search (up to 10 s per function) and a short allocator search: what runs is still the plan."""


@pytest.mark.parametrize(
    "spec, kind",
    [
        pytest.param(spec, kind, id=f"{kind}-{spec.removeprefix('zoo:')}")
        for spec in MODELS
        for kind in ("opencl", "vulkan")
    ],
)
def test_the_memplan_build_runs_on_the_device_correctly_and_as_planned(spec, kind):
    if not device_ready(kind):
        pytest.skip(f"no {kind} device: run tvm-memplan setup-gpu")
    plan = plan_model(load_model(spec), {"kind": kind, "host": "llvm"}, **CI_OPTIONS)
    result = verify_plan(plan, stock=False)
    assert result.device == f"{kind}:0"
    assert result.ok, result.problems  # onnxruntime's outputs, and the VM's requests = arenas + outputs
    assert result.max_abs_diff_vs_onnxruntime is not None and result.trace_matches_plan
    assert result.zero_offset_calls == 0
