"""``--input-shapes`` binds a dynamic batch at compile time (plan, build, measure); ``--inputs FILE.npz``
runs the user's data (measure, plan --verify)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tvm_memplan.deploy import measure as measure_module
from tvm_memplan.deploy.build import Manifest
from tvm_memplan.frontend import load_model, parse_input_shapes
from tvm_memplan.verify import check

from .conftest import residual_net
from .test_plan import run_cli


@pytest.fixture
def dynamic_batch_onnx(tmp_path) -> str:
    """conv -> relu -> conv -> add -> pool -> gemm on x[batch, 3, 8, 8], as exporters write a dynamic batch."""
    return residual_net(tmp_path / "dynamic_batch.onnx", batch="batch", side=8, concat=False)


FAST = ("--repeat", "1", "--min-repeat-ms", "1")


def test_input_shapes_parse_with_colons_in_names():
    assert parse_input_shapes("input:0:1x3x8x8,mask:2") == {"input:0": (1, 3, 8, 8), "mask": (2,)}


def test_binding_the_batch_also_binds_the_outputs(dynamic_batch_onnx):
    model = load_model(f"{dynamic_batch_onnx}?input_shapes=x:3x3x8x8")
    assert model.input_specs()[0][1] == (3, 3, 8, 8)
    assert [d.dim_value for d in model.onnx_model.graph.output[0].type.tensor_type.shape.dim] == [3, 10]


def test_a_dynamic_batch_plans_and_verifies_with_input_shapes(capsys, dynamic_batch_onnx):
    code, _, err = run_cli(capsys, "plan", dynamic_batch_onnx, "--verify")
    assert code == 2 and err.count("\n") == 1 and "give --input-shapes x:1x3x8x8" in err
    reports = {}
    for batch in (1, 2):
        code, out, err = run_cli(
            capsys, "plan", dynamic_batch_onnx, "--input-shapes", f"x:{batch}x3x8x8", "--verify", "--json"
        )
        assert code == 0, err
        reports[batch] = json.loads(out)
        assert reports[batch]["verified"] and reports[batch]["tensors"] > 0
    assert reports[2]["arena_bytes"] == 2 * reports[1]["arena_bytes"]


def test_a_dynamic_batch_plan_report_names_the_input_shapes_to_give(capsys, dynamic_batch_onnx):
    code, out, err = run_cli(capsys, "plan", dynamic_batch_onnx)
    assert code == 0, err
    unplanned = [line for line in out.splitlines() if "unplanned" in line]
    # one line for all the tensors with symbolic shapes, not one per tensor
    assert len(unplanned) == 1 and "symbolic shape" in unplanned[0], out
    assert "--input-shapes x:1x3x8x8" in " ".join(out.split())
    code, out, _ = run_cli(capsys, "plan", dynamic_batch_onnx, "--json")
    assert json.loads(out)["dynamic_inputs"] == {"x": ["batch", "3", "8", "8"]}


def test_build_records_the_shapes_and_measure_runs_the_artifact(capsys, tmp_path, dynamic_batch_onnx):
    artifact = tmp_path / "batch2.so"
    code, _, err = run_cli(capsys, "build", dynamic_batch_onnx, "--input-shapes", "x:2x3x8x8", "-o", str(artifact))
    assert code == 0, err
    manifest = Manifest.load(artifact)
    assert manifest.inputs == [{"name": "x", "shape": [2, 3, 8, 8], "dtype": "float32"}]
    assert manifest.model.endswith("?input_shapes=x:2x3x8x8")
    code, out, err = run_cli(capsys, "measure", str(artifact), *FAST, "--json")
    assert code == 0, err
    result = json.loads(out)["memplan"]
    assert result["correct"] and result["requested_bytes"] == result["planned_bytes"]
    code, _, err = run_cli(capsys, "measure", str(artifact), "--input-shapes", "x:1x3x8x8")
    assert code == 2 and "applies to a model" in err


def test_measure_and_verify_run_the_users_inputs(capsys, tmp_path, monkeypatch, dynamic_batch_onnx):
    data = np.random.default_rng(7).standard_normal((3, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "inputs.npz", x=data)
    seen = []
    reference = measure_module.reference_outputs
    monkeypatch.setattr(
        measure_module, "reference_outputs", lambda model, inputs: seen.append(inputs) or reference(model, inputs)
    )
    # without --input-shapes, the batch of 3 comes from the data
    code, out, err = run_cli(
        capsys, "measure", dynamic_batch_onnx, "--inputs", str(tmp_path / "inputs.npz"), *FAST, "--json"
    )
    assert code == 0, err
    assert json.loads(out)["memplan"]["correct"] and np.array_equal(seen[-1]["x"], data)
    run_vm = check.run_vm
    monkeypatch.setattr(
        check, "run_vm", lambda executable, inputs, *rest: seen.append(inputs) or run_vm(executable, inputs, *rest)
    )
    code, out, err = run_cli(
        capsys, "plan", dynamic_batch_onnx, "--inputs", str(tmp_path / "inputs.npz"), "--verify", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["verified"] and np.array_equal(seen[-1]["x"], data)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--input-shapes", "y:1x3x8x8"], "no input 'y' (inputs: x)"),
        (["--input-shapes", "x:1x3x8"], "has 4 dimensions, --input-shapes gives 3"),
        (["--input-shapes", "x:1x4x8x8"], "dimension 1 of input 'x' is fixed at 3"),
        (["--inputs", "WRONG_NAME", "--verify"], "no input 'z' (inputs: x)"),
        (["--inputs", "WRONG_NAME", "--input-shapes", "x:1x3x8x8", "--verify"], "missing x; unknown z"),
        (["--inputs", "WRONG_SHAPE", "--input-shapes", "x:1x3x8x8", "--verify"], "x has shape (2, 3, 8, 8)"),
        (["--inputs", "MISSING", "--verify"], "no such inputs file"),
    ],
)
def test_bad_shapes_and_inputs_are_one_line(capsys, tmp_path, dynamic_batch_onnx, argv, message):
    np.savez(tmp_path / "wrong_name.npz", z=np.zeros((1, 3, 8, 8), np.float32))
    np.savez(tmp_path / "wrong_shape.npz", x=np.zeros((2, 3, 8, 8), np.float32))
    files = {
        "WRONG_NAME": tmp_path / "wrong_name.npz",
        "WRONG_SHAPE": tmp_path / "wrong_shape.npz",
        "MISSING": tmp_path / "missing.npz",
    }
    code, out, err = run_cli(capsys, "plan", dynamic_batch_onnx, *[str(files.get(a, a)) for a in argv])
    assert code == 2 and not out and err.count("\n") == 1 and message in err
