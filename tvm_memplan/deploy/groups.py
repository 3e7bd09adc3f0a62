"""Layer grouping side by side (table 1 of Oplachko's thesis, docs/design.md): latency, arena and launches per
group setting.

Every setting is planned, built, checked against the ungrouped memplan build's outputs (they
must be bit-identical: the kernels are the same) and timed on one device in one run, beside the
ungrouped pipeline and TVM's own planner over the same kernels.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError
from ..frontend import load_model
from ..planning.grouping import GroupSetting, parse_groups
from .build import compile_plan, export, manifest_for, plan_for
from .measure import Device, Measurement, Progress, measure_artifact, reference_outputs
from .targets import get_target

DEFAULT_SETTINGS = "seq,1,2,4,8"


def parse_group_settings(text: str) -> list[GroupSetting]:
    """``seq,1,2,4,8`` → ``["seq", 1, 2, 4, 8]``; a one-line UserError for anything else."""
    settings = []
    for word in text.split(","):
        try:
            settings.append(parse_groups(word))
        except ValueError as exc:
            raise UserError(f"--groups: {exc}") from None
    return list(dict.fromkeys(settings))


@dataclass
class GroupRow:
    """One pipeline of the comparison."""

    groups: GroupSetting | None
    """``seq``, a count, ``auto``, or None for the ungrouped pipelines (``pipeline`` says which)."""
    pipeline: str
    latency_ms: float
    latency_spread_ms: float
    arena_bytes: int
    """Planned bytes: memplan's arena, or StaticPlanBlockMemory's blocks for ``stock``."""
    launches: int
    """Kernel launches per inference as built here, traced on the device (on a GPU, one per group
    whose kernels were fused; else one per kernel); the plan's kernel count where the server
    cannot trace."""
    group_launches: int | None
    """Groups with at least one kernel: the launches if every group ran as one fused kernel."""
    layers: int | None
    unconstrained_arena_bytes: int | None
    """The arena of the same order without the F-predicate."""
    identical: bool
    """Outputs bit-identical to the ungrouped memplan build."""
    correct: bool
    """Outputs within tolerance of the ungrouped memplan build, itself checked against onnxruntime."""
    requested_bytes: int | None
    """What the VM asked for in one call (arena plus outputs); None when the device cannot trace."""
    requested_equals_plan: bool | None


@dataclass
class GroupBench:
    """One model's comparison on one device: the baselines, every setting, and the memory figures."""

    model: str
    target: str
    device: str
    tvm_num_threads: str | None
    naive_bytes: int
    """No planning at all: every tensor its own memory."""
    tvm_default_bytes: int
    rows: list[GroupRow] = field(default_factory=list)

    def choice(self) -> GroupSetting | None:
        """The setting to deploy, chosen by measurement: the fastest grouped build, but only when
        it beats ungrouped memplan by more than both spreads; else None (stay ungrouped)."""
        ungrouped = next(r for r in self.rows if r.groups is None and r.pipeline == "memplan")
        grouped = [r for r in self.rows if r.groups is not None and r.identical]
        if not grouped:
            return None
        best = min(grouped, key=lambda r: r.latency_ms)
        margin = best.latency_spread_ms + ungrouped.latency_spread_ms
        return best.groups if best.latency_ms + margin < ungrouped.latency_ms else None

    def summary(self) -> dict[str, Any]:
        return {
            "choice": self.choice(),
            "rows": [asdict(r) for r in self.rows if r.groups is not None],
            "baselines": [asdict(r) for r in self.rows if r.groups is None],
            **{k: v for k, v in asdict(self).items() if k != "rows"},
        }


def _row(
    groups: GroupSetting | None, pipeline: str, m: Measurement, report_plan, identical: bool, correct: bool
) -> GroupRow:
    grouped = groups is not None
    return GroupRow(
        groups=groups,
        pipeline=pipeline,
        latency_ms=m.latency_ms,
        latency_spread_ms=m.latency_spread_ms,
        arena_bytes=int(report_plan.total("arena_bytes") if pipeline != "stock" else report_plan.tvm_default_bytes),
        launches=m.launches
        if m.launches is not None
        # TVM's planner keeps the concats memplan writes in place: one more kernel each
        else int(report_plan.total("kernels") + (report_plan.total("concats_removed") if pipeline == "stock" else 0)),
        group_launches=int(report_plan.total("groups")) if grouped else None,
        layers=int(report_plan.total("layers")) if grouped else None,
        unconstrained_arena_bytes=int(report_plan.total("unconstrained_arena_bytes")) if grouped else None,
        identical=identical,
        correct=correct,
        requested_bytes=m.requested_bytes,
        requested_equals_plan=None if m.requested_bytes is None else m.requested_bytes == m.planned_bytes,
    )


def bench_groups(
    spec: str,
    settings: Sequence[GroupSetting],
    target: str = "host",
    tracker: str | None = None,
    key: str | None = None,
    repeat: int = 10,
    min_repeat_ms: int = 50,
    progress: Progress | None = None,
    rounds: int = 1,
    **options: Any,
) -> GroupBench:
    """Plan, build and check ``spec`` ungrouped (stock planner, memplan) and per setting, then
    time every build in ``rounds`` interleaved rounds (forward, then reversed, ...) of ``repeat``
    repeats each, so that drift on a shared machine hits all builds alike."""
    if repeat < 1 or rounds < 1:
        raise UserError(f"--repeat and --rounds must be >= 1, got {repeat} and {rounds}")
    if not settings:
        raise UserError("--groups names no setting")
    deploy_target = get_target(target)
    if not tracker:
        problem = deploy_target.runtime_problem()
        if problem:
            raise UserError(problem)
        os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    device = Device(tracker, key)
    model = load_model(spec)
    inputs = model.random_inputs(0)
    reference = reference_outputs(model, inputs)
    bench: GroupBench | None = None
    with tempfile.TemporaryDirectory(prefix="tvm-memplan-groups-") as scratch:
        # ungrouped memplan first: its outputs become the reference every other build must equal
        runs: list[tuple[GroupSetting | None, str]] = [
            (None, "memplan"),
            (None, "stock"),
            *((g, "memplan") for g in settings),
        ]
        built = []
        for groups, pipeline in runs:
            plan = plan_for(model, deploy_target, **options, groups=groups)
            name = f"{pipeline}-{groups if groups is not None else 'ungrouped'}"
            artifact = Path(scratch) / f"{name}.so"
            manifest = manifest_for(plan, spec, deploy_target, pipeline, None, None)
            export(compile_plan(plan, pipeline), deploy_target, manifest, artifact)
            measured = measure_artifact(device, artifact, inputs, reference, repeat, min_repeat_ms, progress, spec)
            if bench is None:
                correct, identical = measured.correct, True
                reference = (_outputs(device, artifact, inputs, deploy_target), "memplan ungrouped")
                bench = GroupBench(
                    model.name,
                    deploy_target.name,
                    device.name,
                    _threads(measured),
                    int(plan.total("naive_bytes")),
                    int(plan.tvm_default_bytes),
                )
            else:
                correct, identical = measured.correct, measured.max_abs_diff == 0.0
            built.append((groups, pipeline, plan, artifact, [measured], identical, correct))
        for round_index in range(1, rounds):
            for _, _, _, artifact, measurements, _, _ in built[::-1] if round_index % 2 else built:
                measurements.append(
                    measure_artifact(device, artifact, inputs, reference, repeat, min_repeat_ms, progress, spec)
                )
        for groups, pipeline, plan, _, measurements, identical, correct in built:
            bench.rows.append(_row(groups, pipeline, _pooled(measurements), plan, identical, correct))
    assert bench is not None
    return bench


def _pooled(measurements: list[Measurement]) -> Measurement:
    """One measurement from several rounds: median and interquartile range over all repeats."""
    repeats = [ms for m in measurements for ms in m.repeats_ms]
    q25, median, q75 = np.percentile(repeats, [25, 50, 75])
    return dataclasses.replace(
        measurements[0],
        latency_ms=round(float(median), 4),
        latency_spread_ms=round(float(q75 - q25), 4),
        repeats_ms=repeats,
    )


def _threads(m: Measurement) -> str | None:
    return m.tvm_num_threads or os.environ.get("TVM_NUM_THREADS")


def _outputs(device: Device, artifact: Path, inputs: dict[str, np.ndarray], deploy_target) -> list[np.ndarray]:
    """Run the artifact once more and bring its outputs back: the reference of the other builds."""
    import tvm
    from tvm import relax

    from ..verify.run import flatten_outputs

    session = device.session
    remote_name = f"check-{artifact.name}"
    session.upload(str(artifact), remote_name)
    dev = session.device(deploy_target.device, 0)
    vm = relax.VirtualMachine(session.load_module(remote_name), dev)
    return flatten_outputs(vm["main"](*[tvm.runtime.tensor(a, dev) for a in inputs.values()]))
