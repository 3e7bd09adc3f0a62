"""MetaSchedule tuning of a model's kernels, with a JSON database that later builds apply.

Tuning happens on the staged module (after fusion, before memory planning), so tuned kernels
slot into both the stock and the memplan build: planning only moves Relax-level storage. The
database in the work directory is the resume point: each run counts the records the selected
kernels already have and only runs the trials still missing to reach ``--trials``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm

from ..errors import UserError
from ..frontend import load_model
from ..planner import ModelPlan
from .build import plan_for
from .rpc import parse_tracker
from .targets import DeployTarget, get_target

BUILDER_TIMEOUT_S = 120.0
"""MetaSchedule's default 30 s kills most builds: each builder process imports s_tir (~18 s)."""


@dataclass
class TuneResult:
    kernels: list[str]
    trials_run: int
    records: int
    work_dir: str
    runner: str
    seconds: float

    def summary(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _export_cross(compiler: str, mod: "tvm.runtime.Module") -> str:
    """MetaSchedule builder export with a cross compiler (module-level: builder workers unpickle it)."""
    import os
    import tempfile

    from tvm.support import cc

    path = os.path.join(tempfile.mkdtemp(prefix="tvm-memplan-tune-"), "tuned.so")
    mod.export_library(path, fcompile=cc.cross_compiler(compiler))
    return path


def _tasks(plan: ModelPlan, kernels: str | None) -> list:
    """One task per kernel of the staged module (``extract_tasks`` only sees ``call_tir``, which
    ``CallTIRRewrite`` has already lowered at this stage)."""
    from tvm.s_tir import meta_schedule as ms

    try:
        pattern = re.compile(kernels or "")
    except re.error as exc:
        raise UserError(f"--kernels is not a valid regular expression: {exc}") from None
    tasks = []
    for global_var, func in plan.stock_staged.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc) and pattern.search(global_var.name_hint):
            mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
            tasks.append(ms.ExtractedTask(global_var.name_hint, mod, plan.target, [mod], 1))
    if not tasks:
        raise UserError(f"no kernel of {plan.model.name} matches --kernels {kernels!r}")
    return tasks


def _runner(target: DeployTarget, tracker: str | None, key: str | None):
    from tvm.s_tir import meta_schedule as ms

    evaluator = ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=20, enable_cpu_cache_flush=False)
    if tracker:
        host, port = parse_tracker(tracker)
        config = ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=key,
                                     session_priority=1, session_timeout_sec=120)
        return ms.runner.RPCRunner(config, evaluator_config=evaluator, max_workers=1), f"rpc:{key}@{tracker}"
    if target.cross_compiler:
        raise UserError(f"target {target.name} cannot run here: tune it through --rpc-tracker/--rpc-key")
    return ms.runner.LocalRunner(timeout_sec=60, evaluator_config=evaluator), "local"


def tune(
    spec: str,
    target_name: str,
    trials: int,
    work_dir: str | Path,
    kernels: str | None = None,
    tracker: str | None = None,
    key: str | None = None,
    **options: Any,
) -> TuneResult:
    """Tune the selected kernels of ``spec`` until the database holds ``trials`` records for them."""
    from tvm.s_tir import meta_schedule as ms

    if trials < 1:
        raise UserError(f"--trials must be >= 1, got {trials}")
    if bool(tracker) != bool(key):
        raise UserError("--rpc-tracker and --rpc-key go together")
    started = time.monotonic()
    target = get_target(target_name)
    plan = plan_for(load_model(spec), target, **options)
    tasks = _tasks(plan, kernels)
    work_dir = str(Path(work_dir).resolve())
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    database = ms.database.JSONDatabase(work_dir=work_dir)
    runner, runner_name = _runner(target, tracker, key)

    def records() -> int:
        return sum(len(database.get_top_k(database.commit_workload(t.dispatched[0]), trials)) for t in tasks)

    missing = trials - records()
    if missing > 0:
        # MetaSchedule copies its console level from this logger (DEBUG when unset) and prints to
        # stdout, which would bury --json: keep warnings there, the full log in WORK_DIR/logs.
        logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
        contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, work_dir)
        builder = ms.builder.LocalBuilder(
            timeout_sec=BUILDER_TIMEOUT_S,
            f_export=functools.partial(_export_cross, target.cross_compiler) if target.cross_compiler else None,
        )
        ms.tune.tune_tasks(
            tasks=contexts, task_weights=weights, work_dir=work_dir, max_trials_global=missing,
            num_trials_per_iter=min(missing, 16), builder=builder, runner=runner, database=database,
            cost_model="xgb",
        )
    return TuneResult(
        kernels=[t.task_name for t in tasks],
        trials_run=max(missing, 0),
        records=records(),
        work_dir=work_dir,
        runner=runner_name,
        seconds=round(time.monotonic() - started, 1),
    )


def apply_tuning(plan: ModelPlan, work_dir: str | Path) -> ModelPlan:
    """``plan`` with every kernel the database has a record for replaced by its best schedule."""
    if not Path(work_dir, "database_tuning_record.json").exists():
        raise UserError(f"{work_dir} has no MetaSchedule database: run tvm-memplan tune first")
    with plan.target, tvm.transform.PassContext(opt_level=3):
        apply = tvm.relax.transform.MetaScheduleApplyDatabase(str(work_dir))
        return dataclasses.replace(plan, stock_staged=apply(plan.stock_staged), planned=apply(plan.planned))
