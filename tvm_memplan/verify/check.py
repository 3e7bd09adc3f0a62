"""Prove a plan by running it: same outputs as stock TVM, close to onnxruntime, VM trace = plan."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..planner import ModelPlan
from ..planning import validate_offsets
from .run import run_vm, target_device


@dataclass
class VerifyResult:
    """Outcome of running a planned model beside its references."""

    identical_to_stock: bool | None
    max_abs_diff_vs_stock: float | None
    max_abs_diff_vs_onnxruntime: float | None
    trace_bytes: list[int]
    expected_trace_bytes: list[int]
    offsets_valid: bool
    zero_offset_calls: int
    """``ensure_zero_offset`` calls in the run (on OpenCL and Vulkan each one at a nonzero offset copies a tensor)."""
    device: str
    """Where both programs ran (``cpu:0``, ``opencl:0``, ``vulkan:0``)."""
    problems: list[str] = field(default_factory=list)

    @property
    def trace_matches_plan(self) -> bool:
        return Counter(self.trace_bytes) == Counter(self.expected_trace_bytes)

    @property
    def ok(self) -> bool:
        return not self.problems


def _onnxruntime_outputs(plan: ModelPlan, inputs: dict[str, np.ndarray]) -> list[np.ndarray] | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    session = ort.InferenceSession(plan.model.onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def verify_plan(plan: ModelPlan, seed: int = 0, rtol: float = 1e-3, atol: float = 1e-4, stock: bool = True,
                inputs: dict[str, np.ndarray] | None = None) -> VerifyResult:
    """Build the planned and stock programs, run both on the same inputs (``inputs``, else random ones
    from ``seed``), and compare.

    Both run on the plan's target device (``opencl(0)``, ``vulkan(0)``, the CPU for llvm and c).
    ``stock=False`` builds and runs only the planned program (half the compile time on a software GPU;
    it is then not compared with stock, and ``identical_to_stock`` is None).
    The VM's storage requests must be exactly the planned arenas plus the function outputs
    (which no planner places) — anything else means the plan is not what runs.
    """
    device = target_device(plan.target)
    problems: list[str] = []
    offsets_valid = True
    for report in plan.reports:
        for problem, offsets, arena_bytes in report.layouts():
            try:
                validate_offsets(problem, offsets, arena_bytes)
            except AssertionError as exc:
                offsets_valid = False
                problems.append(f"{report.function}: {exc}")

    inputs = plan.model.random_inputs(seed) if inputs is None else inputs
    outputs, trace = run_vm(plan.build(), inputs, device)
    identical, diff_stock = None, None
    if stock:
        stock_outputs, _ = run_vm(plan.build_stock(), inputs, device)
        identical = len(outputs) == len(stock_outputs) and all(
            a.shape == b.shape and np.array_equal(a, b) for a, b in zip(outputs, stock_outputs)
        )
        diff_stock = max((float(np.max(np.abs(a - b))) for a, b in zip(outputs, stock_outputs) if a.size), default=0.0)
        if not identical:
            problems.append(f"outputs differ from TVM's stock pipeline (max |diff| {diff_stock:.3g})")

    diff_ort = None
    reference = _onnxruntime_outputs(plan, inputs)
    if reference is not None:
        diff_ort = max((float(np.max(np.abs(a - r))) for a, r in zip(outputs, reference) if a.size), default=0.0)
        if not all(np.allclose(a, r, rtol=rtol, atol=atol) for a, r in zip(outputs, reference)):
            problems.append(f"outputs differ from onnxruntime beyond rtol={rtol}, atol={atol} (max |diff| {diff_ort:.3g})")

    main = plan.main
    expected = [arena["arena_bytes"] for arena in main.arenas] + [int(o.nbytes) for o in outputs]
    result = VerifyResult(
        identical_to_stock=identical,
        max_abs_diff_vs_stock=diff_stock,
        max_abs_diff_vs_onnxruntime=diff_ort,
        trace_bytes=trace.storage_bytes,
        expected_trace_bytes=expected,
        offsets_valid=offsets_valid,
        zero_offset_calls=trace.zero_offset_calls,
        device=str(device),
        problems=problems,
    )
    if not result.trace_matches_plan:
        problems.append(f"VM requested {sorted(trace.storage_bytes)} bytes, plan expects {sorted(expected)}")
    return result
