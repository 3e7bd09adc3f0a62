"""Optional MetaSchedule tuning of the LQ dense kernels (XGBoost cost model, database on disk).

Tuning is slow (≈5 s a trial on two cores, plus a 14 s import of the tensor intrinsics when the
first tuning context is made), so it is opt-in (``--tune-trials N``). The JSON database in ``work_dir`` is
reused: a kernel whose workload already has records is compiled from them without new trials.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import tvm
from tvm import tirx


def tune_primfunc(func: tirx.PrimFunc, target: tvm.target.Target, trials: int, work_dir: Path) -> tirx.PrimFunc | None:
    """The best schedule MetaSchedule finds for ``func`` in ``trials`` measured candidates, or None
    when every trial failed (builds or runs timed out on a loaded machine)."""
    from tvm.s_tir import meta_schedule as ms

    from ..deploy.tune import (
        local_builder,
        local_runner,
        meta_schedule_logging,
        require_cost_model,
        run_tuning,
        warn_no_trial_succeeded,
    )

    if "num-cores" not in target.attrs:
        raise ValueError("MetaSchedule needs a target with num-cores")
    work_dir.mkdir(parents=True, exist_ok=True)
    func = func.without_attr("tir.is_scheduled").with_attr("global_symbol", "main")
    mod = tvm.IRModule({"main": func})
    database = ms.database.JSONDatabase(work_dir=str(work_dir))
    if not database.has_workload(mod) or not database.get_top_k(database.commit_workload(mod), 1):
        require_cost_model()
        with meta_schedule_logging():
            database = run_tuning(
                lambda: ms.tune_tir(
                    mod,
                    target,
                    str(work_dir),
                    max_trials_global=trials,
                    num_trials_per_iter=min(16, trials),
                    cost_model="xgb",
                    builder=local_builder(),
                    runner=local_runner(),
                    database=database,
                )
            )
    sch = ms.tir_integration.compile_tir(database, mod, target)
    if sch is None:
        warn_no_trial_succeeded("an LQ kernel (it keeps the hand schedule)")
        return None
    return sch.mod["main"].with_attr("tir.is_scheduled", True)


def metaschedule_dense(
    trials: int, work_dir: Path
) -> Callable[[tirx.PrimFunc, tvm.target.Target], tirx.PrimFunc | None]:
    """A ``schedule_dense`` hook for :class:`~tvm_memplan.lq.relax_pass.LQDense` (None: no trial succeeded)."""

    def schedule(func: tirx.PrimFunc, target: tvm.target.Target) -> tirx.PrimFunc | None:
        return tune_primfunc(func, target, trials, work_dir)

    return schedule
