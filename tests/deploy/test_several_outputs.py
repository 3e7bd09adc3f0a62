"""Models with several outputs (a transformers ``BertModel`` export: ``last_hidden_state`` and
``pooler_output``) through ``measure``, ``measure --compare``, ``plan --verify`` and ``build --emit-c``,
locally and through a loopback RPC farm, where a tuple result is a remote object."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import over_rpc, run_cli_json

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FAST = ("--repeat", "2", "--min-repeat-ms", "1")


@pytest.fixture(params=["torchscript", "dynamo"])
def pooled_bert(request) -> str:
    return str(FIXTURES / f"transformers_bert_pooled.{request.param}.onnx")


def test_measure_compare_checks_both_outputs_locally(capsys, tmp_path, pooled_bert):
    report = run_cli_json(capsys, "measure", pooled_bert, "--compare", *FAST, "--log", str(tmp_path / "log.jsonl"))
    for result in report.values():
        assert result["correct"] and result["reference"] == "onnxruntime"
        assert result["requested_bytes"] == result["planned_bytes"]


def test_measure_through_rpc(capsys, tmp_path, farm):
    artifact = tmp_path / "bert.so"
    run_cli_json(capsys, "build", str(FIXTURES / "transformers_bert_pooled.torchscript.onnx"), "-o", str(artifact))
    log = tmp_path / "log.jsonl"
    report = run_cli_json(capsys, "measure", str(artifact), "--compare", *over_rpc(farm.tracker, "local", log), *FAST)
    for result in report.values():
        assert result["device"] == f"rpc:local@{farm.tracker}"
        assert result["correct"] and result["requested_bytes"] == result["planned_bytes"]


def test_plan_verify(capsys, pooled_bert):
    summary = run_cli_json(capsys, "plan", pooled_bert, "--verify")
    assert summary["verified"] is True and summary["verify"]["identical_to_stock"]


def test_standalone_c_writes_both_outputs(capsys, tmp_path):
    out_dir = tmp_path / "bert_c"
    run_cli_json(
        capsys,
        "build",
        str(FIXTURES / "transformers_bert_pooled.torchscript.onnx"),
        "--target",
        "c",
        "-o",
        str(tmp_path / "bert.so"),
        "--emit-c",
        str(out_dir),
    )
    header = (out_dir / "model.h").read_text()
    assert "float* out0, float* out1" in header
    report = run_cli_json(capsys, "measure", str(out_dir), "--log", str(tmp_path / "log.jsonl"))["memplan"]
    assert report["correct"] and report["reference"] == "onnxruntime", report


def test_each_measurement_gives_the_device_back(tmp_path):
    """Three measurements in a row on a one-server farm: a measurement that kept its RPC session
    (remote tuple outputs held alive) would leave the third waiting for the server forever."""
    script = tmp_path / "three.py"
    script.write_text(f"""
from tvm_memplan.deploy.measure import measure
from tvm_memplan.deploy.rpc import start_farm
with start_farm({{"local": 1}}, lifetime=120) as farm:
    for _ in range(3):
        result = measure({str(FIXTURES / "transformers_bert_pooled.torchscript.onnx")!r}, tracker=farm.tracker,
                         key="local", repeat=1)["memplan"]
        assert result.correct
print("done")
""")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0 and done.stdout.strip().endswith("done"), done.stderr[-2000:]
