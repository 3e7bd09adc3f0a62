"""The int8 dot-product convolution (``conv2d_dot``), the dense layer built on it (``dense_dot``) and
their schedule, against integer arithmetic in numpy.

Shapes cover what the packing must get right: input channels not a multiple of 4, output channels
not a multiple of 16, strides, dilation, asymmetric padding, int8 and uint8 inputs. Each is built
with ``vpdpbusd`` where this CPU has AVX-512 VNNI, with AVX2's ``vpmaddwd`` (a Haswell target), and
with the portable vectorized fallback.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from tvm import te

from tvm_memplan.frontend import LoadedModel
from tvm_memplan.planner import plan_model
from tvm_memplan.quant import dot_kernels, kernels
from tvm_memplan.quant.reference import lsb_difference, output_scales, run_onnxruntime
from tvm_memplan.schedule import DefaultCPUSchedule
from tvm_memplan.schedule.cpu import Int8DotProduct, cpu_spec
from tvm_memplan.schedule.passes import schedule_function
from tvm_memplan.verify import run_vm

from ..quant import models

HOST = tvm.target.Target.from_device("cpu")
HASWELL = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})  # AVX2 without VNNI
ARM = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+dotprod"]})
VNNI, AVX2, SDOT = (dot_kernels.DOT_INSTRUCTIONS[name] for name in ("avx512vnni", "avx2", "neon-dotprod"))
# name: target, the spec's instruction (None: the portable fallback), the packing, its mnemonic
TARGETS = {
    "portable": (HOST, None, VNNI, None),
    "portable-signed": (HOST, None, SDOT, None),  # sdot's int8 packing, run here
}
if cpu_spec(HOST).int8_dot == "avx512vnni":
    TARGETS["vnni"] = (HOST, "avx512vnni", VNNI, "vpdpbusd")
if cpu_spec(HOST).int8_dot is not None:  # this CPU runs AVX2 code
    TARGETS["avx2"] = (HASWELL, "avx2", AVX2, "vpmaddwd")

SHAPES = {  # C, O, H, W, K, stride, dilation, padding (top, left, bottom, right)
    "3x3": (16, 32, 9, 9, 3, 1, 1, (1, 1, 1, 1)),
    "pointwise-odd-channels": (6, 20, 7, 5, 1, 1, 1, (0, 0, 0, 0)),
    "strided": (12, 16, 11, 11, 3, 2, 1, (1, 1, 1, 1)),
    "dilated-asymmetric": (8, 17, 10, 10, 3, 1, 2, (0, 1, 2, 1)),
    "prime-width": (8, 32, 3, 29, 1, 1, 1, (0, 0, 0, 0)),  # no pixel tile divides 29: one pixel a tile
}


def reference(x, w, bias, multiplier, stride, dilation, padding, zx, zy, low, high, out_dtype):
    """Integer conv of ``x - zx`` (padding with zx, a real zero), then MLAS's requantization in float32."""
    top, left, bottom, right = padding
    xp = np.pad(x.astype(np.int64) - zx, ((0, 0), (0, 0), (top, bottom), (left, right)))
    o, c, kh, kw = w.shape
    oh = (xp.shape[2] - (kh - 1) * dilation - 1) // stride + 1
    ow = (xp.shape[3] - (kw - 1) * dilation - 1) // stride + 1
    acc = np.zeros((1, o, oh, ow), np.int64)
    for ry in range(kh):
        for rx in range(kw):
            window = xp[
                :,
                :,
                ry * dilation : ry * dilation + stride * (oh - 1) + 1 : stride,
                rx * dilation : rx * dilation + stride * (ow - 1) + 1 : stride,
            ]
            acc += np.einsum("nchw,oc->nohw", window, w[:, :, ry, rx].astype(np.int64))
    total = (acc + bias.reshape(1, -1, 1, 1)).astype(np.int32).astype(np.float32)
    scaled = total * multiplier.reshape(1, -1, 1, 1)
    clamped = np.clip(scaled, np.float32(low - zy), np.float32(high - zy))
    return (np.rint(clamped).astype(np.int32) + zy).astype(out_dtype)


def run_dot_conv(
    target_name: str,
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray,
    multiplier: np.ndarray,
    zx: int,
    kernel=dot_kernels.conv2d_dot,
    **conv,
) -> tuple[np.ndarray, str]:
    """``kernel`` (``conv2d_dot`` or ``dense_dot``) built for ``TARGETS[target_name]`` and run here on
    ``x``: its output and assembly. ``bias`` is folded for the packing; ``conv`` holds the kernel's
    other keywords."""
    target, instruction, layout, _mnemonic = TARGETS[target_name]
    x_dtype = conv.get("quantize_input", (None, str(x.dtype)))[1]
    folded = kernels.fold_zero_point(bias, weight, dot_kernels.dot_zero_point(zx, x_dtype, layout.packed_dtype))
    packed = dot_kernels.pack_dot_weights(weight, layout.lanes, layout.depth)
    tensors = [
        te.placeholder(a.shape, str(a.dtype), n) for a, n in ((x, "x"), (packed, "w"), (folded, "b"), (multiplier, "m"))
    ]
    out = kernel(
        *tensors,
        out_channels=weight.shape[0],
        x_zero_point=zx,
        out_dtype="int8",
        packed_dtype=layout.packed_dtype,
        **conv,
    )
    spec = dataclasses.replace(cpu_spec(target), int8_dot=instruction)
    scheduled = schedule_function(te.create_prim_func([*tensors, out]), spec, rules=[Int8DotProduct()])
    assert scheduled is not None, f"the int8_dot rule must schedule {kernel.__name__}"
    library = tvm.tirx.build(tvm.IRModule({"main": scheduled[0]}), target=target)
    dev = tvm.cpu()
    result = tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], np.int8), dev)
    library["main"](*(tvm.runtime.tensor(v, dev) for v in (x, packed, folded, multiplier)), result)
    return result.numpy(), library.inspect_source("asm")


CASES = [(shape, "int8") for shape in SHAPES] + [("strided", "uint8")]


@pytest.mark.parametrize("target_name", list(TARGETS))
@pytest.mark.parametrize(("shape", "x_dtype"), CASES)
def test_dot_conv_equals_integer_arithmetic(shape, x_dtype, target_name):
    c, o, h, w, k, stride, dilation, padding = SHAPES[shape]
    rng = np.random.default_rng(len(shape) + c)
    lo, hi = kernels.INT_RANGE[x_dtype]
    x = rng.integers(lo, hi + 1, size=(1, c, h, w)).astype(x_dtype)
    weight = rng.integers(-128, 128, size=(o, c, k, k)).astype(np.int8)
    bias = rng.integers(-5000, 5000, size=o).astype(np.int32)
    multiplier = (rng.random(o) * 2e-4).astype(np.float32)
    zx, zy, low, high = 7, -3, -128, 100  # a folded Clip narrows the output range
    result, assembly = run_dot_conv(
        target_name,
        x,
        weight,
        bias,
        multiplier,
        zx,
        strides=[stride] * 2,
        padding=padding,
        dilation=[dilation] * 2,
        y_zero_point=zy,
        low=low,
        high=high,
    )
    mnemonic = TARGETS[target_name][3]
    assert mnemonic is None or mnemonic in assembly
    assert "vpdpbusd" not in assembly or target_name == "vnni"
    expected = reference(x, weight, bias, multiplier, stride, dilation, padding, zx, zy, low, high, np.int8)
    np.testing.assert_array_equal(result, expected)


def test_rule_declines_other_kernels():
    a = te.placeholder((4, 8), "float32", "a")
    b = te.compute((4, 8), lambda i, j: a[i, j] * 2, name="double")
    assert Int8DotProduct().schedule(te.create_prim_func([a, b]), cpu_spec(HOST)) is None


def test_weights_pack_into_instruction_blocks():
    weight = np.arange(20 * 6 * 1 * 1).reshape(20, 6, 1, 1).astype(np.int8)
    packed = dot_kernels.pack_dot_weights(weight, 16, 4)
    assert packed.shape == (2, 2, 1, 1, 16, 4)
    assert packed[1, 1, 0, 0, 3, 1] == weight[19, 5, 0, 0]
    assert packed[1, 1, 0, 0, 4, 0] == 0 and packed[0, 1, 0, 0, 0, 2] == 0  # padded channels are zero
    assert dot_kernels.pack_dot_weights(weight, 8, 2)[2, 1, 0, 0, 3, 1] == weight[19, 3, 0, 0]


@pytest.mark.parametrize("target_name", list(TARGETS))
def test_dot_conv_quantizes_a_float_input_as_it_packs(target_name):
    """The network's first conv: a float32 input quantized in the packing stage (QuantizeLinear fused)."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((1, 3, 12, 12)) * 2).astype(np.float32)
    weight = rng.integers(-128, 128, size=(8, 3, 3, 3)).astype(np.int8)
    bias = rng.integers(-500, 500, size=8).astype(np.int32)
    multiplier = (rng.random(8) * 1e-3).astype(np.float32)
    scale, zx = 0.02, -4
    codes = np.clip(np.rint(x / np.float32(scale)), -128 - zx, 127 - zx).astype(np.int64) + zx
    result, _ = run_dot_conv(
        target_name,
        x,
        weight,
        bias,
        multiplier,
        zx,
        strides=[2, 2],
        padding=[1, 1, 1, 1],
        dilation=[1, 1],
        y_zero_point=0,
        low=0,
        high=127,
        quantize_input=(scale, "int8"),
    )
    expected = reference(codes, weight, bias, multiplier, 2, 1, (1, 1, 1, 1), zx, 0, 0, 127, np.int8)
    np.testing.assert_array_equal(result, expected)


def test_sdot_kernel_compiles_to_sdot_for_arm():
    """Armv8.2 with the dot product: the block is tensorized with ``sdot`` (run on the emulated arm64
    device by the opt-in arm64 tests; the int8 packing it uses is checked here as "portable-signed")."""
    x = te.placeholder((1, 8, 6, 6), "uint8", "x")
    w = te.placeholder((2, 2, 3, 3, 4, 4), "int8", "w")
    b = te.placeholder((8,), "int32", "b")
    m = te.placeholder((8,), "float32", "m")
    out = dot_kernels.conv2d_dot(
        x,
        w,
        b,
        m,
        out_channels=8,
        strides=[1, 1],
        padding=[1, 1, 1, 1],
        dilation=[1, 1],
        x_zero_point=128,
        y_zero_point=0,
        low=-128,
        high=127,
        out_dtype="int8",
        packed_dtype="int8",
    )
    assert cpu_spec(ARM).int8_dot == "neon-dotprod"
    scheduled = schedule_function(te.create_prim_func([x, w, b, m, out]), cpu_spec(ARM), rules=[Int8DotProduct()])
    assembly = tvm.tirx.build(tvm.IRModule({"main": scheduled[0]}), target=ARM).inspect_source("asm")
    assert "sdot" in assembly


@pytest.mark.parametrize("target_name", list(TARGETS))
def test_dense_dot_equals_integer_arithmetic(target_name):
    """Rows of a 2-d input as the pixels of a 1x1 convolution: K not a multiple of 4, N not one of 16."""
    rng = np.random.default_rng(11)
    m, k, n = 3, 10, 20
    x = rng.integers(-128, 128, size=(m, k)).astype(np.int8)
    weight = rng.integers(-128, 128, size=(n, k, 1, 1)).astype(np.int8)
    bias = rng.integers(-5000, 5000, size=n).astype(np.int32)
    multiplier = (rng.random(n) * 2e-4).astype(np.float32)
    zx = 9
    result, _ = run_dot_conv(
        target_name, x, weight, bias, multiplier, zx, dot_kernels.dense_dot, y_zero_point=4, low=-128, high=127
    )
    image = x.T.reshape(1, k, m, 1)
    expected = reference(image, weight, bias, multiplier, 1, 1, (0, 0, 0, 0), zx, 4, -128, 127, np.int8)
    np.testing.assert_array_equal(result, expected.reshape(n, m).T)


@pytest.mark.parametrize(
    ("qmodel", "kernel", "rule"),
    [
        (models.quantize_qdq(models.conv(groups=8)), "qdepthwise", "int8_depthwise"),
        (models.quantize_qdq(models.gemm(m=3, k=18)), "qdense", "int8_dot"),
        (models.quantize_qdq(models.gemm(matmul=True), activation="uint8"), "qdense", "int8_dot"),
    ],
    ids=["depthwise", "gemm", "matmul-uint8"],
)
def test_pipeline_puts_the_kernels_on_integer_vectors(qmodel, kernel, rule):
    """Lowered and built for AVX2 (a CPU with a dot-product instruction), depthwise convolutions
    and dense layers (also one fused with the network output's dequantize) take the integer rules,
    and the build matches onnxruntime bit for bit (these kernels requantize as MLAS does)."""
    loaded = LoadedModel("integer", qmodel)
    plan = plan_model(loaded, HASWELL, order="program", time_budget=1)
    reports = []
    with plan.target:
        DefaultCPUSchedule(plan.target, reports.append)(plan.planned)
    assert [applied for name, applied in reports[0].rules.items() if kernel in name] == [rule]
    inputs = loaded.random_inputs(3)
    ours, _ = run_vm(plan.build(), inputs)
    assert lsb_difference(ours[0], run_onnxruntime(qmodel, inputs)[0], output_scales(qmodel)[0]) == 0
