"""A small MetaSchedule run of ``tune`` and ``quantize --trials`` through the CLI (in CI, ~1 min),
and the one-line errors when the XGBoost cost model is missing or broken.

The long tuning tests (16 trials, RPC) stay opt-in in tests/deploy/test_tune.py.
"""

from __future__ import annotations

import json
import logging
import sys

import numpy as np
import onnx
import pytest

from tvm_memplan.cli.main import main
from tvm_memplan.deploy import tune as tune_module
from tvm_memplan.deploy.tune import run_tuning
from tvm_memplan.errors import UserError

from ..lq.models import mlp

KERNEL = "fused_matmul1_add1"  # zoo:mlp's 512 -> 10 layer: the smallest kernel to tune


def _two_trials(work_dir) -> list[str]:
    """``tune`` of zoo:mlp's smallest kernel, two trials, its database in ``work_dir``."""
    return ["tune", "zoo:mlp", "--trials", "2", "--kernels", KERNEL, "--work-dir", str(work_dir)]


@pytest.fixture
def lq_files(tmp_path):
    """A one-layer ONNX model (one LQ kernel to tune) and its calibration data."""
    model = tmp_path / "one.onnx"
    onnx.save(mlp((40, 6), batch="N"), str(model))
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).normal(size=(16, 40)).astype(np.float32))
    return model, calib


@pytest.mark.slow
def test_tune_runs_two_trials_to_completion(tmp_path, capsys, monkeypatch):
    # a handler without a name on MetaSchedule's logger broke its logging setup ("'NoneType' object
    # has no attribute 'format'") when an earlier test in the same pytest-xdist worker left one
    unnamed = logging.NullHandler()
    monkeypatch.setattr(logging.getLogger("tvm.s_tir.meta_schedule"), "handlers", [unnamed])
    work_dir = tmp_path / "tuning"
    code = main([*_two_trials(work_dir), "--builder-timeout", "30", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["kernels"] == [KERNEL] and report["trials_run"] == 2 and report["records"] >= 1
    assert (work_dir / "database_tuning_record.json").stat().st_size > 0
    assert logging.getLogger("tvm.s_tir.meta_schedule").handlers == [unnamed]  # put back after tuning


def test_tuning_goes_on_when_every_build_times_out(tmp_path, capsys):
    """A loaded machine or a slow device: builds past their limit are failed trials, not a crash."""
    code = main([*_two_trials(tmp_path / "t"), "--builder-timeout", "0.001", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["trials_run"] == 2 and report["records"] == 0
    assert "warning: no tuning trial of 1 kernel(s) succeeded" in err


@pytest.mark.slow
def test_quantize_keeps_the_hand_schedule_when_every_run_times_out(lq_files, tmp_path, capsys, monkeypatch):
    # every measurement asks for 60 s of repeats and is killed after 5 s; the runner's own start-up
    # check (a trivial call) gets the same 5 s, which a 1 ms limit broke on a loaded CI machine
    from tvm.s_tir import meta_schedule as ms

    def slow_runner(evaluator_config=None):
        config = ms.runner.EvaluatorConfig(number=1, repeat=1, min_repeat_ms=60_000)
        return ms.runner.LocalRunner(timeout_sec=5.0, evaluator_config=config)

    monkeypatch.setattr(tune_module, "local_runner", slow_runner)
    model, calib = lq_files
    out = tmp_path / "q.so"
    code = main(
        [
            "quantize",
            str(model),
            "--calib",
            str(calib),
            "--trials",
            "2",
            "--work-dir",
            str(tmp_path / "lq_tuning"),
            "-o",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert out.is_file() and "it keeps the hand schedule" in captured.err


@pytest.mark.slow
def test_quantize_with_trials_runs_to_completion(lq_files, tmp_path, capsys):
    model, calib = lq_files
    out = tmp_path / "q.so"
    tune_dir = tmp_path / "lq_tuning"
    code = main(
        ["quantize", str(model), "--calib", str(calib), "--trials", "2", "--work-dir", str(tune_dir), "-o", str(out)]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert out.is_file() and (tune_dir / "database_tuning_record.json").stat().st_size > 0
    assert "task_scheduler" not in captured.out  # MetaSchedule's log stays in the tuning directory


@pytest.mark.parametrize("broken", ["missing", "failing"])
@pytest.mark.parametrize("command", ["tune", "quantize"])
def test_unusable_cost_model_is_one_line_exit_2(monkeypatch, lq_files, tmp_path, capsys, broken, command):
    if broken == "missing":
        monkeypatch.setitem(sys.modules, "xgboost", None)  # import xgboost now raises ImportError
    else:
        import xgboost

        def fail(*args, **kwargs):
            raise xgboost.core.XGBoostError("libxgboost is broken")

        monkeypatch.setattr(xgboost, "train", fail)
    model, calib = lq_files
    if command == "tune":
        argv = ["tune", "zoo:mlp", "--trials", "2", "--work-dir", str(tmp_path / "t")]
    else:
        argv = ["quantize", str(model), "--calib", str(calib), "--trials", "2", "-o", str(tmp_path / "q.so")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tvm-memplan: error: MetaSchedule's XGBoost cost model is unusable")
    assert ("ModuleNotFoundError" if broken == "missing" else "libxgboost is broken") in err
    assert err.count("\n") == 1


def test_a_cost_model_failure_during_tuning_becomes_one_line():
    def tuning():
        raise RuntimeError("Traceback (most recent call last):\n  File xgb_model.py\nXGBoostError: bad feature matrix")

    with pytest.raises(UserError, match="XGBoost cost model failed: XGBoostError: bad feature matrix"):
        run_tuning(tuning)
    with pytest.raises(RuntimeError, match="unrelated"):
        run_tuning(lambda: (_ for _ in ()).throw(RuntimeError("unrelated")))
