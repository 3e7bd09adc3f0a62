"""``tvm-memplan quantize`` and ``lq-bench`` end to end, and their one-line errors."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import tvm
from tvm import relax

from tvm_memplan.cli.main import main

from .models import mlp

SIZES = (40, 32, 6)


@pytest.fixture
def files(tmp_path):
    model = tmp_path / "mlp.onnx"
    onnx.save(mlp(SIZES, batch="N"), str(model))
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).normal(size=(32, SIZES[0])).astype(np.float32))
    return model, calib


def test_quantize_writes_a_library_and_a_report(files, tmp_path, capsys):
    model, calib = files
    out = tmp_path / "out" / "mlp_lq"
    quantize = ["quantize", str(model), "--calib", str(calib)]
    assert main([*quantize, "--wbits", "3", "--abits", "2", "--finetune", "-o", str(out)]) == 0
    report = json.loads((tmp_path / "out" / "mlp_lq.json").read_text())
    assert [layer["status"] for layer in report["layers"]] == ["lq", "lq"]
    assert report["config"]["wbits"] == 3 and report["config"]["finetune"] is True
    assert report["size_bytes"] < report["float_bytes"]
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "out" / "mlp_lq.so")), tvm.cpu())
    y = vm["main"](tvm.runtime.tensor(np.ones((1, SIZES[0]), np.float32))).numpy()
    assert y.shape == (1, SIZES[-1]) and np.all(np.isfinite(y))
    out = capsys.readouterr().out
    assert "2/2 dense layers quantized (asked W3A2)" in out
    # each layer: its bits, its calibration error against its limit, and why it differs from the ask
    for layer in report["layers"]:
        assert f"W{layer['wbits']}A{layer['abits']}, output error {layer['output_rel_error']:.3f}" in out
    assert "first/last dense layer: at least 4 bits" in out


def test_defaults_fine_tune_and_check_each_layer(files, tmp_path):
    model, calib = files
    assert main(["quantize", str(model), "--calib", str(calib), "-o", str(tmp_path / "d.so")]) == 0
    config = json.loads((tmp_path / "d.json").read_text())["config"]
    assert config["finetune"] is True and config["check_layers"] is True and config["edge_bits"] == 4
    quantize = ["quantize", str(model), "--calib", str(calib)]
    assert main([*quantize, "--no-finetune", "--no-layer-check", "-o", str(tmp_path / "p.so")]) == 0
    config = json.loads((tmp_path / "p.json").read_text())["config"]
    assert config["finetune"] is False and config["check_layers"] is False


def test_keep_first_last_reports_the_float_layers(files, tmp_path, capsys):
    model, calib = files
    assert main(["quantize", str(model), "--calib", str(calib), "--keep-first-last", "-o", str(tmp_path / "k.so")]) == 0
    assert "left in float: kept in float" in capsys.readouterr().out


@pytest.mark.parametrize(
    "change,message",
    [
        (["--wbits", "5"], "--wbits must be an integer in 1..4"),
        (["--abits", "0"], "--abits must be an integer in 1..4"),
        ("missing-model", "model not found"),
        ("bad-model", "cannot read ONNX model"),
        ("missing-calib", "calibration file not found"),
        ("wrong-array", "calibration array"),
        ("not-npz", "cannot read calibration data"),
    ],
)
def test_bad_input_is_one_line_exit_2(files, tmp_path, capsys, change, message):
    model, calib = files
    if change == "missing-model":
        model = tmp_path / "nope.onnx"
    elif change == "bad-model":
        model = tmp_path / "bad.onnx"
        model.write_bytes(b"not a protobuf")
    elif change == "missing-calib":
        calib = tmp_path / "nope.npz"
    elif change == "wrong-array":
        np.savez(calib, x=np.zeros((4, 3), np.float32))
    elif change == "not-npz":
        calib.write_text("hello")
    extra = change if isinstance(change, list) else []
    code = main(["quantize", str(model), "--calib", str(calib), *extra, "-o", str(tmp_path / "o.so")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("tvm-memplan: error: ") and message in err
    assert err.count("\n") == 1


def test_lq_bench_json_rows(tmp_path, capsys):
    args = ["lq-bench", "--json", "--no-kernels", "--quick", "--epochs", "2", "--hidden", "32"]
    assert main(args + ["--settings", "32/32,2/2,1/2", "--cache-dir", str(tmp_path)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"rows", "kernels"} and result["kernels"] == []
    assert [(r["wbits"], r["abits"]) for r in result["rows"]] == [(32, 32), (2, 2), (1, 2)]
    for row in result["rows"]:
        assert set(row) >= {"wbits", "abits", "accuracy", "size_bytes", "latency_us"}
        assert 0.0 <= row["accuracy"] <= 1.0 and row["latency_us"] > 0
    assert result["rows"][1]["size_bytes"] < result["rows"][0]["size_bytes"] / 4


def test_lq_bench_rejects_bad_settings(capsys):
    assert main(["lq-bench", "--settings", "2/9"]) == 2
    assert "activation bits must be an integer in 1..4" in capsys.readouterr().err
