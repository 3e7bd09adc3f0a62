"""Models with several outputs (a transformers ``BertModel`` export: ``last_hidden_state`` and
``pooler_output``) through ``measure``, ``measure --compare``, ``plan --verify`` and ``build --emit-c``,
locally and through a loopback RPC farm, where a tuple result is a remote object."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_cli_json

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
    report = run_cli_json(capsys, "measure", str(artifact), "--compare", "--rpc-tracker", farm.tracker,
                          "--rpc-key", "local", *FAST, "--log", str(tmp_path / "log.jsonl"))
    for result in report.values():
        assert result["device"] == f"rpc:local@{farm.tracker}"
        assert result["correct"] and result["requested_bytes"] == result["planned_bytes"]


def test_plan_verify(capsys, pooled_bert):
    summary = run_cli_json(capsys, "plan", pooled_bert, "--verify")
    assert summary["verified"] is True and summary["verify"]["identical_to_stock"]


def test_standalone_c_writes_both_outputs(capsys, tmp_path):
    out_dir = tmp_path / "bert_c"
    run_cli_json(capsys, "build", str(FIXTURES / "transformers_bert_pooled.torchscript.onnx"), "--target", "c",
                 "-o", str(tmp_path / "bert.so"), "--emit-c", str(out_dir))
    header = (out_dir / "model.h").read_text()
    assert "float* out0, float* out1" in header
    report = run_cli_json(capsys, "measure", str(out_dir), "--log", str(tmp_path / "log.jsonl"))["memplan"]
    assert report["correct"] and report["reference"] == "onnxruntime", report
