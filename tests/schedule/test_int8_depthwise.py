"""The integer depthwise convolution (``depthwise_conv2d``) and its schedule, against integer arithmetic in numpy.

Shapes cover what the polyphase stage and the flattened grid must get right: strides 1 and 2,
asymmetric padding, no padding, dilation, channel counts and widths no vector divides, int8 and
uint8 inputs. Each is built for this CPU and for AVX2 (a Haswell target); for Armv8.2 the test
checks the code (``smlal``: a widening 16 x 16 -> 32-bit multiply-accumulate).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from tvm import te

from tvm_memplan.quant import dot_kernels, kernels
from tvm_memplan.schedule.cpu import Int8Depthwise, cpu_spec
from tvm_memplan.schedule.passes import schedule_function

from .test_int8_dot import ARM, HASWELL, HOST, reference

AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
TARGETS = {"host": HOST}
if cpu_spec(HOST).int8_dot is not None:  # this CPU runs AVX2 code
    TARGETS["avx2"] = HASWELL

SHAPES = {  # C, H, W, K, stride, dilation, padding (top, left, bottom, right)
    "3x3": (7, 9, 11, 3, 1, 1, (1, 1, 1, 1)),
    "strided": (5, 11, 13, 3, 2, 1, (1, 1, 1, 1)),
    "strided-wide": (3, 6, 35, 3, 2, 1, (1, 1, 1, 1)),  # rows of 19 columns: de-interleaved 16 at a time
    "strided-asymmetric": (20, 10, 10, 3, 2, 1, (0, 0, 1, 1)),
    "5x5-strided": (3, 14, 9, 5, 2, 1, (2, 2, 2, 2)),
    "dilated": (4, 12, 12, 3, 1, 2, (2, 1, 0, 2)),
    "no-padding": (17, 6, 6, 3, 1, 1, (0, 0, 0, 0)),
    "stride-3": (4, 10, 11, 3, 3, 1, (1, 1, 1, 1)),
    "parallel": (24, 18, 18, 3, 1, 1, (1, 1, 1, 1)),  # enough work for parallel channel tasks
}


def build(target, x_shape, x_dtype, k, **conv) -> tuple[tvm.runtime.Module, list[int]]:
    """``depthwise_conv2d`` scheduled by its rule for ``target``: the library and the output shape."""
    c = x_shape[1]
    tensors = [
        te.placeholder(x_shape, x_dtype, "x"),
        te.placeholder((c, 1, k, k), "int8", "w"),
        te.placeholder((c,), "int32", "b"),
        te.placeholder((c,), "float32", "m"),
    ]
    out = dot_kernels.depthwise_conv2d(*tensors, out_dtype="int8", **conv)
    spec = dataclasses.replace(cpu_spec(target), threads=2)  # channels run in parallel where there is work enough
    scheduled = schedule_function(te.create_prim_func([*tensors, out]), spec, rules=[Int8Depthwise()])
    assert scheduled is not None, "the int8_depthwise rule must schedule depthwise_conv2d"
    return tvm.tirx.build(tvm.IRModule({"main": scheduled[0]}), target=target), [int(d) for d in out.shape]


@pytest.mark.parametrize("target_name", list(TARGETS))
@pytest.mark.parametrize(
    ("shape", "x_dtype"), [(shape, "int8") for shape in SHAPES] + [("strided", "uint8"), ("strided-wide", "uint8")]
)
def test_depthwise_equals_integer_arithmetic(shape, x_dtype, target_name):
    c, h, w, k, stride, dilation, padding = SHAPES[shape]
    rng = np.random.default_rng(c + h)
    lo, hi = kernels.INT_RANGE[x_dtype]
    x = rng.integers(lo, hi + 1, size=(1, c, h, w)).astype(x_dtype)
    weight = rng.integers(-128, 128, size=(c, 1, k, k)).astype(np.int8)  # -128 x 255 is the widest product
    weight[0, 0, 0, 0] = -128
    bias = rng.integers(-5000, 5000, size=c).astype(np.int32)
    multiplier = (rng.random(c) * 2e-4).astype(np.float32)
    zx, zy, low, high = (7 if x_dtype == "int8" else 130), -3, -128, 100  # a folded Clip narrows the range
    library, out_shape = build(
        TARGETS[target_name],
        x.shape,
        x_dtype,
        k,
        strides=[stride] * 2,
        padding=padding,
        dilation=[dilation] * 2,
        x_zero_point=zx,
        y_zero_point=zy,
        low=low,
        high=high,
    )
    dev = tvm.cpu()
    result = tvm.runtime.tensor(np.zeros(out_shape, np.int8), dev)
    folded = kernels.fold_zero_point(bias, weight, zx)
    library["main"](*(tvm.runtime.tensor(v, dev) for v in (x, weight, folded, multiplier)), result)
    full = np.zeros((c, c, k, k), np.int8)  # the depthwise weights as a regular conv's, zero off the diagonal
    full[np.arange(c), np.arange(c)] = weight[:, 0]
    expected = reference(x, full, bias, multiplier, stride, dilation, padding, zx, zy, low, high, np.int8)
    np.testing.assert_array_equal(result.numpy(), expected)


X86 = {"multiplies": ("vpmulld", "vpmaddwd", "vpmullw"), "bytewise": "vpinsrb", "deinterleave": ("vpshufb", "vperm")}
AARCH64 = {"multiplies": ("smlal",), "bytewise": "ld1\t{v0.b}[", "deinterleave": ("ld2", "uzp1")}


@pytest.mark.parametrize(
    ("target", "code"), [(AVX512, X86), (HASWELL, X86), (ARM, AARCH64)], ids=["avx512", "avx2", "arm"]
)
def test_depthwise_code_uses_integer_vectors(target, code):
    """Compiled only: the products are integer vector multiplies of widened bytes (no float ones),
    and the stride-2 stage splits rows into even and odd bytes with shuffles or ``ld2``, not byte
    by byte."""
    library, _ = build(
        target,
        (1, 24, 18, 34),
        "int8",
        3,
        strides=[2, 2],
        padding=[1, 1, 1, 1],
        dilation=[1, 1],
        x_zero_point=0,
        y_zero_point=0,
        low=-128,
        high=127,
    )
    assembly = library.inspect_source("asm")
    assert any(mnemonic in assembly for mnemonic in code["multiplies"])
    assert "vfmadd" not in assembly and "fmla" not in assembly
    assert any(mnemonic in assembly for mnemonic in code["deinterleave"])
    assert code["bytewise"] not in assembly


def test_rule_declines_the_generic_depthwise_kernel():
    """:func:`kernels.conv2d` with groups (what other targets lower depthwise convs to) is not its kernel."""
    x = te.placeholder((1, 8, 6, 6), "int8", "x")
    tensors = [x, te.placeholder((8, 1, 3, 3), "int8", "w"), te.placeholder((8,), "int32", "b")]
    tensors.append(te.placeholder((8,), "float32", "m"))
    out = kernels.conv2d(
        *tensors,
        strides=[1, 1],
        padding=[1, 1, 1, 1],
        dilation=[1, 1],
        groups=8,
        x_zero_point=0,
        y_zero_point=0,
        low=-128,
        high=127,
        out_dtype="int8",
    )
    assert Int8Depthwise().schedule(te.create_prim_func([*tensors, out]), cpu_spec(HOST)) is None


def _epilogues(shape: tuple[int, ...]) -> dict[str, tuple[dict, list]]:
    """The fusions LowerQDQ re-emits a kernel with: keywords and the extra placeholders they read."""
    table = te.placeholder((256,), "int8", "table")
    residual = te.placeholder(shape, "int8", "residual")
    add = {"ratio_a": 0.7, "ratio_b": 1.3, "constant": 2.0, "low": -128, "high": 127, "out_dtype": "int8"}
    return {
        "table": ({"table": table}, [table]),
        "residual-add": ({"residual": residual, "residual_add": {**add, "code_first": False}}, [residual]),
        "quantized-input": ({"quantize_input": (0.05, "int8")}, []),
    }


@pytest.mark.parametrize("fusion", ["table", "residual-add", "quantized-input"])
def test_depthwise_fusions_equal_the_generic_kernel(fusion):
    """With a consumer's table, a residual add or the network input's quantization fused, the
    integer kernel's output equals the generic ``conv2d`` kernel's (what other targets run) bit for bit."""
    c, h, w, out_shape = 6, 13, 11, (1, 6, 7, 5)
    rng = np.random.default_rng(5)
    x_dtype = "float32" if fusion == "quantized-input" else "int8"
    x = te.placeholder((1, c, h, w), x_dtype, "x")
    tensors = [x, te.placeholder((c, 1, 3, 3), "int8", "w"), te.placeholder((c,), "int32", "b")]
    tensors.append(te.placeholder((c,), "float32", "m"))
    keywords, extra = _epilogues(out_shape)[fusion]
    conv = {"strides": [2, 2], "padding": [1, 1, 1, 0], "dilation": [1, 1], "x_zero_point": -3}
    conv.update(y_zero_point=5, low=-128, high=127, out_dtype="int8", **keywords)
    values = [
        (rng.standard_normal((1, c, h, w)) * 3).astype(x_dtype)
        if fusion == "quantized-input"
        else rng.integers(-128, 128, (1, c, h, w)).astype(np.int8),
        rng.integers(-128, 128, (c, 1, 3, 3)).astype(np.int8),
        rng.integers(-3000, 3000, c).astype(np.int32),
        (rng.random(c) * 3e-3).astype(np.float32),
        *(rng.integers(-128, 128, [int(d) for d in t.shape]).astype(np.int8) for t in extra),
    ]
    outputs = []
    for kernel, extra_conv, rule in (
        (dot_kernels.depthwise_conv2d, {}, "int8_depthwise"),
        (kernels.conv2d, {"groups": c}, "tiled_reduction"),
    ):
        out = kernel(*tensors, **conv, **extra_conv)
        assert [int(d) for d in out.shape] == list(out_shape)
        scheduled, applied = schedule_function(te.create_prim_func([*tensors, *extra, out]), cpu_spec(HOST))
        assert applied == rule
        library = tvm.tirx.build(tvm.IRModule({"main": scheduled}), target=HOST)
        result = tvm.runtime.tensor(np.zeros(out_shape, np.int8))
        library["main"](*(tvm.runtime.tensor(v) for v in values), result)
        outputs.append(result.numpy())
    np.testing.assert_array_equal(*outputs)
