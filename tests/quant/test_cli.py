"""The CLI on int8 QDQ models: refused encodings, the int8 arena, --verify, build and measure --compare."""

from __future__ import annotations

import json
import sys

import onnx
import pytest
from onnx import TensorProto

from tvm_memplan.cli.main import main

from . import models


def _save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)


REFUSED = {
    "qoperator": (lambda: models.qoperator(), "QLinearConv"),
    "dynamic": (lambda: models.qoperator(dynamic=True), "DynamicQuantizeLinear"),
    "float8": (lambda: models.qdq_by_hand(elem_type=TensorProto.FLOAT8E4M3FN), "FLOAT8E4M3FN"),
    "int4": (lambda: models.qdq_by_hand(elem_type=TensorProto.INT4), "INT4"),
    "blocked": (lambda: models.qdq_by_hand(block_size=4), "block_size=4"),
}


@pytest.mark.parametrize("kind", list(REFUSED))
def test_unlowerable_quantization_gets_one_line_and_exit_2(capsys, tmp_path, kind):
    make, named = REFUSED[kind]
    path = _save(make(), tmp_path / f"{kind}.onnx")
    assert main(["plan", path]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert named in err and "QDQ" in err and "quantize_static" in err


@pytest.fixture(scope="module")
def network_files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("int8")
    float_model = models.network()
    return {
        "float": _save(float_model, directory / "net.onnx"),
        "int8": _save(models.quantize_qdq(float_model), directory / "net.int8.onnx"),
        "uint8": _save(models.quantize_qdq(float_model, activation="uint8"), directory / "net.uint8.onnx"),
    }


def _plan(capsys, path: str, *extra: str) -> dict:
    assert main(["plan", path, "--json", "--order-seconds", "2", *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("activation", ["int8", "uint8"])
def test_int8_arena_is_verified_against_onnxruntime(capsys, network_files, activation):
    plan = _plan(capsys, network_files[activation], "--verify")
    verify = plan["verify"]
    assert plan["verified"] and not verify["problems"]
    assert verify["vm_storage_bytes"] == verify["planned_storage_bytes"]
    assert verify["max_lsb_diff_vs_onnxruntime"] <= verify["tolerance_lsb"]
    assert plan["arena_bytes"] == plan["lower_bound_bytes"]


def test_int8_arena_is_about_a_quarter_of_the_float_one(capsys, network_files):
    float_arena = _plan(capsys, network_files["float"])["arena_bytes"]
    int8_arena = _plan(capsys, network_files["int8"])["arena_bytes"]
    # 1-byte activations; the float build fuses the residual Add into its conv, the int8 one keeps
    # onnxruntime's separate QLinearAdd (one more 1-byte tensor live at the peak): 0.30 here
    assert int8_arena <= 0.31 * float_arena


def test_build_and_measure_compare_an_int8_model(capsys, network_files, tmp_path):
    out = tmp_path / "net.int8.so"
    assert main(["build", network_files["int8"], "-o", str(out), "--json", "--order-seconds", "2"]) == 0
    int8_weights = json.loads(capsys.readouterr().out)["constant_bytes"]
    assert out.exists()
    assert (
        main(["build", network_files["float"], "-o", str(tmp_path / "net.so"), "--json", "--order-seconds", "2"]) == 0
    )
    float_weights = json.loads(capsys.readouterr().out)["constant_bytes"]
    # int8 weights, and per output channel an int32 bias and a float32 multiplier (16 channels: a large share)
    assert 0 < int8_weights < float_weights / 2
    log = tmp_path / "log.jsonl"
    assert (
        main(
            [
                "measure",
                network_files["int8"],
                "--compare",
                "--repeat",
                "1",
                "--min-repeat-ms",
                "1",
                "--order-seconds",
                "2",
                "--log",
                str(log),
                "--json",
            ]
        )
        == 0
    )
    results = json.loads(capsys.readouterr().out)
    assert results["memplan"]["correct"] and results["stock"]["correct"]
    assert results["memplan"]["reference"] == "onnxruntime"


@pytest.mark.parametrize("activation", ["int8", "uint8"])
def test_quantize_int8_writes_a_qdq_model_that_plans_to_int8(capsys, monkeypatch, network_files, tmp_path, activation):
    import numpy as np

    if activation == "uint8":  # on a terminal, with its progress display
        monkeypatch.setattr(sys.stderr, "isatty", lambda: True)

    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32))
    out = tmp_path / "net.int8.onnx"
    assert (
        main(
            [
                "quantize",
                network_files["float"],
                "--int8",
                "--activations",
                activation,
                "--calib",
                str(calib),
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert "wrote" in capsys.readouterr().out
    quantized = onnx.load(str(out))
    zero_points = [i for i in quantized.graph.initializer if i.name.endswith("_zero_point") and i.dims == []]
    expected = TensorProto.INT8 if activation == "int8" else TensorProto.UINT8
    assert zero_points and all(z.data_type == expected for z in zero_points)
    plan = _plan(capsys, str(out), "--verify")
    assert not plan["verify"]["problems"]
    assert plan["arena_bytes"] < _plan(capsys, network_files["float"])["arena_bytes"] / 3


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"other": (4, 3, 32, 32), "more": (4, 3, 32, 32)}, "no array for input(s) x"),
        ({"x": (4, 3, 16, 16)}, "expected (samples, 3, 32, 32)"),
    ],
)
def test_quantize_int8_bad_calibration_is_one_line(capsys, network_files, tmp_path, arrays, message):
    import numpy as np

    calib = tmp_path / "calib.npz"
    np.savez(calib, **{name: np.zeros(shape, np.float32) for name, shape in arrays.items()})
    out = str(tmp_path / "o.onnx")
    assert main(["quantize", network_files["float"], "--int8", "--calib", str(calib), "-o", out]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not list(tmp_path.glob("*.onnx"))


def test_quantize_int8_refuses_a_quantized_model(capsys, network_files, tmp_path):
    import numpy as np

    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.zeros((1, 3, 32, 32), np.float32))
    out = str(tmp_path / "o.onnx")
    assert main(["quantize", network_files["int8"], "--int8", "--calib", str(calib), "-o", out]) == 2
    assert "already quantized" in capsys.readouterr().err


def test_int8_model_on_the_c_target(capsys, network_files):
    """The C code generator: nearbyint and fmaf from libm, the same integers as LLVM's build."""
    plan = _plan(capsys, network_files["int8"], "--target", "c", "--verify")
    assert not plan["verify"]["problems"] and plan["verify"]["max_lsb_diff_vs_onnxruntime"] == 0


def test_split_acg_plans_and_builds_an_int8_model(capsys, tmp_path):
    """--split acg on an int8 model with a large early tensor: row tiles of its integer kernels under a
    memory limit the unsplit 1-byte arena misses, verified (identical to stock TVM, the VM's requests
    equal to the plan), and the build of the same split."""
    model = _save(models.quantize_qdq(models.early_activation(size=16)), tmp_path / "early.int8.onnx")
    unsplit = _plan(capsys, model)
    limit = unsplit["arena_bytes"] * 3 // 4
    cache = str(tmp_path / "latency.jsonl")  # the build's search reuses the plan's measurements
    split_args = ["--split", "acg", "--memory-limit", str(limit), "--search-seconds", "2", "--split-cache", cache]
    split = _plan(capsys, model, *split_args, "--verify")
    assert split["split_subgraphs"] and {s["kind"] for s in split["split_subgraphs"]} == {"spatial"}
    assert split["arena_bytes"] <= limit < unsplit["arena_bytes"]
    verify = split["verify"]
    assert verify["identical_to_stock"] and not verify["problems"]
    assert verify["vm_storage_bytes"] == verify["planned_storage_bytes"]
    out = tmp_path / "early.int8.so"
    assert main(["build", model, "-o", str(out), "--json", "--order-seconds", "2", *split_args]) == 0
    built = json.loads(capsys.readouterr().out)
    assert out.exists() and built["storage_bytes"] <= limit


def test_fused_tiles_refuse_an_int8_model_in_one_line(capsys, network_files):
    assert main(["plan", network_files["int8"], "--split", "acg", "--fused-tiles", "on"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--fused-tiles on does not take int8" in err


def test_int8_model_as_standalone_c(capsys, network_files, tmp_path):
    """build --emit-c (the microcontroller path): the int8 arena in the C, run here against onnxruntime."""
    directory = tmp_path / "c"
    assert main(["build", network_files["int8"], "--emit-c", str(directory), "--json", "--order-seconds", "2"]) == 0
    capsys.readouterr()
    assert main(["measure", str(directory), "--json", "--repeat", "1", "--log", str(tmp_path / "log.jsonl")]) == 0
    result = json.loads(capsys.readouterr().out)["memplan"]
    assert result["correct"] and result["arena_bytes"] == _plan(capsys, network_files["int8"])["arena_bytes"]
