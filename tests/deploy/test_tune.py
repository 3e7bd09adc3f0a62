"""MetaSchedule tuning, locally and through the tracker (opt-in: TVM_MEMPLAN_RUN_TUNING=1, ~3-4 min).

Only the smaller MLP kernel is tuned: 16 trials locally, 8 through the loopback farm.
"""

from __future__ import annotations

import pytest

from tvm_memplan.deploy.tune import tune

from .conftest import run_cli_json

pytestmark = [pytest.mark.tuning]

MODEL = "zoo:mlp"
KERNEL = "fused_matmul1_add1"  # the 512 -> 10 layer


def test_tune_locally_resume_and_apply(capsys, tmp_path):
    work_dir = tmp_path / "tuning"
    first = tune(MODEL, "host", 16, work_dir, kernels=KERNEL)
    assert first.kernels == [KERNEL] and first.trials_run == 16 and first.records >= 16
    again = tune(MODEL, "host", 16, work_dir, kernels=KERNEL)  # resumes: nothing left to do
    assert again.trials_run == 0 and again.records == first.records
    report = run_cli_json(
        capsys,
        "measure",
        MODEL,
        "--work-dir",
        str(work_dir),
        "--compare",
        "--repeat",
        "2",
        "--min-repeat-ms",
        "1",
        "--log",
        str(tmp_path / "log.jsonl"),
    )
    assert report["memplan"]["correct"] and report["stock"]["correct"]


def test_tune_through_the_tracker(capsys, tmp_path, farm):
    report = run_cli_json(
        capsys,
        "tune",
        MODEL,
        "--trials",
        "8",
        "--kernels",
        KERNEL,
        "--work-dir",
        str(tmp_path / "tuning"),
        "--rpc-tracker",
        farm.tracker,
        "--rpc-key",
        "local",
    )
    assert report["runner"] == f"rpc:local@{farm.tracker}" and report["records"] >= 8
