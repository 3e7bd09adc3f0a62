"""Build for aarch64 and measure on the emulated arm64 device (opt-in: TVM_MEMPLAN_RUN_ARM64=1).

Prepares the device with ``scripts/arm64_device.sh prepare`` when it is not there yet (about a
minute; needs qemu-user, the Debian archive and PyPI), then registers it with a loopback tracker
under key ``arm64-emu``. Set TVM_MEMPLAN_ARM64_ROOT to keep the device somewhere else.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tvm_memplan import zoo
from tvm_memplan.deploy.rpc import start_farm

from .conftest import needs_aarch64_gxx, over_rpc, run_cli_json

pytestmark = [pytest.mark.arm64, needs_aarch64_gxx]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "arm64_device.sh"
ROOT = Path(os.environ.get("TVM_MEMPLAN_ARM64_ROOT", Path.home() / ".cache" / "tvm_memplan" / "arm64-device"))


@pytest.fixture(scope="module")
def arm64_farm():
    if shutil.which("qemu-aarch64") is None:
        pytest.skip("qemu-aarch64 missing (Debian: qemu-user)")
    if not (ROOT / "bin" / "python3").exists():
        subprocess.run([str(SCRIPT), "prepare"], check=True, timeout=900)
    with start_farm({}, lifetime=600) as farm:
        farm.add_server("arm64-emu", wait=300, command=[str(SCRIPT), "start", "--lifetime", "600"])
        yield farm


def _measure_once(capsys, artifact, farm, log) -> dict:
    """One quick timing of ``artifact`` on the emulated device: memplan's report."""
    options = (*over_rpc(farm.tracker, "arm64-emu", log), "--repeat", "1", "--min-repeat-ms", "1")
    return run_cli_json(capsys, "measure", str(artifact), *options)["memplan"]


@pytest.mark.parametrize("target", ["llvm-aarch64", "c-aarch64"])
def test_build_and_measure_on_the_emulated_arm64_device(capsys, tmp_path, arm64_farm, target):
    artifact = tmp_path / f"{target}.so"
    run_cli_json(capsys, "build", "zoo:mcu_cnn", "-o", str(artifact), "--target", target)
    report = _measure_once(capsys, artifact, arm64_farm, tmp_path / "log.jsonl")
    assert report["correct"], report["max_abs_diff"]
    assert report["requested_bytes"] == report["planned_bytes"]
    assert report["device"] == f"rpc:arm64-emu@{arm64_farm.tracker}"


@pytest.mark.parametrize("model", zoo.names())
def test_default_schedules_are_correct_on_aarch64(capsys, tmp_path, arm64_farm, model):
    """Every zoo model with the default schedules sized for NEON (4 lanes, 32 registers) runs on
    the emulated device with onnxruntime's outputs and the planned allocations."""
    artifact = tmp_path / f"{model}.so"
    run_cli_json(capsys, "build", f"zoo:{model}", "-o", str(artifact), "--target", "llvm-aarch64")
    report = _measure_once(capsys, artifact, arm64_farm, tmp_path / "log.jsonl")
    assert report["correct"], report["max_abs_diff"]
    assert report["requested_bytes"] == report["planned_bytes"]


def test_int8_sdot_kernels_are_correct_on_the_emulated_arm64_device(capsys, tmp_path, arm64_farm):
    """An int8 QDQ model built for Armv8.2 with the dot product: its convolutions and classifier are
    tensorized with sdot, its depthwise convolutions multiply-accumulate widened bytes (smlal; both in
    the library's code), and the outputs agree with onnxruntime under the int8 rule."""
    import numpy as np
    import onnx

    from tvm_memplan.frontend import load_model
    from tvm_memplan.quant.calibrate import quantize_int8

    model = load_model("zoo:mcu_cnn")
    source, quantized = tmp_path / "mcu_cnn.onnx", tmp_path / "mcu_cnn.int8.onnx"
    onnx.save(model.onnx_model, str(source))
    rng = np.random.default_rng(0)
    calib = {name: rng.standard_normal((4, *shape[1:])).astype(dtype) for name, shape, dtype in model.input_specs()}
    quantize_int8(source, quantized, calib)
    artifact = tmp_path / "int8.so"
    run_cli_json(capsys, "build", str(quantized), "-o", str(artifact), "--target", "llvm-aarch64-dotprod")
    code = subprocess.run(
        ["aarch64-linux-gnu-objdump", "-d", str(artifact)], capture_output=True, text=True, check=True
    )
    assert "sdot" in code.stdout and "smlal" in code.stdout
    report = _measure_once(capsys, artifact, arm64_farm, tmp_path / "log.jsonl")
    assert report["correct"], report["max_abs_diff"]
    assert report["requested_bytes"] == report["planned_bytes"]


def test_blocked_nchw4c_is_correct_on_the_emulated_arm64_device(capsys, tmp_path, arm64_farm):
    """``--layout blocked`` on NEON runs convolutions, epilogues and pools in NCHW4c (``auto`` keeps NCHW
    there: NCHW4c is untimed on arm64 hardware); its outputs agree with onnxruntime's and the VM
    requests what was planned."""
    plan = run_cli_json(capsys, "plan", "zoo:mcu_cnn", "--target", "llvm-aarch64", "--layout", "blocked")
    assert plan["layout"] == "blocked (NCHW4c)"
    artifact = tmp_path / "blocked.so"
    run_cli_json(capsys, "build", "zoo:mcu_cnn", "-o", str(artifact), "--target", "llvm-aarch64", "--layout", "blocked")
    report = _measure_once(capsys, artifact, arm64_farm, tmp_path / "log.jsonl")
    assert report["correct"], report["max_abs_diff"]
    assert report["requested_bytes"] == report["planned_bytes"]
