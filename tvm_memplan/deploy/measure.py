"""Measure artifacts on a device: latency, the storage the VM really requested, and correctness.

The same code path serves this machine and remote devices: locally it uses an in-process
``rpc.LocalSession``, remotely a session from an RPC tracker. Each pipeline's result is appended
to a :class:`~tvm_memplan.deploy.results.ResultsLog` as soon as it exists, so losing the device
later in the run loses nothing already measured; the failure itself is logged too.

Requested bytes come from the device-side function in :mod:`tvm_memplan.deploy.remote` (see its
docstring for why a local callback cannot be used over RPC).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..errors import UserError
from ..frontend import LoadedModel, load_model
from ..verify.run import flatten_outputs
from . import error_line
from .build import PIPELINES, Manifest, build_artifacts
from .remote import TRACE_FUNCTION, register_trace_function
from .results import ResultsLog
from .rpc import connect
from .targets import get_target

Progress = Callable[[str, str, int, int], None]
"""``progress(pipeline, step, done, total)``: called as each step of a pipeline's measurement ends."""

RTOL = 1e-3
ATOL = 1e-4
"""Tolerances against the reference; ``ATOL`` scales with the largest reference magnitude."""


@dataclass
class Measurement:
    """One pipeline of one model measured on one device."""

    model: str
    target: str
    pipeline: str
    device: str
    latency_ms: float
    latency_spread_ms: float
    """Interquartile range of the repeats: robust to the odd slow repeat on a shared machine."""
    repeats_ms: list[float]
    requested_bytes: int | None
    """Sum of the VM's ``alloc_storage`` requests in one call; None when the server cannot trace."""
    requested_storage: list[int] | None
    planned_bytes: int
    correct: bool
    max_abs_diff: float
    reference: str
    tvm_num_threads: str | None
    """The device's TVM_NUM_THREADS (None: unset, one thread, or a server that cannot say)."""
    source: str
    """What was measured: the model spec or the artifact the user named."""
    zero_offset_calls: int | None = None
    """``ensure_zero_offset`` calls in one call (None when the server cannot trace): on OpenCL and
    Vulkan each one at a nonzero offset copies a tensor out of the plan."""
    launches: int | None = None
    """Kernel launches in one call, traced on the device (None when the server cannot trace)."""
    time: str = field(
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    )

    def summary(self) -> dict[str, Any]:
        """The keys ``measure --json`` promises, first, then the rest."""
        record = asdict(self)
        keys = ["latency_ms", "latency_spread_ms", "requested_bytes", "planned_bytes", "correct"]
        return {k: record[k] for k in keys} | {k: v for k, v in record.items() if k not in keys}


def reference_outputs(model: LoadedModel, inputs: dict[str, np.ndarray]) -> tuple[list[np.ndarray], str]:
    """Outputs from onnxruntime (independent of TVM), or from stock TVM on this CPU without it."""
    try:
        import onnxruntime as ort
    except ImportError:
        from ..planner import plan_model
        from ..verify.run import run_vm

        outputs, _ = run_vm(plan_model(model, "host").build_stock(), inputs)
        return outputs, "tvm-stock-host"
    session = ort.InferenceSession(model.onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs), "onnxruntime"


def int8_allowed(
    model: LoadedModel, inputs: dict[str, np.ndarray], reference: tuple[list[np.ndarray], str]
) -> list | None:
    """For a QDQ model checked against onnxruntime: per output, its :class:`..quant.reference.Tolerance`
    (onnxruntime's own optimized vs unoptimized spread, measured on ``inputs``); None otherwise."""
    from ..quant.reference import is_quantized, tolerances

    if reference[1] != "onnxruntime" or not is_quantized(model.onnx_model):
        return None
    allowed = tolerances(model.onnx_model, inputs, reference[0])
    return None if any(t is None for t in allowed) else allowed


def int8_tolerances(
    model: LoadedModel, inputs: dict[str, np.ndarray], reference: tuple[list[np.ndarray], str]
) -> list[float] | None:
    """For a QDQ model checked against onnxruntime: per output, onnxruntime's own optimized vs
    unoptimized spread in LSB (at least 2) as an absolute tolerance; None otherwise."""
    allowed = int8_allowed(model, inputs, reference)
    return None if allowed is None else [t.atol for t in allowed]


def compare_outputs(
    outputs: list[np.ndarray], reference: list[np.ndarray], atols: list[float] | None = None
) -> tuple[bool, float]:
    """``atols``: per output, an absolute tolerance instead of RTOL/ATOL (an int8 model's LSB tolerance)."""
    if len(outputs) != len(reference):
        return False, float("inf")
    correct, worst = True, 0.0
    for index, (out, ref) in enumerate(zip(outputs, reference, strict=True)):
        if out.shape != ref.shape:
            return False, float("inf")
        if not out.size:
            continue
        worst = max(worst, float(np.max(np.abs(out - ref))))
        if atols is not None:
            correct &= bool(np.all(np.abs(out.astype(np.float64) - ref) <= atols[index]))
            continue
        atol = ATOL * max(1.0, float(np.max(np.abs(ref))))
        correct &= bool(np.allclose(out, ref, rtol=RTOL, atol=atol))
    return correct, worst


class Device:
    """Where artifacts run: this machine (``LocalSession``) or a device from an RPC tracker."""

    def __init__(self, tracker: str | None = None, key: str | None = None) -> None:
        if bool(tracker) != bool(key):
            raise UserError("--rpc-tracker and --rpc-key go together")
        if tracker:
            self.session = connect(tracker, key)
            self.name = f"rpc:{key}@{tracker}"
        else:
            register_trace_function()
            logging.getLogger("RPCServer").setLevel(logging.WARNING)  # it logs every upload at INFO
            self.session = tvm.rpc.LocalSession()
            self.name = "local"

    def trace_function(self):
        try:
            return self.session.get_function(TRACE_FUNCTION)
        except AttributeError:  # a stock TVM server (e.g. the Android RPC app)
            return None


def measure_artifact(
    device: Device,
    artifact: Path,
    inputs: dict[str, np.ndarray],
    reference: tuple[list[np.ndarray], str],
    repeat: int = 10,
    min_repeat_ms: int = 50,
    progress: Progress | None = None,
    source: str | None = None,
    atols: list[float] | None = None,
) -> Measurement:
    """Upload, run once and check, trace the storage requests, then time ``repeat`` times.
    ``atols``: per-output absolute tolerances (int8 models: onnxruntime's own LSB spread)."""
    manifest = Manifest.load(artifact)
    target = get_target(manifest.target, manifest.cross_compiler)
    step = progress or (lambda *_: None)
    total = repeat + 3
    session = device.session
    remote_name = f"{manifest.pipeline}-{uuid.uuid4().hex[:8]}.so"
    session.upload(str(artifact), remote_name)
    dev = session.device(target.device, 0)
    module = session.load_module(remote_name)
    step(manifest.pipeline, "uploaded", 1, total)

    vm = relax.VirtualMachine(module, dev)
    args = [tvm.runtime.tensor(array, dev) for array in inputs.values()]
    outputs = flatten_outputs(vm["main"](*args), session)
    correct, max_abs_diff = compare_outputs(outputs, reference[0], atols)
    step(manifest.pipeline, "checked", 2, total)

    trace = device.trace_function()
    traced = json.loads(trace(module, dev, *args)) if trace is not None else {}
    storage = traced.get("storage")
    step(manifest.pipeline, "traced", 3, total)

    timer = vm.time_evaluator("main", dev, number=1, repeat=1, min_repeat_ms=min_repeat_ms)
    repeats_ms = []
    for index in range(repeat):
        repeats_ms.append(float(timer(*args).mean) * 1e3)
        step(manifest.pipeline, "timed", 4 + index, total)
    q25, median, q75 = np.percentile(repeats_ms, [25, 50, 75])
    return Measurement(
        model=manifest.model,
        target=manifest.target,
        pipeline=manifest.pipeline,
        device=device.name,
        latency_ms=round(float(median), 4),
        latency_spread_ms=round(float(q75 - q25), 4),
        repeats_ms=[round(ms, 4) for ms in repeats_ms],
        requested_bytes=sum(storage) if storage is not None else None,
        requested_storage=storage,
        planned_bytes=manifest.planned_bytes,
        correct=correct,
        max_abs_diff=max_abs_diff,
        reference=reference[1],
        tvm_num_threads=traced.get("tvm_num_threads"),
        zero_offset_calls=traced.get("zero_offset_calls"),
        launches=traced.get("launches"),
        source=source or str(artifact),
    )


def measure(
    source: str,
    target: str = "host",
    compare: bool = False,
    repeat: int = 10,
    tracker: str | None = None,
    key: str | None = None,
    log: ResultsLog | None = None,
    tuning_dir: str | None = None,
    progress: Progress | None = None,
    min_repeat_ms: int = 50,
    cross_compiler: str | None = None,
    inputs: dict[str, np.ndarray] | None = None,
    **options: Any,
) -> dict[str, Measurement]:
    """Measure a model (built here for ``target``) or a built ``.so``; with ``compare``, stock and memplan.
    The model runs on ``inputs`` (the user's data), else on random ones.

    Stock goes first so that a device lost during memplan leaves the baseline in the log.
    """
    if repeat < 1:
        raise UserError(f"--repeat must be >= 1, got {repeat}")
    given = _given_artifact(source)
    deploy_target = get_target(*((given.target, given.cross_compiler) if given else (target, cross_compiler)))
    if not tracker:  # before any build: a model can take minutes to compile
        problem = deploy_target.runtime_problem()
        if problem:
            raise UserError(problem)
        # TVM's pool runs one thread unless told otherwise.
        os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    device = Device(tracker, key)  # a wrong tracker or key fails here, not after the builds
    with tempfile.TemporaryDirectory(prefix="tvm-memplan-measure-") as scratch:
        artifacts = _artifacts(source, given, target, compare, Path(scratch), tuning_dir, cross_compiler, options)
        first = Manifest.load(next(iter(artifacts.values())))
        model = load_model(first.model)
        inputs = model.random_inputs(0) if inputs is None else inputs
        reference = reference_outputs(model, inputs)
        atols = int8_tolerances(model, inputs, reference)
        results: dict[str, Measurement] = {}
        for pipeline, artifact in artifacts.items():
            try:
                results[pipeline] = measure_artifact(
                    device, artifact, inputs, reference, repeat, min_repeat_ms, progress, source, atols
                )
            except (RuntimeError, OSError) as exc:  # TVM raises RuntimeError subclasses
                reason = error_line(exc)
                if log is not None:
                    log.append(
                        {
                            "model": first.model,
                            "target": first.target,
                            "pipeline": pipeline,
                            "device": device.name,
                            "error": reason,
                        }
                    )
                kept = f"; {len(results)} earlier result(s) kept in {log.path}" if log is not None else ""
                raise UserError(f"measuring {pipeline} on {device.name} failed: {reason}{kept}") from None
            if log is not None:
                log.append(results[pipeline].summary())
        return results


def _given_artifact(source: str) -> Manifest | None:
    """The manifest when ``source`` names a built artifact, None when it names a model."""
    if not source.endswith(".so"):
        return None
    if not Path(source).exists():
        raise UserError(f"no such artifact: {source}")
    return Manifest.load(Path(source))


def _artifacts(
    source: str,
    given: Manifest | None,
    target: str,
    compare: bool,
    scratch: Path,
    tuning_dir: str | None,
    cross_compiler: str | None,
    options: dict[str, Any],
) -> dict[str, Path]:
    """``{pipeline: artifact}`` in measuring order: the given artifact, plus what ``compare`` adds."""
    if given is None:
        outputs = {p: scratch / f"{p}.so" for p in (PIPELINES if compare else ("memplan",))}
        return build_artifacts(source, target, outputs, tuning_dir, cross_compiler, **options)
    if not compare:
        return {given.pipeline: Path(source)}
    other = next(p for p in PIPELINES if p != given.pipeline)
    built = build_artifacts(
        given.model,
        given.target,
        {other: scratch / f"{other}.so"},
        given.tuning_dir,
        given.cross_compiler,
        **given.options,
    )
    return {p: built[p] if p == other else Path(source) for p in PIPELINES}
