"""Int8 models as standalone C on the emulated Cortex-M7, and the firmware API: caller memory checked
by ``<name>_init``, the arena in a linker section of its own, two models taking turns on one arena."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tvm_memplan.deploy.emit_c import emit_c
from tvm_memplan.deploy.mcu import ModelC
from tvm_memplan.deploy.mcu_program import edge_quantization
from tvm_memplan.deploy.measure import int8_tolerances, reference_outputs
from tvm_memplan.deploy.standalone import qemu_command
from tvm_memplan.deploy.targets import CORTEX_M7
from tvm_memplan.frontend import load_model

from ..quant import models
from .conftest import run_cli, run_cli_json

needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="arm-none-eabi-gcc or qemu-system-arm missing (Debian: gcc-arm-none-eabi libnewlib-arm-none-eabi "
    "qemu-system-arm; .ci/run installs them)",
)


@pytest.fixture(scope="module")
def int8_c(tmp_path_factory):
    """The small MobileNet-like network quantized by onnxruntime (QDQ, int8, per channel) and written
    as Cortex-M7 C."""
    directory = tmp_path_factory.mktemp("int8_c")
    path = directory / "net.int8.onnx"
    onnx.save(models.quantize_qdq(models.network()), str(path))
    emit_c(str(path), directory / "c", "cortex-m7", order_seconds=2)
    return path, directory / "c"


def _arrays(source: str) -> dict[str, tuple[str, list[str]]]:
    """``name -> (C type, literals)`` of the const arrays in model_weights.c."""
    found = re.findall(r"const (\w+) (\w+)\[\d+\] __attribute__\(\(aligned\(64\)\)\) = \{([^}]*)\};", source)
    return {name: (ctype, [v.strip() for v in body.split(",")]) for ctype, name, body in found}


def test_int8_weights_are_int8_bytes_and_the_arena_holds_int8(int8_c):
    path, directory = int8_c
    arrays = _arrays((directory / "model_weights.c").read_text())
    types = {ctype for ctype, _ in arrays.values()}
    assert types == {"int8_t", "int32_t", "float"}  # weights, biases, per-channel requantization multipliers
    int8_bytes = sum(len(values) for ctype, values in arrays.values() if ctype == "int8_t")
    other_bytes = sum(4 * len(values) for ctype, values in arrays.values() if ctype != "int8_t")
    assert int8_bytes > 2 * other_bytes
    for ctype, values in arrays.values():
        if ctype == "int8_t":
            assert all(-128 <= int(v) <= 127 for v in values)  # integer literals, not text floats
    # every arena tensor a kernel reads or writes is 8-bit: (pointer, ndim, type code, bits, shape)
    arena_args = re.findall(r"MEMPLAN_TENSOR\(arena0[^,]*, \d+, (\d+), (\d+),", (directory / "model.c").read_text())
    assert arena_args and {bits for _, bits in arena_args} == {"8"}
    # the header states the input's QuantizeLinear and the output's DequantizeLinear
    model = onnx.load(str(path))
    consts = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    quantize = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    header = (directory / "model.h").read_text()
    scale = float(re.search(r"#define NET_INT8_INPUT0_SCALE (\S+)f", header).group(1))
    assert scale == pytest.approx(float(consts[quantize.input[1]]), rel=1e-7)
    assert f"#define NET_INT8_INPUT0_ZERO_POINT {int(consts[quantize.input[2]])}\n" in header
    assert (
        '#define NET_INT8_OUTPUT0_QUANT_DTYPE "int8"' in header and "#define NET_INT8_OUTPUT0_SHAPE {1, 10}" in header
    )


def test_build_reports_each_kernel_call(capsys, int8_c, tmp_path):
    """X-CUBE-AI's per-layer report: FLOPs, weight bytes, arena bytes live at each call. The live bytes,
    counted from the C program's pointers, peak where the planner's own intervals peak."""
    path, int8_dir = int8_c
    model_c = ModelC.load(int8_dir)
    steps = model_c.steps
    assert [s["kernel"] for s in steps] == model_c.kernel_names and len(steps) == model_c.kernel_calls
    assert max(s["live_arena_bytes"] for s in steps) == model_c.peak_live_bytes <= model_c.arena_bytes
    assert sum(s["weight_bytes"] for s in steps) == model_c.weight_bytes  # every weight read by one call here
    assert all(s["flops"] > 0 for s in steps if s["kernel"].startswith("qconv2d"))
    code, out, _ = run_cli(capsys, "build", str(path), "--target", "cortex-m7", "--emit-c", str(tmp_path / "c"))
    assert code == 0 and "per kernel call" in out and model_c.kernel_names[-1] in out


@pytest.mark.parametrize("activation", ["int8", "uint8"])
def test_edge_quantization_reads_the_input_quantize_and_the_output_dequantize(activation):
    model = models.quantize_qdq(models.conv(activation="relu"), activation=activation)
    consts = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    quantize = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    producer = {out: n for n in model.graph.node for out in n.output}[model.graph.output[0].name]
    (given,), (taken,) = edge_quantization(model)
    assert (given.scale, given.zero_point, given.dtype) == (
        pytest.approx(float(consts[quantize.input[1]])),
        int(consts[quantize.input[2]]),
        activation,
    )
    assert producer.op_type == "DequantizeLinear" and taken.zero_point == int(consts[producer.input[2]])
    assert edge_quantization(models.conv()) == ([None], [None])  # a float model


@needs_arm
@pytest.mark.slow
def test_int8_network_on_the_emulated_cortex_m7_agrees_with_onnxruntime(capsys, int8_c, tmp_path):
    _, directory = int8_c
    report = run_cli_json(
        capsys, "measure", str(directory), "--device", "qemu-cortex-m7", "--log", str(tmp_path / "log.jsonl")
    )["memplan"]
    assert report["correct"] and report["error"] is None, report
    assert report["reference"] == "onnxruntime" and report["tolerance"] is not None  # the int8 LSB rule
    assert report["arena_bytes"] == ModelC.load(directory).arena_bytes
    assert report["instructions"] > 0


@needs_arm
@pytest.mark.slow
def test_build_requantize_fixed_runs_within_onnxruntimes_spread(capsys, int8_c, tmp_path):
    """``build --requantize fixed``: the C kernels requantize with SMMLAR; ``measure`` reports the network's
    difference to onnxruntime and onnxruntime's own optimized-vs-unoptimized spread, both in LSB."""
    path, _ = int8_c
    directory = tmp_path / "c"
    code, _, err = run_cli(
        capsys, "build", str(path), "--target", "cortex-m7", "--emit-c", str(directory), "--requantize", "fixed"
    )
    assert code == 0, err
    assert "#define TVM_MEMPLAN_FIXED_POINT 1" in (directory / "kernels.c").read_text()
    report = run_cli_json(capsys, "measure", str(directory), "--device", "qemu-cortex-m7")["memplan"]
    assert report["correct"] and report["diff_lsb"] <= report["spread_lsb"], report
    code, _, err = run_cli(
        capsys, "build", str(path), "--target", "c", "-o", str(tmp_path / "x.so"), "--requantize", "fixed"
    )
    assert code != 0 and "--requantize" in err  # it shapes the standalone C only


def _firmware(directories, main_source: str, work, defines=()) -> subprocess.CompletedProcess:
    """Link the models in ``directories`` with ``main_source`` for the emulated M7 and run it in ``work``."""
    first = directories[0]
    (work / "firmware_main.c").write_text(main_source)
    sources = [
        str(d / f) for d in directories for f in ("model.c", "model_weights.c", "kernels.c", "tvm_memplan_runtime.c")
    ]
    sources += [str(first / "platform_semihost.c"), str(first / "startup_cortexm.c"), str(work / "firmware_main.c")]
    subprocess.run(
        [
            "arm-none-eabi-gcc",
            *CORTEX_M7.cpu_flags.split(),
            "-O2",
            "-ffunction-sections",
            "-fdata-sections",
            f"-I{first / 'include'}",
            f"-I{work}",
            "-nostartfiles",
            "--specs=nosys.specs",
            "-T",
            str(first / "cortex_m.ld"),
            "-Wl,--gc-sections",
            *defines,
            "-o",
            str(work / "firmware.elf"),
            *sources,
            "-lm",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return subprocess.run(
        qemu_command(CORTEX_M7.machine, "firmware.elf"),
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )


_TAKING_TURNS = """\
#include <stdint.h>
#include "platform.h"
#include "a/model.h"
#include "b/model.h"

#define LARGER(x, y) ((x) > (y) ? (x) : (y))
static uint8_t shared[LARGER(NET_INT8_ARENA_BYTES, MCU_CNN_ARENA_BYTES) + 8] __attribute__((aligned(8)));
static float in_a[NET_INT8_INPUT0_SIZE], out_a[NET_INT8_OUTPUT0_SIZE], again_a[NET_INT8_OUTPUT0_SIZE];
static float in_b[MCU_CNN_INPUT0_SIZE], out_b[MCU_CNN_OUTPUT0_SIZE];
static int32_t codes[10];

int main(void) {
  if (platform_read("a_input0.bin", in_a, sizeof(in_a))) return 100;
  if (platform_read("b_input0.bin", in_b, sizeof(in_b))) return 100;
  codes[0] = net_int8_init(shared, NET_INT8_ARENA_BYTES - 1);
  codes[1] = net_int8_run(in_a, out_a);  /* nothing bound after a failed init */
  codes[2] = net_int8_init(shared + 1, sizeof(shared) - 1);
  codes[3] = net_int8_init((void*)0, sizeof(shared));
  codes[4] = net_int8_init(shared, NET_INT8_ARENA_BYTES);
  codes[5] = net_int8_run(in_a, out_a);
  codes[6] = mcu_cnn_init(shared, sizeof(shared));  /* the second model overwrites the whole arena */
  codes[7] = mcu_cnn_run(in_b, out_b);
  codes[8] = net_int8_init(shared, sizeof(shared));
  codes[9] = net_int8_run(in_a, again_a);
  if (platform_write("codes.bin", codes, sizeof(codes)) || platform_write("a_output0.bin", out_a, sizeof(out_a)) ||
      platform_write("a_again.bin", again_a, sizeof(again_a)) || platform_write("b_output0.bin", out_b, sizeof(out_b)))
    return 101;
  return 0;
}
"""


def _inputs_and_reference(spec: str):
    model = load_model(spec)
    inputs = model.random_inputs(0)
    reference = reference_outputs(model, inputs)
    return model, inputs, reference


@needs_arm
@pytest.mark.slow
def test_two_models_take_turns_on_one_caller_arena_and_bad_arenas_get_error_codes(int8_c, tmp_path):
    path, int8_dir = int8_c
    work = tmp_path / "fw"
    work.mkdir()
    shutil.copytree(int8_dir, work / "a")
    emit_c("zoo:mcu_cnn", work / "b", "cortex-m7")
    (work / "platform.h").write_text((work / "a" / "platform.h").read_text())
    int8_model, int8_inputs, int8_reference = _inputs_and_reference(str(path))
    float_model, float_inputs, float_reference = _inputs_and_reference("zoo:mcu_cnn")
    next(iter(int8_inputs.values())).astype(np.float32).tofile(work / "a_input0.bin")
    next(iter(float_inputs.values())).astype(np.float32).tofile(work / "b_input0.bin")
    # neither model keeps a static arena: all tensor and scratch memory is the caller's buffer
    result = _firmware(
        [work / "a", work / "b"], _TAKING_TURNS, work, ["-DNET_INT8_NO_STATIC_ARENA", "-DMCU_CNN_NO_STATIC_ARENA"]
    )
    assert result.returncode == 0, result.stdout + result.stderr
    codes = np.fromfile(work / "codes.bin", dtype=np.int32).tolist()
    too_small, unbound, misaligned, null = -3, -1, -2, -1
    assert codes == [too_small, unbound, misaligned, null, 0, 0, 0, 0, 0, 0]
    symbols = subprocess.run(
        ["arm-none-eabi-nm", str(work / "firmware.elf")], capture_output=True, text=True, check=True
    ).stdout
    assert not re.search(r" (memplan_arena\d*|memplan_workspace)$", symbols, re.M)

    out_a = np.fromfile(work / "a_output0.bin", dtype=np.float32).reshape(int8_reference[0][0].shape)
    again_a = np.fromfile(work / "a_again.bin", dtype=np.float32).reshape(out_a.shape)
    out_b = np.fromfile(work / "b_output0.bin", dtype=np.float32).reshape(float_reference[0][0].shape)
    assert np.array_equal(out_a, again_a)  # nothing of the other model's run leaks into this one
    atol = int8_tolerances(int8_model, int8_inputs, int8_reference)[0]
    assert np.max(np.abs(out_a - int8_reference[0][0])) <= atol
    np.testing.assert_allclose(out_b, float_reference[0][0], rtol=1e-4, atol=1e-4)


@needs_arm
@pytest.mark.slow
def test_static_arena_in_a_section_of_its_own(capsys, int8_c, tmp_path, monkeypatch):
    _, int8_dir = int8_c
    directory = tmp_path / "c"
    shutil.copytree(int8_dir, directory)
    for built in directory.glob("*.elf"):
        built.unlink()
    monkeypatch.setenv("ARENA_SECTION", ".memplan_arena")  # the Makefile's variable, as `make ARENA_SECTION=...`
    report = run_cli_json(
        capsys, "measure", str(directory), "--device", "qemu-cortex-m7", "--log", str(tmp_path / "log.jsonl")
    )["memplan"]
    assert report["correct"], report
    table = subprocess.run(
        ["arm-none-eabi-objdump", "-t", str(directory / "model.elf")], capture_output=True, text=True, check=True
    ).stdout
    placed = {
        line.split()[-1]: line.split()[3]
        for line in table.splitlines()
        if line.split()[-1:] in (["memplan_arena"], ["memplan_workspace"])
    }
    assert placed == {"memplan_arena": ".memplan_arena", "memplan_workspace": ".memplan_arena"}
    assert report["sections"][".memplan_arena"] >= report["arena_bytes"] + report["workspace_bytes"]
    assert report["sram_bytes"] >= report["sections"][".memplan_arena"] + report["stack_bytes"]


@needs_arm
@pytest.mark.slow
def test_per_kernel_instructions_add_up_to_the_run(capsys, int8_c, tmp_path):
    _, int8_dir = int8_c
    report = run_cli_json(
        capsys,
        "measure",
        str(int8_dir),
        "--device",
        "qemu-cortex-m7",
        "--per-kernel",
        "--log",
        str(tmp_path / "log.jsonl"),
    )["memplan"]
    assert report["correct"], report
    kernels = report["kernels"]
    assert [k["kernel"] for k in kernels] == ModelC.load(int8_dir).kernel_names
    assert [k["step"] for k in kernels] == list(range(1, len(kernels) + 1))
    assert all(k["instructions"] > 0 for k in kernels)
    # the run is the kernels plus the argument packing between them
    assert 0.95 * report["instructions"] < sum(k["instructions"] for k in kernels) <= report["instructions"]


def test_per_kernel_needs_an_emulated_device(capsys, int8_c):
    _, int8_dir = int8_c
    code, _, err = run_cli(capsys, "measure", str(int8_dir), "--per-kernel")
    assert code == 2 and err.count("\n") == 1 and "emulated device" in err
