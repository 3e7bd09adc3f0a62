"""OpenCL end to end on this machine's OpenCL device (PoCL in CI): build, measure, and the setup hint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R
from tvm.script import tirx as T

from tvm_memplan.cli.main import main
from tvm_memplan.deploy import targets
from tvm_memplan.deploy.measure import measure
from tvm_memplan.deploy.rpc import start_farm
from tvm_memplan.relax.offsets import KernelOffsetParams
from tvm_memplan.relax.pipeline import pipeline
from tvm_memplan.verify import run_vm

from ..deploy.conftest import over_rpc
from ..relax.modules import chain_with_view, concat_cases, random_input, residual_block
from .conftest import needs_device

FAST = ("--repeat", "1", "--min-repeat-ms", "1")


@pytest.mark.parametrize("target", ["opencl", "vulkan"])
def test_without_the_runtime_measure_says_to_run_setup_gpu(capsys, monkeypatch, target):
    monkeypatch.setattr(targets, "runtime_loaded", lambda device: False)
    assert main(["measure", "zoo:mlp?hidden=16", "--target", target]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tvm-memplan setup-gpu" in err


@needs_device("opencl")
def test_build_then_measure_matches_onnxruntime_and_the_plan(capsys, tmp_path):
    artifact = tmp_path / "cnn.so"
    assert main(["build", "zoo:mcu_cnn", "--target", "opencl", "-o", str(artifact), "--json"]) == 0
    built = json.loads(capsys.readouterr().out)
    # aliasing is on: kernels read tensors at their arena offsets (see the tests below)
    assert json.loads((tmp_path / "cnn.so.json").read_text())["options"]["inplace"] is True
    code = main(["measure", str(artifact), "--compare", "--json", *FAST, "--log", str(tmp_path / "log.jsonl")])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    for result in report.values():
        assert result["target"] == "opencl" and result["reference"] == "onnxruntime"
        assert result["correct"], result["max_abs_diff"]
        # the VM's alloc_storage requests are the plan: memplan's arena (or SPBM's blocks) + outputs
        assert result["requested_bytes"] == result["planned_bytes"]
        assert result["zero_offset_calls"] == 0  # no tensor copied out of the arena
    assert report["memplan"]["planned_bytes"] == built["planned_bytes"]
    assert report["memplan"]["requested_bytes"] < report["stock"]["requested_bytes"]


@needs_device("opencl")
def test_measure_through_a_loopback_tracker(capsys, tmp_path):
    """rpc-local's servers import tvm with the sidecars, so they expose the OpenCL device."""
    artifact = tmp_path / "mlp.so"
    assert main(["build", "zoo:mlp?hidden=16", "--target", "opencl", "-o", str(artifact)]) == 0
    capsys.readouterr()
    with start_farm({"gpu": 1}, lifetime=120) as farm:
        code = main(
            [
                "measure",
                str(artifact),
                *over_rpc(farm.tracker, "gpu", tmp_path / "log.jsonl"),
                "--json",
                *FAST,
            ]
        )
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)["memplan"]
    assert result["device"].startswith("rpc:gpu@") and result["correct"]
    assert result["requested_bytes"] == result["planned_bytes"] and result["zero_offset_calls"] == 0


@needs_device("opencl")
def test_a_depthwise_conv_with_a_1x1_output_schedules_and_runs():
    """dlight's GEMV rule asserts on this kernel (MobileNetV2 at 32x32); the next rule schedules it."""

    @tvm.script.ir_module
    class Depthwise:
        @R.function
        def main(x: R.Tensor((1, 16, 1, 1), "float32"), w: R.Tensor((16, 1, 3, 3), "float32")):
            with R.dataflow():
                y = R.nn.conv2d(x, w, padding=(1, 1), groups=16)
                z = R.nn.relu(y)
                R.output(z)
            return z

    target = tvm.target.Target({"kind": "opencl", "host": "llvm"})
    executable = tvm.compile(Depthwise, target, relax_pipeline=pipeline(target))
    dev = tvm.opencl(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 16, 1, 1)).astype("float32")
    w = rng.standard_normal((16, 1, 3, 3)).astype("float32")
    out = relax.VirtualMachine(executable, dev)["main"](tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev))
    np.testing.assert_allclose(
        out.numpy(), np.maximum(x * w[:, :, 1:2, 1:2].reshape(1, 16, 1, 1), 0), rtol=1e-5, atol=1e-6
    )


@needs_device("opencl")
def test_a_tensor_at_an_arena_offset_is_written_in_place():
    """OpenCL cannot offset a buffer on the host (ensure_zero_offset would copy it): kernels whose
    buffers take an elem_offset read and write the arena at the tensor's offset."""

    @tvm.script.ir_module
    class Offset:
        @T.prim_func(private=True, s_tir=True)
        def add_one(a: T.Buffer((16,), "float32"), b: T.Buffer((16,), "float32")):
            for i in T.thread_binding(16, thread="threadIdx.x"):
                with T.sblock("b"):
                    vi = T.axis.spatial(16, i)
                    b[vi] = a[vi] + T.float32(1)

        @R.function
        def main(x: R.Tensor((16,), "float32")):
            R.func_attr({"relax.force_pure": True})
            arena = R.memory.alloc_storage(R.shape([4096]), 0, "global", "uint8")
            written = R.memory.alloc_tensor(arena, 1024, R.shape([16]), "float32")
            _ = Offset.add_one(x, written)
            # the same bytes, placed again (as the planner places a later tensor that aliases them)
            read = R.memory.alloc_tensor(arena, 1024, R.shape([16]), "float32")
            out = R.builtin.alloc_tensor(R.shape([16]), "float32", 0)
            _2 = Offset.add_one(read, out)
            return out

    target = tvm.target.Target({"kind": "opencl", "host": "llvm"})
    executable = tvm.compile(KernelOffsetParams()(Offset), target)
    dev = tvm.opencl(0)
    x = np.arange(16, dtype="float32")
    out = relax.VirtualMachine(executable, dev)["main"](tvm.runtime.tensor(x, dev))
    np.testing.assert_array_equal(out.numpy(), x + 2)


@needs_device("opencl")
@pytest.mark.parametrize("case", ["concats", "residual", "view"])
def test_in_place_and_concat_aliasing_match_the_cpu_without_copies(case):
    """Planned with aliasing on (concats removed, a kernel writing over its dying input, a kernel
    reading a tensor at an offset through a reshape view): the same outputs as the LLVM build, no
    ensure_zero_offset (a copy on OpenCL), and the VM's storage requests are the arena plus the outputs."""
    if case == "concats":
        mod, inputs = concat_cases(), [random_input((1, 32)), random_input((2, 32), seed=1)]
    elif case == "residual":
        mod, inputs = residual_block(), [random_input((64, 64))]
    else:
        mod, inputs = chain_with_view(), [random_input((64, 64))]
    reports = []
    target = tvm.target.Target({"kind": "opencl", "host": "llvm"})
    executable = tvm.compile(mod, target, relax_pipeline=pipeline(target, on_report=reports.append, order="program"))
    (report,) = reports
    if case == "view":  # the viewed tensor sits at a nonzero offset
        assert any(t["offset"] > 0 for t in report.arenas[0]["tensors"])
    else:
        assert (report.concats_removed if case == "concats" else report.inplace_ops) >= 1
    out, trace = run_vm(executable, inputs, tvm.opencl(0))
    assert trace.zero_offset_calls == 0
    assert sorted(trace.storage_bytes) == sorted([report.arena_bytes, *(o.nbytes for o in out)])
    cpu = tvm.target.Target("llvm")
    expected, _ = run_vm(tvm.compile(mod, cpu, relax_pipeline=pipeline(cpu, order="program")), inputs)
    np.testing.assert_allclose(out[0], expected[0], rtol=1e-5, atol=1e-5)


@needs_device("opencl")
def test_mobilenet_v2_with_the_gpu_rule_and_aliasing_matches_onnxruntime_and_the_plan():
    """Depthwise, pointwise and strided convolutions under ThreadPerOutput, residual adds in place."""
    spec = "zoo:mobilenet_v2?width=0.35&resolution=32"
    result = measure(spec, "opencl", repeat=1, min_repeat_ms=1, order="program")["memplan"]
    assert result.correct, result.max_abs_diff
    assert result.requested_bytes == result.planned_bytes and result.zero_offset_calls == 0
