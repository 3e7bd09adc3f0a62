"""The Cortex-M int8 convolutions on SMLAD (``tvm_memplan_dot_4x4_smlad``), run on the emulated M7
and compared code for code with integer arithmetic in numpy and with onnxruntime's QLinearConv.

The shapes are the ones the packing must get right: input channels not a multiple of 4 (the last
step padded), output channels not a multiple of the 4 lanes, a stride, a 3x3 window, and one input
channel step (the stem's, which runs the whole-layer C kernel of :mod:`tvm_memplan.deploy.mcu_layers_c`,
as does the second, 1x1, conv). Even output widths of stride 1 run the kernel of two pixels a call,
the others one pixel a call. The portable C of the same kernels runs on this machine.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import onnx
import pytest
import tvm
from onnx import numpy_helper

from tvm_memplan.deploy.emit_c import emit_c
from tvm_memplan.deploy.mcu_dsp import with_micro_kernels
from tvm_memplan.deploy.standalone import measure_c
from tvm_memplan.quant.mcu_kernels import POINTWISE_KERNEL, WINDOW_KERNEL
from tvm_memplan.schedule.cpu import cpu_spec
from tvm_memplan.schedule.cpu.int8_smlad import SMLAD_MICRO_KERNELS

from ..quant import models
from ..schedule.test_int8_dot import reference

needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="arm-none-eabi-gcc or qemu-system-arm missing (.ci/run installs them)",
)

SHAPES = {  # cin, cout, kernel, stride, pad, size
    "pointwise-odd-channels": (6, 10, 1, 1, 0, 7),
    "pointwise-two-pixels": (10, 6, 1, 1, 0, 6),
    "3x3-two-pixels": (8, 4, 3, 1, 1, 8),
    "3x3-strided": (9, 12, 3, 2, 1, 9),
    "3x3-one-step": (3, 5, 3, 1, 1, 6),
}


def two_convs(cin: int, cout: int, kernel: int, stride: int, pad: int, size: int) -> onnx.ModelProto:
    """The conv under test, then a 1x1 conv to 3 channels: the first conv is a kernel of its own (the
    last one fuses the output's dequantize)."""
    rng = np.random.default_rng(0)
    inits = {
        "w": rng.standard_normal((cout, cin, kernel, kernel)).astype(np.float32) * 0.3,
        "b": rng.standard_normal(cout).astype(np.float32) * 0.1,
        "w2": rng.standard_normal((3, cout, 1, 1)).astype(np.float32) * 0.3,
        "b2": rng.standard_normal(3).astype(np.float32) * 0.1,
    }
    nodes = [
        onnx.helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4, strides=[stride] * 2),
        onnx.helper.make_node("Conv", ["c", "w2", "b2"], ["y"]),
    ]
    osize = (size + 2 * pad - kernel) // stride + 1
    return models.float_model(nodes, inits, {"x": [1, cin, size, size]}, {"y": [1, 3, osize, osize]})


def integer_reference(model: onnx.ModelProto, x: np.ndarray) -> tuple[np.ndarray, float, int]:
    """The output codes of a chain of QDQ convs on float input ``x`` (MLAS's QuantizeLinear, round half
    to even; each integer conv and MLAS's requantization: :func:`..schedule.test_int8_dot.reference`),
    and the output's scale and zero point."""
    constants = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    producers = {out: node for node in model.graph.node for out in node.output}

    def dequantized(name: str) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
        node = producers[name]
        return constants.get(node.input[0]), constants[node.input[1]], constants[node.input[2]]

    _, x_scale, x_zero = dequantized(next(n for n in model.graph.node if n.op_type == "Conv").input[0])
    codes = np.clip(np.rint(x / np.float32(x_scale)) + int(x_zero), -128, 127).astype(np.int8)
    for conv in (n for n in model.graph.node if n.op_type == "Conv"):
        _, x_scale, x_zero = dequantized(conv.input[0])
        w, w_scale, _ = dequantized(conv.input[1])
        b, _, _ = dequantized(conv.input[2])
        quantize = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and conv.output[0] in n.input)
        y_scale, y_zero = constants[quantize.input[1]], constants[quantize.input[2]]
        multiplier = (np.float32(x_scale) * w_scale.astype(np.float32)) / np.float32(y_scale)
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in conv.attribute}
        stride, pads = attrs.get("strides", [1])[0], attrs.get("pads", [0] * 4)
        codes = reference(codes, w, b, multiplier, stride, 1, pads, int(x_zero), int(y_zero), -128, 127, "int8")
    return codes, float(y_scale), int(y_zero)


@needs_arm
@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
def test_smlad_conv_on_the_emulated_m7_equals_integer_arithmetic(shape, tmp_path):
    cin, cout, kernel, stride, pad, size = SHAPES[shape]
    model = models.quantize_qdq(two_convs(cin, cout, kernel, stride, pad, size))
    path = tmp_path / "conv.onnx"
    onnx.save(model, str(path))
    directory = tmp_path / "c"
    emit_c(str(path), directory, "cortex-m7", order_seconds=1)
    # the conv under test quantizes the float input: TVM's kernel, on the micro-kernel where it has more than one
    # step of 4 channels, the window C kernel where it has one; the second conv is a C kernel of a whole layer
    on_smlad = cin > 4
    two_pixels = on_smlad and stride == 1 and (size + 2 * pad - kernel + 1) % 2 == 0
    source = (directory / "kernels.c").read_text()
    assert (f"{SMLAD_MICRO_KERNELS[2]}((" in source) == two_pixels
    assert (f"{SMLAD_MICRO_KERNELS[1]}((" in source) == (on_smlad and not two_pixels)
    called = set(re.findall(r"(tvm_memplan_\w+_s8)\(\w+, ", source))  # calls, not the definitions
    second = WINDOW_KERNEL if cout <= 4 else POINTWISE_KERNEL  # at most 4 input channels: the window kernel
    assert called == {second} | ({WINDOW_KERNEL} if cin <= 4 else set())
    assert ("fmaxf(" in source and "fminf(" in source) == on_smlad  # TVM's clamp on the M7's VMAXNM/VMINNM

    for device in ("qemu-cortex-m7", "host"):
        result = measure_c(directory, device)
        x = np.fromfile(directory / "input0.bin", np.float32).reshape(1, cin, size, size)
        out = np.fromfile(directory / "output0.bin", np.float32)
        assert np.abs(out).max() > 0
        expected, y_scale, y_zero = integer_reference(model, x)
        # the same codes as onnxruntime's QLinearConv (the float dequantization of the output may differ
        # in its last bit)
        assert result.correct and result.max_abs_diff < 0.5 * y_scale, (device, result)
        codes = np.rint(out / np.float32(y_scale)).astype(np.int32) + y_zero
        assert np.array_equal(codes, expected.astype(np.int32).reshape(-1)), device

    disassembly = subprocess.run(
        ["arm-none-eabi-objdump", "-d", str(directory / "model.elf")], capture_output=True, text=True, check=True
    ).stdout
    assert "smlad" in disassembly and "sxtb16" in disassembly
    assert "vcvtr.s32.f32" in disassembly and "ssat" in disassembly  # the C kernels' requantization
    assert ("vmaxnm.f32" in disassembly and "vminnm.f32" in disassembly) == on_smlad


def test_micro_kernel_replaces_tvms_declaration_and_nothing_else():
    one, two = SMLAD_MICRO_KERNELS[1], SMLAD_MICRO_KERNELS[2]
    declaration = "".join(
        f'#ifdef __cplusplus\nextern "C"\n#endif\nTVM_DLL int32_t {name}(void*, void*, int32_t);\n'
        for name in (one, two)
    )
    source = f'#include <math.h>\n{declaration}#ifdef __cplusplus\nextern "C"\n#endif\nTVM_DLL int32_t k(void);\n'
    rewritten = with_micro_kernels(source)
    assert f"TVM_DLL int32_t {one}" not in rewritten and f"TVM_DLL int32_t {two}" not in rewritten
    assert rewritten.count(f"int32_t {one}(") == 1 and rewritten.count(f"int32_t {two}(") == 1
    assert "__smlad(" in rewritten
    assert rewritten.index("static inline") < rewritten.index("TVM_DLL int32_t k(void);")
    plain = '#include <math.h>\n#ifdef __cplusplus\nextern "C"\n#endif\nTVM_DLL int32_t k(void);\n'
    assert with_micro_kernels(plain) == plain


@pytest.mark.parametrize(
    "mcpu, instruction, min_max",
    [
        ("cortex-m7", "dsp-smlad", True),
        ("cortex-m4", "dsp-smlad", False),
        ("cortex-m3", None, False),
        (None, None, False),
    ],
)
def test_cores_with_the_dsp_extension_lower_convolutions_for_smlad(mcpu, instruction, min_max):
    spec = cpu_spec(tvm.target.Target({"kind": "c", **({"mcpu": mcpu} if mcpu else {})}))
    assert (spec.int8_dot, spec.float_min_max) == (instruction, min_max)


@needs_arm
@pytest.mark.slow
def test_dense_of_one_row_runs_as_a_one_pixel_convolution_on_smlad(tmp_path):
    """A dense of 21 inputs (not a multiple of 4) to 10 outputs (not a multiple of the 4 lanes); its steps read the 4
    channels' weight words by one LDM."""
    model = models.quantize_qdq(models.gemm(m=1, k=21, n=10))
    path = tmp_path / "gemm.onnx"
    onnx.save(model, str(path))
    directory = tmp_path / "c"
    emit_c(str(path), directory, "cortex-m7", order_seconds=1)
    assert re.search(rf"{POINTWISE_KERNEL}\(\w+, ", (directory / "kernels.c").read_text())  # its one-pixel path
    result = measure_c(directory, "qemu-cortex-m7")
    y_scale = float(numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "y_scale")))
    assert result.correct and result.max_abs_diff < 0.5 * y_scale, result  # onnxruntime's codes
    disassembly = subprocess.run(
        ["arm-none-eabi-objdump", "-d", str(directory / "model.elf")], capture_output=True, text=True, check=True
    ).stdout
    assert re.search(r"ldmia(?:\.w)?\s+lr!, \{r0, r1, r2, r3\}", disassembly)  # a step's 4 weight words: one LDM
