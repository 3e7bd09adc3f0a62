"""The Helium (MVE) pointwise/dense and depthwise kernels on the emulated Cortex-M55: compiled in, and the same codes as
the SMLAD kernels they replace, which equal onnxruntime's within the int8 rule."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import onnx

from tvm_memplan.deploy.emit_c import emit_c
from tvm_memplan.deploy.mcu_mve import MVE_DEPTHWISE_KERNEL, MVE_MARKER, MVE_POINTWISE_KERNEL, with_mve_kernels
from tvm_memplan.deploy.standalone import measure_c
from tvm_memplan.quant.mcu_kernels import DEPTHWISE_KERNEL, POINTWISE_KERNEL

from ..quant import models
from .conftest import needs_arm

NO_MVE = "-mcpu=cortex-m55+nomve -mthumb -mfloat-abi=hard"
"""The M55 with the DSP extension but without MVE: the SMLAD kernels, for comparison."""


def test_sources_without_a_pointwise_call_are_left_alone():
    assert with_mve_kernels("int32_t f(void) { return 0; }\n") == "int32_t f(void) { return 0; }\n"


@needs_arm
def test_helium_kernel_gives_the_smlad_kernels_codes_on_the_emulated_m55(tmp_path, monkeypatch):
    path = tmp_path / "net.int8.onnx"
    onnx.save(models.quantize_qdq(models.network()), str(path))  # 1x1 convolutions, a residual add, a Gemm
    helium = tmp_path / "helium"
    emit_c(str(path), helium, "cortex-m55", order_seconds=1)
    kernels_c = (helium / "kernels.c").read_text()
    assert MVE_MARKER in kernels_c and f"#define {POINTWISE_KERNEL} {MVE_POINTWISE_KERNEL}" in kernels_c
    assert f"#define {DEPTHWISE_KERNEL} {MVE_DEPTHWISE_KERNEL}" in kernels_c
    widths = re.findall(DEPTHWISE_KERNEL + r"\((?:\w+, ){10}(\d+), \d+, \d+, \d+, 1,", kernels_c)  # ow at stride 1
    assert any(int(width) >= 16 for width in widths)  # a depthwise the Helium kernel takes
    assembly = subprocess.run(
        ["arm-none-eabi-gcc", *NO_MVE.replace("+nomve", "").split(), "-O2", "-Iinclude", "-S", "-o", "-", "kernels.c"],
        cwd=helium,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "vmladava.s8" in assembly and "vctp.8" in assembly  # the MVE path is what the M55 compiles
    assert re.search(r"vmla\.[si]32", assembly)  # the depthwise's vector multiply-accumulate
    _same_codes_with_and_without_mve(helium, tmp_path / "smlad", monkeypatch)


def _same_codes_with_and_without_mve(helium, smlad, monkeypatch) -> None:
    """Runs the C in ``helium`` on the emulated M55 as it is and, copied to ``smlad``, built without MVE:
    both agree with onnxruntime, and their output files are equal byte for byte."""
    shutil.copytree(helium, smlad)
    with_mve = measure_c(helium, "qemu-cortex-m55")
    monkeypatch.setenv("CPU_FLAGS", NO_MVE)  # the Makefile's variable: the same C, built without MVE
    without = measure_c(smlad, "qemu-cortex-m55")
    assert with_mve.correct and without.correct, (with_mve.max_abs_diff, without.max_abs_diff)
    outputs = sorted(helium.glob("output*.bin"))
    assert outputs and with_mve.instructions != without.instructions  # two different programs, run
    for output in outputs:
        assert np.array_equal(np.fromfile(output, np.uint8), np.fromfile(smlad / output.name, np.uint8)), output.name


def _depthwise(channels: int, size: tuple[int, int], stride: int, pad: int) -> onnx.ModelProto:
    """A 1x1 convolution from 3 channels (so that the depthwise reads int8 codes), a 3x3 depthwise one, ReLU,
    and a 1x1 back to 3 channels."""
    rng = np.random.default_rng(1)
    inits = {
        "w0": rng.standard_normal((channels, 3, 1, 1)).astype(np.float32) * 0.3,
        "b0": np.zeros(channels, np.float32),
        "w": rng.standard_normal((channels, 1, 3, 3)).astype(np.float32) * 0.3,
        "b": rng.standard_normal(channels).astype(np.float32) * 0.1,
        "w2": rng.standard_normal((3, channels, 1, 1)).astype(np.float32) * 0.3,
        "b2": rng.standard_normal(3).astype(np.float32) * 0.1,
    }
    nodes = [
        onnx.helper.make_node("Conv", ["x", "w0", "b0"], ["c0"]),
        onnx.helper.make_node("Conv", ["c0", "w", "b"], ["c"], pads=[pad] * 4, group=channels, strides=[stride] * 2),
        onnx.helper.make_node("Relu", ["c"], ["r"]),
        onnx.helper.make_node("Conv", ["r", "w2", "b2"], ["y"]),
    ]
    oh, ow = ((d + 2 * pad - 3) // stride + 1 for d in size)
    return models.float_model(nodes, inits, {"x": [1, 3, *size]}, {"y": [1, 3, oh, ow]})


@needs_arm
def test_helium_depthwise_at_stride_2_on_odd_rows_gives_the_smlad_kernels_codes(tmp_path, monkeypatch):
    path = tmp_path / "dw.int8.onnx"
    onnx.save(models.quantize_qdq(_depthwise(12, (37, 41), 2, 1)), str(path))  # 19 x 21 outputs
    helium = tmp_path / "helium"
    emit_c(str(path), helium, "cortex-m55", order_seconds=1)
    assert re.search(DEPTHWISE_KERNEL + r"\((?:\w+, ){10}21, 3, 3, 2, 2,", (helium / "kernels.c").read_text())
    _same_codes_with_and_without_mve(helium, tmp_path / "smlad", monkeypatch)


@needs_arm
def test_helium_kernels_requantize_in_fixed_point_as_the_smlad_kernels_do(tmp_path, monkeypatch):
    """``--requantize fixed``: the vector VRMULH requantization gives SMMLAR's codes (1x1 and depthwise)."""
    path = tmp_path / "dw.int8.onnx"
    onnx.save(models.quantize_qdq(_depthwise(16, (20, 24), 1, 1)), str(path))
    helium = tmp_path / "helium"
    emit_c(str(path), helium, "cortex-m55", order_seconds=1, requantize="fixed")
    kernels_c = (helium / "kernels.c").read_text()
    assert "#define TVM_MEMPLAN_FIXED_POINT 1" in kernels_c and MVE_MARKER in kernels_c
    _same_codes_with_and_without_mve(helium, tmp_path / "smlad", monkeypatch)
