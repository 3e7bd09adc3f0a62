"""``tvm-memplan measure``: locally and through a loopback RPC farm, for host and C artifacts."""

from __future__ import annotations

import socket

import pytest

from tvm_memplan.deploy.measure import measure
from tvm_memplan.deploy.results import ResultsLog
from tvm_memplan.deploy.rpc import start_farm
from tvm_memplan.errors import UserError

from .conftest import over_rpc, run_cli, run_cli_json

FAST = ("--repeat", "2", "--min-repeat-ms", "1")
PROMISED = {"latency_ms", "latency_spread_ms", "requested_bytes", "planned_bytes", "correct"}


def test_local_compare_json_and_log(capsys, tmp_path):
    log = tmp_path / "log.jsonl"
    report = run_cli_json(capsys, "measure", "zoo:mcu_cnn", "--compare", *FAST, "--log", str(log))
    assert set(report) == {"stock", "memplan"}
    for pipeline, result in report.items():
        assert PROMISED <= set(result)
        assert result["correct"] and result["pipeline"] == pipeline and result["device"] == "local"
        # What the VM asked for is exactly the plan: arenas (or SPBM blocks) plus the outputs.
        assert result["requested_bytes"] == result["planned_bytes"]
        assert len(result["repeats_ms"]) == 2 and result["latency_ms"] > 0
    assert report["memplan"]["planned_bytes"] <= report["stock"]["planned_bytes"]
    assert [r["pipeline"] for r in ResultsLog(log).records()] == ["stock", "memplan"]


def test_measure_table_output(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "measure", "zoo:mlp?hidden=64", *FAST, "--log", str(tmp_path / "log.jsonl"))
    assert code == 0 and "memplan" in out and "results appended to" in out


@pytest.mark.parametrize("target", ["host", "c"])
def test_build_then_measure_through_rpc(capsys, tmp_path, farm, target):
    artifact = tmp_path / f"{target}.so"
    run_cli_json(capsys, "build", "zoo:mcu_cnn", "-o", str(artifact), "--target", target)
    log = tmp_path / "log.jsonl"
    report = run_cli_json(capsys, "measure", str(artifact), *over_rpc(farm.tracker, "local", log), *FAST)["memplan"]
    assert report["device"] == f"rpc:local@{farm.tracker}" and report["target"] == target
    assert report["correct"] and report["requested_bytes"] == report["planned_bytes"]
    assert report["tvm_num_threads"]  # the farm's servers time with all cores


def test_compare_an_artifact_through_rpc_rebuilds_the_stock_one(capsys, tmp_path, farm):
    artifact = tmp_path / "mlp.so"
    run_cli_json(capsys, "build", "zoo:mlp?hidden=64", "-o", str(artifact))
    log = tmp_path / "log.jsonl"
    report = run_cli_json(capsys, "measure", str(artifact), "--compare", *over_rpc(farm.tracker, "local", log), *FAST)
    assert report["memplan"]["source"] == str(artifact)
    assert all(report[p]["correct"] for p in ("stock", "memplan"))


def test_losing_the_server_mid_measurement_keeps_earlier_results(tmp_path):
    log = ResultsLog(tmp_path / "log.jsonl")
    with start_farm({"local": 1}, lifetime=120) as own_farm:

        def progress(pipeline: str, step: str, done: int, total: int) -> None:
            if pipeline == "memplan" and step == "uploaded":
                own_farm.kill_servers("local")  # the device disappears mid-run

        with pytest.raises(UserError) as failure:
            measure(
                "zoo:mcu_cnn",
                compare=True,
                repeat=2,
                tracker=own_farm.tracker,
                key="local",
                log=log,
                progress=progress,
                min_repeat_ms=1,
            )
    message = str(failure.value)
    assert "\n" not in message and "measuring memplan" in message and "1 earlier result(s) kept" in message
    records = list(log.records())
    assert records[0]["pipeline"] == "stock" and records[0]["correct"]
    assert records[1]["pipeline"] == "memplan" and "error" in records[1]


def test_rpc_usage_errors_are_one_line(capsys, tmp_path, farm):
    log = str(tmp_path / "log.jsonl")
    code, _, err = run_cli(
        capsys, "measure", "zoo:mlp", "--rpc-tracker", farm.tracker, "--rpc-key", "nope", "--log", log
    )
    assert code == 2 and err.count("\n") == 1 and "no device registered under key 'nope'" in err and "local" in err
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    code, _, err = run_cli(
        capsys, "measure", "zoo:mlp", "--rpc-tracker", f"127.0.0.1:{closed}", "--rpc-key", "local", "--log", log
    )
    assert code == 2 and err.count("\n") == 1 and "cannot reach the RPC tracker" in err
    code, _, err = run_cli(capsys, "measure", "zoo:mlp", "--rpc-tracker", farm.tracker, "--log", log)
    assert code == 2 and "go together" in err
    code, _, err = run_cli(capsys, "measure", str(tmp_path / "none.so"), "--log", log)
    assert code == 2 and "no such artifact" in err
    (tmp_path / "bare.so").write_bytes(b"")
    code, _, err = run_cli(capsys, "measure", str(tmp_path / "bare.so"), "--log", log)
    assert code == 2 and "no manifest" in err
