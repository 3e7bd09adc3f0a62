"""MetaSchedule tuning of a model's kernels, with a JSON database that later builds apply.

Tuning happens on the staged module (after fusion, before memory planning), so tuned kernels
slot into both the stock and the memplan build: planning only moves Relax-level storage. The
database in the work directory is the resume point: each run counts the records the selected
kernels already have and only runs the trials still missing to reach ``--trials``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import tvm

from ..errors import UserError
from ..frontend import load_model
from ..planner import ModelPlan
from .plans import plan_for_target
from .rpc import parse_tracker
from .targets import DeployTarget, get_target

T = TypeVar("T")

BUILDER_TIMEOUT_S = 120.0
"""Seconds one candidate build may take before MetaSchedule gives up on it (a loaded machine
can be slow; MetaSchedule's own 30 s default was set for builds that import every intrinsic).
A build or run past its limit is a failed trial: MetaSchedule records it and tuning goes on."""
RUNNER_TIMEOUT_S = 60.0
"""Seconds one candidate's measurement on this machine may take."""


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


def require_cost_model() -> None:
    """Fail with one line, before any tuning starts, when MetaSchedule's XGBoost cost model cannot work.

    TVM imports ``xgboost`` only at the cost model's first update, minutes into a run, and the
    error then surfaces as a RuntimeError from the C++ task scheduler; a tiny training run here
    also catches an installed but broken library (a missing OpenMP runtime, a bad wheel).
    """
    try:
        import xgboost

        xgboost.train(
            {"max_depth": 1, "nthread": 1, "verbosity": 0},
            xgboost.DMatrix(np.arange(8.0).reshape(4, 2), label=np.arange(4.0)),
            num_boost_round=1,
        )
    except Exception as exc:  # ImportError, OSError from the shared library, XGBoostError
        detail = str(exc).strip().splitlines()
        raise UserError(
            f"MetaSchedule's XGBoost cost model is unusable ({type(exc).__name__}: "
            f"{detail[0] if detail else 'no message'}); install it with: pip install xgboost-cpu"
        ) from None


def build_candidate(mod: tvm.IRModule, target: tvm.target.Target, _params: dict | None) -> tvm.runtime.Module:
    """MetaSchedule's default build without its ``import tvm.s_tir.tensor_intrin``.

    That import registers every tensor intrinsic (CUDA, ROCm, Hexagon ...) and takes ~14 s in
    each fresh builder process, which dominated short tuning runs. A candidate reaching the
    builder is already scheduled (tensorized blocks carry their implementation), so building
    it needs no intrinsic registry.
    """
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return tvm.build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def local_builder(timeout_s: float | None = None, cross_compiler: str | None = None):
    """A LocalBuilder with the fast build function (and a cross-compiling export when asked).

    Its construction checks a worker process under the builder's limit; that check is given the default limit, and
    ``timeout_s`` applies to the builds only: a short limit on a loaded machine killed the check itself
    (``TimeoutError``), where the builds past it are failed trials."""
    from tvm.s_tir import meta_schedule as ms

    builder = ms.builder.LocalBuilder(
        timeout_sec=BUILDER_TIMEOUT_S,
        f_build=build_candidate,
        f_export=functools.partial(_export_cross, cross_compiler) if cross_compiler else None,
    )
    if timeout_s is not None:
        builder.timeout_sec = timeout_s
    return builder


def local_runner(evaluator_config: Any = None):
    """A LocalRunner whose measurements time out after ``RUNNER_TIMEOUT_S`` (a failed trial)."""
    from tvm.s_tir import meta_schedule as ms

    return ms.runner.LocalRunner(timeout_sec=RUNNER_TIMEOUT_S, evaluator_config=evaluator_config)


@contextlib.contextmanager
def meta_schedule_logging() -> Iterator[None]:
    """MetaSchedule's logging for one tuning run: warnings on stdout, the full log in WORK_DIR/logs.

    MetaSchedule copies its console level from the ``tvm.s_tir.meta_schedule`` logger (DEBUG when
    unset) and prints to stdout, which would bury ``--json``. It also lists that logger's handlers
    by name in a ``logging.config.dictConfig``: a handler without a name there makes it fail with
    "'NoneType' object has no attribute 'format'" (seen under pytest-xdist). The logger's own
    handlers are set aside while tuning and put back after; MetaSchedule's are closed.
    """
    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    level, handlers = logger.level, logger.handlers[:]
    for handler in handlers:
        logger.removeHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for handler in logger.handlers[:]:
            logger.removeHandler(handler)
            handler.close()
        for handler in handlers:
            logger.addHandler(handler)
        logger.setLevel(level)


def warn_no_trial_succeeded(what: str) -> None:
    """One line on stderr: every trial failed (builds or runs timed out, or errors)."""
    print(
        f"tvm-memplan: warning: no tuning trial of {what} succeeded (builds or runs failed or timed out; "
        f"see the logs in the work directory, or raise --builder-timeout)",
        file=sys.stderr,
    )


def run_tuning(run: Callable[[], T]) -> T:
    """``run()``, with a cost model failure in the middle of tuning turned into one line."""
    try:
        return run()
    except Exception as exc:  # TVM's FFI re-raises Python errors of callbacks as RuntimeError
        text = str(exc)
        if "xgb" not in text.lower():
            raise
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        raise UserError(
            f"MetaSchedule's XGBoost cost model failed: {lines[-1] if lines else type(exc).__name__}"
        ) from None


def _export_cross(compiler: str, mod: tvm.runtime.Module) -> str:
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
        config = ms.runner.RPCConfig(
            tracker_host=host, tracker_port=port, tracker_key=key, session_priority=1, session_timeout_sec=120
        )
        return ms.runner.RPCRunner(config, evaluator_config=evaluator, max_workers=1), f"rpc:{key}@{tracker}"
    if target.cross_compiler:
        raise UserError(f"target {target.name} cannot run here: tune it through --rpc-tracker/--rpc-key")
    return local_runner(evaluator), "local"


def tune(
    spec: str,
    target_name: str,
    trials: int,
    work_dir: str | Path,
    kernels: str | None = None,
    tracker: str | None = None,
    key: str | None = None,
    builder_timeout: float | None = None,
    **options: Any,
) -> TuneResult:
    """Tune the selected kernels of ``spec`` until the database holds ``trials`` records for them."""
    from tvm.s_tir import meta_schedule as ms

    if trials < 1:
        raise UserError(f"--trials must be >= 1, got {trials}")
    if bool(tracker) != bool(key):
        raise UserError("--rpc-tracker and --rpc-key go together")
    if builder_timeout is not None and builder_timeout <= 0:
        raise UserError(f"--builder-timeout must be positive, got {builder_timeout}")
    require_cost_model()
    started = time.monotonic()
    target = get_target(target_name)
    plan = plan_for_target(load_model(spec), target, **options)
    tasks = _tasks(plan, kernels)
    work_dir = str(Path(work_dir).resolve())
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    database = ms.database.JSONDatabase(work_dir=work_dir)
    runner, runner_name = _runner(target, tracker, key)

    def records() -> int:
        return sum(len(database.get_top_k(database.commit_workload(t.dispatched[0]), trials)) for t in tasks)

    missing = trials - records()
    if missing > 0:
        with meta_schedule_logging():
            contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, work_dir)
            builder = local_builder(builder_timeout, target.cross_compiler)
            run_tuning(
                lambda: ms.tune.tune_tasks(
                    tasks=contexts,
                    task_weights=weights,
                    work_dir=work_dir,
                    max_trials_global=missing,
                    num_trials_per_iter=min(missing, 16),
                    builder=builder,
                    runner=runner,
                    database=database,
                    cost_model="xgb",
                )
            )
    found = records()
    if found == 0:
        warn_no_trial_succeeded(f"{len(tasks)} kernel(s)")
    return TuneResult(
        kernels=[t.task_name for t in tasks],
        trials_run=max(missing, 0),
        records=found,
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
