"""The whole model as standalone C: host build and emulated Cortex-M against onnxruntime, the static
arena equal to the plan (and to what the VM requests), limits, and one-line errors."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_memplan.deploy.build import Manifest
from tvm_memplan.deploy.mcu import ModelC

from .conftest import run_cli, run_cli_json

PROMISED = ["correct", "max_abs_diff", "arena_bytes", "sram_bytes", "flash_bytes", "instructions"]
needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="arm-none-eabi-gcc or qemu-system-arm missing (Debian: gcc-arm-none-eabi libnewlib-arm-none-eabi "
    "qemu-system-arm; .ci/run installs them)",
)


@pytest.fixture
def concat_onnx(tmp_path) -> str:
    """conv → relu → conv → add (in place) → concat (eliminated) → pool → gemm, with the pooled
    features as a second output that the gemm also reads."""
    rng = np.random.default_rng(0)

    def init(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["a"]),
        helper.make_node("Conv", ["r1", "w3", "b3"], ["c3"]),
        helper.make_node("Concat", ["a", "c3"], ["cat"], axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "concat_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10]),
            helper.make_tensor_value_info("f", TensorProto.FLOAT, [1, 16]),
        ],
        [
            init("w1", [8, 3, 3, 3]),
            init("b1", [8]),
            init("w2", [8, 8, 3, 3]),
            init("b2", [8]),
            init("w3", [8, 8, 1, 1]),
            init("b3", [8]),
            init("wf", [10, 16]),
            init("bf", [10]),
        ],
    )
    path = tmp_path / "concat_net.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return str(path)


def _static_arena(directory) -> int:
    found = re.findall(
        r"static uint8_t memplan_arena\[(\d+)\] MEMPLAN_ARENA_SECTION __attribute__\(\(aligned\(64\)\)\);",
        (directory / "model.c").read_text(),
    )
    assert len(found) == 1
    return int(found[0])


def test_host_build_equals_onnxruntime_and_the_arena_equals_the_vm_plan(capsys, tmp_path):
    out_dir, library = tmp_path / "mcu_c", tmp_path / "mcu.so"
    built = run_cli_json(capsys, "build", "zoo:mcu_cnn", "--target", "c", "-o", str(library), "--emit-c", str(out_dir))
    source = (out_dir / "model.c").read_text()
    assert "int mcu_cnn_run(const float* in0, float* out0)" in (out_dir / "model.h").read_text()
    assert "malloc" not in source + (out_dir / "tvm_memplan_runtime.c").read_text()
    assert "const float mcu_cnn_weight0[" in (out_dir / "model_weights.c").read_text()
    # The VM of the same plan requests its arena plus the output: the C reserves that arena exactly.
    vm = run_cli_json(
        capsys, "measure", str(library), "--repeat", "1", "--min-repeat-ms", "1", "--log", str(tmp_path / "l.jsonl")
    )["memplan"]
    manifest = Manifest.load(library)
    assert vm["requested_bytes"] - manifest.output_bytes == manifest.storage_bytes == built["arena_bytes"]
    assert _static_arena(out_dir) == built["arena_bytes"] == ModelC.load(out_dir).arena_bytes
    assert built["arena_bytes"] < built["tvm_default_bytes"] < built["naive_bytes"]

    report = run_cli_json(capsys, "measure", str(out_dir), "--log", str(tmp_path / "log.jsonl"))["memplan"]
    assert list(report)[: len(PROMISED)] == PROMISED
    assert report["correct"] and report["reference"] == "onnxruntime" and report["device"] == "host"
    assert report["arena_bytes"] == built["arena_bytes"]  # the symbol in the linked binary
    assert report["sram_bytes"] is None and report["instructions"] is None  # a host says nothing about a chip


def test_in_place_concat_and_two_outputs(capsys, tmp_path, concat_onnx):
    out_dir = tmp_path / "net_c"
    run_cli_json(capsys, "build", concat_onnx, "--target", "c-standalone", "--emit-c", str(out_dir))
    source = (out_dir / "model.c").read_text()
    assert "concatenate" not in source  # the concat is gone: its inputs were written in place
    assert "float* out0, float* out1" in (out_dir / "model.h").read_text()
    report = run_cli_json(capsys, "measure", str(out_dir), "--log", str(tmp_path / "log.jsonl"))["memplan"]
    assert report["correct"], report


@needs_arm
@pytest.mark.parametrize("cpu", ["cortex-m7", "cortex-m4", "cortex-m55"])
def test_emulated_cortex_m_equals_onnxruntime(capsys, tmp_path, cpu):
    out_dir = tmp_path / cpu
    built = run_cli_json(capsys, "build", "zoo:mcu_cnn", "--target", cpu, "--emit-c", str(out_dir))
    report = run_cli_json(
        capsys, "measure", str(out_dir), "--device", f"qemu-{cpu}", "--log", str(tmp_path / "log.jsonl")
    )["memplan"]
    assert list(report)[: len(PROMISED)] == PROMISED
    assert report["correct"] and report["error"] is None, report
    assert report["arena_bytes"] == built["arena_bytes"] == _static_arena(out_dir)
    sections = report["sections"]
    assert report["sram_bytes"] == sections[".data"] + sections[".bss"] + report["stack_bytes"]
    assert report["sram_bytes"] >= report["arena_bytes"] + report["workspace_bytes"]
    assert 0 < report["stack_bytes"] < sections[".stack"]
    assert report["flash_bytes"] >= report["weight_bytes"] + sections[".text"]
    assert report["instructions"] > 0
    nm = ["arm-none-eabi-nm", str(out_dir / "model.elf")]
    symbols = subprocess.run(nm, capture_output=True, text=True, check=True).stdout
    assert "memplan_arena" in symbols and not re.search(r"\b(malloc|_sbrk|_malloc_r)\b", symbols)  # no heap at all


@needs_arm
def test_instruction_count_is_deterministic(capsys, tmp_path):
    out_dir = tmp_path / "m7"
    run_cli_json(capsys, "build", "zoo:mlp?hidden=16", "--target", "cortex-m7", "--emit-c", str(out_dir))
    counts = {
        run_cli_json(
            capsys, "measure", str(out_dir), "--device", "qemu-cortex-m7", "--log", str(tmp_path / "log.jsonl")
        )["memplan"]["instructions"]
        for _ in range(2)
    }
    assert len(counts) == 1


@needs_arm
def test_split_plan_goes_through_the_same_path(capsys, tmp_path):
    plain = run_cli_json(capsys, "build", "zoo:mcu_cnn", "--target", "cortex-m7", "--emit-c", str(tmp_path / "plain"))
    out_dir = tmp_path / "split"
    split = run_cli_json(
        capsys,
        "build",
        "zoo:mcu_cnn",
        "--target",
        "cortex-m7",
        "--emit-c",
        str(out_dir),
        "--split",
        "acg",
        "--memory-limit",
        "36K",
        "--search-seconds",
        "10",
    )
    assert split["split"] and split["arena_bytes"] <= 36 * 1024 < plain["arena_bytes"]
    assert split["kernel_calls"] > plain["kernel_calls"]  # the tiles are kernels of their own
    report = run_cli_json(
        capsys, "measure", str(out_dir), "--device", "qemu-cortex-m7", "--log", str(tmp_path / "log.jsonl")
    )["memplan"]
    assert report["correct"] and report["arena_bytes"] == split["arena_bytes"] == _static_arena(out_dir)


def _build_with_limits(capsys, out_dir, sram: str, flash: str) -> tuple[int, str, str]:
    return run_cli(
        capsys,
        "build",
        "zoo:mcu_cnn",
        "--target",
        "cortex-m7",
        "--emit-c",
        str(out_dir),
        "--sram-limit",
        sram,
        "--flash-limit",
        flash,
    )


def test_limits_say_by_how_much_and_which_tensors(capsys, tmp_path):
    out_dir = tmp_path / "c"
    code, _, err = _build_with_limits(capsys, out_dir, "16K", "4K")
    model_c = ModelC.load(out_dir)
    assert code == 2 and err.count("\n") == 1
    sram_miss = model_c.arena_bytes + model_c.workspace_bytes - 16 * 1024
    assert f"SRAM misses the 16,384-byte limit by {sram_miss:,} bytes" in err
    assert f"flash misses the 4,096-byte limit by {model_c.weight_bytes - 4096:,} bytes" in err
    assert model_c.peak_tensors and all(name in err for name, _ in model_c.peak_tensors)
    assert sum(size for _, size in model_c.peak_tensors) <= model_c.peak_live_bytes <= model_c.arena_bytes
    code, out, _ = _build_with_limits(capsys, out_dir, "512K", "2M")
    assert code == 0 and "static arena" in out


def test_one_line_errors(capsys, tmp_path, monkeypatch):
    out_dir = tmp_path / "c"
    cases = [
        ("build", "zoo:mcu_cnn", "--target", "cortex-m7"),  # no --emit-c
        ("build", "zoo:mcu_cnn", "--target", "cortex-m7", "-o", str(tmp_path / "x.so"), "--emit-c", str(out_dir)),
        ("build", "zoo:mcu_cnn", "-o", str(tmp_path / "x.so"), "--sram-limit", "1M"),
        ("measure", str(tmp_path), "--device", "host"),  # no memplan_c.json
        ("measure", "zoo:mcu_cnn", "--device", "qemu-cortex-m7"),
    ]
    for argv in cases:
        log = ("--log", str(tmp_path / "l.jsonl")) if argv[0] == "measure" else ()
        code, _, err = run_cli(capsys, *argv, *log)
        assert code == 2 and err.count("\n") == 1, (argv, err)
    with pytest.raises(SystemExit) as exited:  # argparse rejects it before anything is built
        run_cli(
            capsys, "build", "zoo:mcu_cnn", "--target", "cortex-m7", "--emit-c", str(out_dir), "--sram-limit", "lots"
        )
    assert exited.value.code == 2 and "not a byte count" in capsys.readouterr().err
    run_cli_json(capsys, "build", "zoo:mlp?hidden=16", "--target", "cortex-m7", "--emit-c", str(out_dir))
    log = str(tmp_path / "l.jsonl")
    code, _, err = run_cli(capsys, "measure", str(out_dir), "--device", "qemu-cortex-m4", "--log", log)
    assert code == 2 and "written for cortex-m7" in err
    monkeypatch.setattr(shutil, "which", lambda tool: None)  # neither toolchain nor qemu
    code, _, err = run_cli(capsys, "measure", str(out_dir), "--device", "qemu-cortex-m7", "--log", log)
    assert code == 2 and err.count("\n") == 1 and "apt-get install gcc-arm-none-eabi" in err


@pytest.mark.mcu
@needs_arm
def test_mobilenet_v2_035_at_96_on_emulated_cortex_m7(capsys, tmp_path):
    out_dir = tmp_path / "mbv2"
    built = run_cli_json(
        capsys, "build", "zoo:mobilenet_v2?width=0.35&resolution=96", "--target", "cortex-m7", "--emit-c", str(out_dir)
    )
    report = run_cli_json(
        capsys, "measure", str(out_dir), "--device", "qemu-cortex-m7", "--log", str(tmp_path / "log.jsonl")
    )["memplan"]
    assert report["correct"], report
    assert report["arena_bytes"] == built["arena_bytes"] < built["tvm_default_bytes"]
