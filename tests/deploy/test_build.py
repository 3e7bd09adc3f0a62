"""``tvm-memplan build`` for every target this machine can build, and one-line errors for the rest."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import tvm
from onnx import numpy_helper

from tvm_memplan.backends.sidecars import runtime_loaded
from tvm_memplan.deploy.build import Manifest
from tvm_memplan.frontend import load_model

from .conftest import needs_aarch64_gxx, run_cli, run_cli_json

EM_AARCH64 = 183
EM_X86_64 = 62


def elf_machine(path) -> int:
    header = open(path, "rb").read(20)
    assert header[:4] == b"\x7fELF"
    return int.from_bytes(header[18:20], "little")


def test_build_host_writes_library_and_manifest(capsys, tmp_path):
    out = tmp_path / "mcu.so"
    # NCHW: its constant pool is the initializers' bytes (blocked weights are padded to whole channel blocks)
    report = run_cli_json(capsys, "build", "zoo:mcu_cnn", "--layout", "nchw", "-o", str(out))
    assert elf_machine(out) == EM_X86_64
    manifest = Manifest.load(out)
    assert manifest.target == "host" and manifest.pipeline == "memplan" and manifest.model == "zoo:mcu_cnn"
    assert report["planned_bytes"] == manifest.storage_bytes + manifest.output_bytes
    assert manifest.output_bytes == 10 * 4  # one (1, 10) float32 output
    assert manifest.inputs == [{"name": "input", "shape": [1, 3, 32, 32], "dtype": "float32"}]
    initializers = load_model("zoo:mcu_cnn").onnx_model.graph.initializer
    assert (
        report["constant_bytes"]
        == manifest.constant_bytes
        == sum(numpy_helper.to_array(i).nbytes for i in initializers)
    )


@needs_aarch64_gxx
@pytest.mark.parametrize("target", ["llvm-aarch64", "c-aarch64"])
def test_cross_compiled_artifacts_are_arm64(capsys, tmp_path, target):
    out = tmp_path / f"{target}.so"
    run_cli_json(capsys, "build", "zoo:mlp", "-o", str(out), "--target", target)
    assert elf_machine(out) == EM_AARCH64


@needs_aarch64_gxx
@pytest.mark.parametrize("target", ["opencl-mali", "opencl-adreno", "vulkan-arm64"])
def test_phone_gpu_artifacts_build_but_cannot_run_here(capsys, tmp_path, target):
    out = tmp_path / f"{target}.so"
    if target.startswith("vulkan") and not runtime_loaded("vulkan"):
        # a fresh install without setup-gpu: the Vulkan kernels have no runtime module to go into
        code, _, err = run_cli(capsys, "build", "zoo:mcu_cnn", "-o", str(out), "--target", target)
        assert code == 2 and err.count("\n") == 1 and "run tvm-memplan setup-gpu" in err
        return
    run_cli_json(capsys, "build", "zoo:mcu_cnn", "-o", str(out), "--target", target)
    assert elf_machine(out) == EM_AARCH64 and Manifest.load(out).constant_bytes > 0
    code, _, err = run_cli(capsys, "measure", str(out), "--log", str(tmp_path / "log.jsonl"))
    # no GPU runtime or device here, or (after setup-gpu, PoCL or lavapipe) an arm64 library: either way, RPC
    assert code == 2 and err.count("\n") == 1 and "--rpc-tracker/--rpc-key" in err


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc missing: TVM compiles CUDA kernels with it")
def test_cuda_artifact_compiles_without_a_gpu(capsys, tmp_path):
    out = tmp_path / "cuda.so"
    run_cli_json(capsys, "build", "zoo:mcu_cnn", "-o", str(out), "--target", "cuda")
    assert elf_machine(out) == EM_X86_64 and Manifest.load(out).target == "cuda"
    if not tvm.cuda().exist:
        code, _, err = run_cli(capsys, "measure", str(out), "--log", str(tmp_path / "log.jsonl"))
        assert code == 2 and "no cuda device" in err


@pytest.mark.skipif(not tvm.cuda().exist, reason="no CUDA GPU on this machine")
def test_cuda_runs_and_matches_the_reference(capsys, tmp_path):
    report = run_cli_json(
        capsys,
        "measure",
        "zoo:mcu_cnn",
        "--target",
        "cuda",
        "--compare",
        "--repeat",
        "3",
        "--log",
        str(tmp_path / "log.jsonl"),
    )
    for pipeline in ("stock", "memplan"):
        assert report[pipeline]["correct"]
        assert report[pipeline]["requested_bytes"] == report[pipeline]["planned_bytes"]


def test_bad_artifact_names_and_models_are_one_line(capsys, tmp_path):
    code, _, err = run_cli(capsys, "build", "zoo:mlp", "-o", str(tmp_path / "x.bin"))
    assert code == 2 and ".so" in err and err.count("\n") == 1
    code, _, err = run_cli(capsys, "build", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "x.so"))
    assert code == 2 and "no such model file" in err


def _make_and_run(directory, compiler: str, runner: list[str]) -> str:
    subprocess.run(["make", "-s", "clean"], cwd=directory, check=True)
    extra = ["LDFLAGS=-static"] if "aarch64" in compiler else []
    subprocess.run(["make", "-s", f"CC={compiler}", *extra], cwd=directory, check=True, capture_output=True)
    result = subprocess.run([*runner, "./example"], cwd=directory, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_emit_c_compiles_with_gcc_and_the_example_passes(capsys, tmp_path):
    out_dir = tmp_path / "mcu_c"
    run_cli_json(
        capsys, "build", "zoo:mcu_cnn", "-o", str(tmp_path / "m.so"), "--target", "c", "--emit-c", str(out_dir)
    )
    for name in (
        "kernels.c",
        "kernels.h",
        "tvm_memplan_runtime.c",
        "example_main.c",
        "example_data.h",
        "Makefile",
        "README.md",
        "include/tvm/ffi/c_api.h",
        "include/dlpack/dlpack.h",
    ):
        assert (out_dir / name).is_file(), name
    assert "Calling convention" in (out_dir / "kernels.h").read_text()
    assert _make_and_run(out_dir, "gcc", []).startswith("PASS ")


@pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-gcc") is None or shutil.which("qemu-aarch64") is None,
    reason="aarch64-linux-gnu-gcc or qemu-aarch64 missing (Debian: gcc-aarch64-linux-gnu qemu-user)",
)
def test_emit_c_cross_compiles_and_runs_under_qemu(capsys, tmp_path):
    out_dir = tmp_path / "mlp_c"
    run_cli_json(capsys, "build", "zoo:mlp?hidden=32", "-o", str(tmp_path / "m.so"), "--emit-c", str(out_dir))
    assert _make_and_run(out_dir, "aarch64-linux-gnu-gcc", ["qemu-aarch64"]).startswith("PASS ")
