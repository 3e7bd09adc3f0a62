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
    max_lsb_diff_vs_onnxruntime: int | None = None
    """Int8 (QDQ) models: the largest output difference from onnxruntime's default run, in output LSB."""
    tolerance_lsb: int | None = None
    """Int8 (QDQ) models: the LSB allowed (onnxruntime's optimized/unoptimized spread, at least 2)."""

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


def _int8_comparison(
    plan: ModelPlan, inputs: dict[str, np.ndarray], outputs: list[np.ndarray], reference: list[np.ndarray]
) -> tuple[int, int] | None:
    """For a QDQ model whose outputs are all dequantized per tensor: (largest difference from
    onnxruntime in output LSB, the LSB allowed); None for any other model."""
    from ..quant.reference import is_quantized, lsb_difference, tolerances

    if not is_quantized(plan.model.onnx_model):
        return None
    allowed = tolerances(plan.model.onnx_model, inputs, reference)
    if not allowed or any(t is None for t in allowed):
        return None
    diff = max(lsb_difference(a, r, t.scale) for a, r, t in zip(outputs, reference, allowed, strict=True))
    return diff, min(t.lsb for t in allowed)  # several outputs: the strictest tolerance


def verify_plan(
    plan: ModelPlan,
    seed: int = 0,
    rtol: float = 1e-3,
    atol: float = 1e-4,
    stock: bool = True,
    inputs: dict[str, np.ndarray] | None = None,
) -> VerifyResult:
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
            a.shape == b.shape and np.array_equal(a, b) for a, b in zip(outputs, stock_outputs, strict=True)
        )
        diff_stock = max(
            (float(np.max(np.abs(a - b))) for a, b in zip(outputs, stock_outputs, strict=False) if a.size), default=0.0
        )
        if not identical:
            problems.append(f"outputs differ from TVM's stock pipeline (max |diff| {diff_stock:.3g})")

    diff_ort = None
    lsb_diff, lsb_tolerance = None, None
    reference = _onnxruntime_outputs(plan, inputs)
    if reference is not None and len(reference) != len(outputs):
        problems.append(f"{len(outputs)} outputs, onnxruntime's run gives {len(reference)}")
        reference = None
    if reference is not None:
        diff_ort = max(
            (float(np.max(np.abs(a - r))) for a, r in zip(outputs, reference, strict=True) if a.size), default=0.0
        )
        lsb = _int8_comparison(plan, inputs, outputs, reference)
        if lsb is not None:
            lsb_diff, lsb_tolerance = lsb
            if lsb_diff > lsb_tolerance:
                problems.append(
                    f"outputs differ from onnxruntime by {lsb_diff} LSB, more than its own spread "
                    f"(optimized vs unoptimized, at least 2): {lsb_tolerance} LSB"
                )
        elif not all(np.allclose(a, r, rtol=rtol, atol=atol) for a, r in zip(outputs, reference, strict=True)):
            problems.append(
                f"outputs differ from onnxruntime beyond rtol={rtol}, atol={atol} (max |diff| {diff_ort:.3g})"
            )

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
        max_lsb_diff_vs_onnxruntime=lsb_diff,
        tolerance_lsb=lsb_tolerance,
    )
    if not result.trace_matches_plan:
        problems.append(f"VM requested {sorted(trace.storage_bytes)} bytes, plan expects {sorted(expected)}")
    return result
