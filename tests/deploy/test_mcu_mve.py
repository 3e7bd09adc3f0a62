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
    widths = re.findall(DEPTHWISE_KERNEL + r"\((?:\w+, ){9}(\d+), \d+, \d+, \d+, 1,", kernels_c)  # ow at stride 1
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
    smlad = tmp_path / "smlad"
    shutil.copytree(helium, smlad)
    with_mve = measure_c(helium, "qemu-cortex-m55")
    monkeypatch.setenv("CPU_FLAGS", NO_MVE)  # the Makefile's variable: the same C, built without MVE
    without = measure_c(smlad, "qemu-cortex-m55")
    assert with_mve.correct and without.correct, (with_mve.max_abs_diff, without.max_abs_diff)
    outputs = sorted(helium.glob("output*.bin"))
    assert outputs and with_mve.instructions != without.instructions  # two different programs, run
    for output in outputs:
        assert np.array_equal(np.fromfile(output, np.uint8), np.fromfile(smlad / output.name, np.uint8)), output.name
