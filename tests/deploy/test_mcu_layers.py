"""The whole-layer int8 C kernels of :mod:`tvm_memplan.deploy.mcu_layers_c`, code for code against
integer arithmetic in numpy (MLAS's requantization), and within 1 LSB of it when built for the fixed-point
requantization (``TVM_MEMPLAN_FIXED_POINT``): each kernel compiled alone with this machine's C
compiler (the portable intrinsics), and a MobileNetV2 block on the emulated Cortex-M7 (SMLAD, SXTB16,
VCVTR or SMMLAR, SSAT) and on this machine, against onnxruntime.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tvm_memplan.deploy.emit_c import emit_c
from tvm_memplan.deploy.mcu_layers_c import LAYER_KERNELS
from tvm_memplan.deploy.standalone import measure_c
from tvm_memplan.quant import dot_kernels
from tvm_memplan.quant.mcu_kernels import DEPTHWISE_KERNEL, POINTWISE_KERNEL, WINDOW_KERNEL, fits_fixed_point

from ..quant import models
from ..schedule.test_int8_dot import reference

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="arm-none-eabi-gcc or qemu-system-arm missing (.ci/run installs them)",
)


def _array(name: str, values: np.ndarray) -> str:
    ctype = {"int8": "int8_t", "int32": "int32_t", "float32": "float"}[str(values.dtype)]
    body = ", ".join(f"{v!r}f" if ctype == "float" else str(int(v)) for v in values.ravel().tolist())
    return f"static {ctype} {name}[{max(values.size, 1)}] = {{{body or 0}}};\n"


def run_kernel(
    tmp_path: Path, arrays: dict[str, np.ndarray], out_size: int, call: str, fixed: bool = False
) -> np.ndarray:
    """``call`` (C, on the ``arrays`` and ``y``) compiled with the kernels on this machine (``fixed``: with
    ``TVM_MEMPLAN_FIXED_POINT``); ``y``'s bytes."""
    source = LAYER_KERNELS + "#include <stdio.h>\n" + "".join(_array(n, a) for n, a in arrays.items())
    source += f"static int8_t y[{out_size}];\nint main(void) {{\n  {call};\n  fwrite(y, 1, {out_size}, stdout);\n"
    source += "  return 0;\n}\n"
    (tmp_path / "kernel.c").write_text(source)
    binary = tmp_path / "kernel"
    define = ["-DTVM_MEMPLAN_FIXED_POINT=1"] if fixed else []
    subprocess.run(["cc", "-O2", *define, "-o", str(binary), str(tmp_path / "kernel.c"), "-lm"], check=True)
    output = subprocess.run([str(binary)], capture_output=True, check=True).stdout
    return np.frombuffer(output, np.int8).astype(np.int32)


def _fma(a: np.ndarray, b: float, c: np.ndarray | float) -> np.ndarray:
    """C's ``fmaf`` for int8 ``a``: the product and the sum are exact in float64 here, then one rounding."""
    return (a.astype(np.float64) * np.float64(np.float32(b)) + np.asarray(c, np.float32).astype(np.float64)).astype(
        np.float32
    )


def add_codes(a, b, ratio_a, ratio_b, constant, low, high) -> np.ndarray:
    """MLAS's QLinearAdd of two code arrays (:func:`tvm_memplan.quant.kernels.add_codes`)."""
    value = _fma(a, ratio_a, _fma(b, ratio_b, np.float32(constant)))
    return np.clip(np.rint(value), low, high).astype(np.int32)


def assert_codes(got: np.ndarray, expected: np.ndarray, fixed: bool) -> None:
    """The exact requantization gives MLAS's codes; the fixed-point one each within 1 LSB of them."""
    if fixed:
        assert np.abs(got - expected).max(initial=0) <= 1
    else:
        assert np.array_equal(got, expected)


def _operands(rng, cout: int, depth: int, x_shape: tuple[int, ...], zx: int):
    x = rng.integers(-128, 128, size=x_shape).astype(np.int8)
    w = rng.integers(-128, 128, size=(cout, depth)).astype(np.int8)
    bias = rng.integers(-3000, 3000, size=cout).astype(np.int32)
    multiplier = (rng.uniform(0.5, 2.0, size=cout) / max(depth, 1) / 40).astype(np.float32)
    folded = (bias.astype(np.int64) - zx * w.astype(np.int64).sum(axis=1)).astype(np.int32)
    return x, w, bias, multiplier, folded


@needs_cc
@pytest.mark.parametrize(
    "channels, size, kernel, stride, pad, low",
    [
        (3, 8, 3, 1, 1, -128),  # two outputs per word, two rows at once
        (2, 7, 3, 1, 1, -128),  # an odd width and height: the last output and the last row alone
        (3, 9, 3, 2, 1, -100),  # stride 2, a narrowed clamp (a folded Relu)
        (2, 6, 5, 1, 2, -128),  # the generic window
        (2, 5, 3, 2, 0, -128),  # no padding, an odd input
        (1, 48, 3, 1, 1, -128),  # a plane larger than MAX_PLANE: the ring of window rows
        (1, 47, 3, 2, 1, -128),  # the ring at stride 2
    ],
)
@pytest.mark.parametrize("fixed", [False, True])
def test_depthwise_kernel_equals_integer_arithmetic(tmp_path, channels, size, kernel, stride, pad, low, fixed):
    rng = np.random.default_rng(channels * 100 + size)
    zx, zy = 5, -128
    x, w, bias, multiplier, folded = _operands(rng, channels, kernel * kernel, (1, channels, size, size), zx)
    weight = w.reshape(channels, 1, kernel, kernel)
    expected = np.concatenate(
        [
            reference(
                x[:, c : c + 1],
                weight[c : c + 1],
                bias[c : c + 1],
                multiplier[c : c + 1],
                stride,
                1,
                [pad] * 4,
                zx,
                zy,
                low,
                127,
                "int8",
            )  # fmt: skip
            for c in range(channels)
        ],
        axis=1,
    )
    oh = expected.shape[2]
    call = (
        f"{DEPTHWISE_KERNEL}(x, w, b, m, y, {channels}, {channels}, {size}, {size}, {oh}, {oh}, {kernel}, {kernel}, "
        f"{stride}, {stride}, {pad}, {pad}, {zx}, {zy}, {low}, 127, 1, {oh * oh})"
    )
    got = run_kernel(tmp_path, {"x": x, "w": weight, "b": folded, "m": multiplier}, expected.size, call, fixed)
    assert_codes(got, expected.astype(np.int32).ravel(), fixed)


@needs_cc
@pytest.mark.parametrize(
    "cin, cout, pixels, residual, gap",
    [
        (8, 6, 13, False, 0),
        (6, 5, 9, True, 5),
        (24, 10, 70, True, 0),
        (24, 10, 70, True, 30),
        (200, 4, 3, False, 0),
        (300, 6, 9, True, 0),  # one tile, the weights unpacked; the odd pixel's steps alone
        (300, 6, 23, True, 0),  # tiles of 10 pixels (8 KiB with the unpacked weights), unpacked per tile
        (42, 10, 1, False, 0),
    ],
)
@pytest.mark.parametrize("fixed", [False, True])
def test_pointwise_kernel_equals_integer_arithmetic(tmp_path, cin, cout, pixels, residual, gap, fixed):
    """Its paths: 5 to 8 input channels (1 channel x 4 pixels), one pixel (a dense), 2 channels x 2 pixels.
    With a ``gap``, the output planes are ``pixels + gap`` apart (a row tile written into its rows of the
    full tensor, ``y_plane``) while the residual's stay ``pixels`` apart. Fixed-point, the conv within 1 LSB
    and MLAS's add of its codes."""
    rng = np.random.default_rng(cin + cout + pixels)
    zx, zy = -7, 3
    x, w, bias, multiplier, folded = _operands(rng, cout, cin, (1, cin, 1, pixels), zx)
    expected = reference(x, w.reshape(cout, cin, 1, 1), bias, multiplier, 1, 1, [0] * 4, zx, zy, -128, 127, "int8")
    arrays = {"x": x, "w": dot_kernels.pack_dot_weights(w.reshape(cout, cin, 1, 1), 4, 4), "b": folded, "m": multiplier}
    add = {"ratio_a": 0.75, "ratio_b": 0.5, "constant": -3.25, "low": -128, "high": 127}
    conv = expected.astype(np.int32).reshape(cout, pixels)
    call = (
        f"{POINTWISE_KERNEL}(x, w, b, m, {'r' if residual else 'y'}, y, {cin}, {cout}, {pixels}, {zy}, -128, 127, "
        f"{int(residual)}, 1, {add['ratio_a']}f, {add['ratio_b']}f, {add['constant']}f, -128, 127, 1, {pixels + gap})"
    )
    if residual:  # MLAS's QLinearAdd of the conv's codes (first) and the residual's
        arrays["r"] = rng.integers(-128, 128, size=(1, cout, 1, pixels)).astype(np.int8)
    got = run_kernel(tmp_path, arrays, cout * (pixels + gap), call, fixed).reshape(cout, pixels + gap)
    assert not got[:, pixels:].any()  # the gap is not written
    got = got[:, :pixels]
    if not residual:
        assert_codes(got, conv, fixed)
        return
    other = arrays["r"].astype(np.int32).reshape(cout, pixels)
    if not fixed:
        assert np.array_equal(got, add_codes(conv, other, **add))
        return
    nearest = np.min(  # the add (exact) of a conv code within 1 LSB of MLAS's
        [np.abs(got - add_codes(np.clip(conv + d, -128, 127), other, **add)) for d in (-1, 0, 1)], axis=0
    )  # fmt: skip
    assert not nearest.any()


def test_fixed_point_takes_multipliers_from_2_to_the_minus_16_to_one_half():
    assert fits_fixed_point(np.array([2.0**-16, 0.01, 0.499], np.float32))
    assert not fits_fixed_point(np.array([0.01, 0.5], np.float32))  # one SMMLAR by m * 2^32 needs m < 0.5
    assert not fits_fixed_point(np.array([0.01, 2.0**-17], np.float32))
    assert not fits_fixed_point(np.array([], np.float32))


@needs_cc
def test_a_layer_whose_multipliers_do_not_fit_keeps_the_exact_requantization(tmp_path):
    """Built with ``TVM_MEMPLAN_FIXED_POINT``, a call with ``fixed_point`` 0 gives MLAS's codes exactly, and one
    with 1 the fixed-point ones: a multiplier of 1/4 puts many outputs on a tie, which MLAS rounds to even and
    ``SMMLAR`` up."""
    rng = np.random.default_rng(5)
    cin, cout, pixels, zx, zy = 24, 10, 70, 0, 3
    x = rng.integers(-3, 4, size=(1, cin, 1, pixels)).astype(np.int8)
    w = rng.integers(-3, 4, size=(cout, cin)).astype(np.int8)
    bias = rng.integers(-20, 20, size=cout).astype(np.int32)
    multiplier = np.full(cout, 0.25, np.float32)
    expected = reference(x, w.reshape(cout, cin, 1, 1), bias, multiplier, 1, 1, [0] * 4, zx, zy, -128, 127, "int8")
    arrays = {"x": x, "w": dot_kernels.pack_dot_weights(w.reshape(cout, cin, 1, 1), 4, 4), "b": bias, "m": multiplier}
    codes = {}
    for fixed_point in (0, 1):
        call = (
            f"{POINTWISE_KERNEL}(x, w, b, m, y, y, {cin}, {cout}, {pixels}, {zy}, -128, 127, 0, 1, 0.0f, 0.0f, 0.0f, "
            f"-128, 127, {fixed_point}, {pixels})"
        )
        codes[fixed_point] = run_kernel(tmp_path, arrays, cout * pixels, call, fixed=True)
    assert np.array_equal(codes[0], expected.astype(np.int32).ravel())
    assert not np.array_equal(codes[1], codes[0]) and np.abs(codes[1] - codes[0]).max() == 1


@needs_cc
@pytest.mark.parametrize("quantize, fixed", [(False, False), (True, False), (True, True)])
def test_window_kernel_equals_integer_arithmetic(tmp_path, quantize, fixed):
    """The stem: 3 input channels, 3x3, stride 2, 5 output channels; from int8 codes, or from the
    float network input quantized as MLAS does (divide, round half to even, saturate)."""
    rng = np.random.default_rng(int(quantize))
    cin, cout, size, zx, zy, scale = 3, 5, 11, 4, -128, 0.02
    x, w, bias, multiplier, folded = _operands(rng, cout, cin * 9, (1, cin, size, size), zx)
    real = (rng.standard_normal((1, cin, size, size)) * 1.5).astype(np.float32)
    if quantize:
        x = np.clip(np.rint(real / np.float32(scale)) + zx, -128, 127).astype(np.int8)
    weight = w.reshape(cout, cin, 3, 3)
    expected = reference(x, weight, bias, multiplier, 2, 1, [1] * 4, zx, zy, -128, 127, "int8")
    oh = expected.shape[2]
    call = (
        f"{WINDOW_KERNEL}({'xf' if quantize else 'x'}, w, b, m, y, {cin}, {size}, {size}, {cout}, {oh}, {oh}, 3, 3, "
        f"2, 2, 1, 1, {zx}, {zy}, -128, 127, {int(quantize)}, {scale}f, 1, {oh * oh})"
    )
    arrays = {"x": x, "xf": real, "w": weight, "b": folded, "m": multiplier}
    got = run_kernel(tmp_path, arrays, expected.size, call, fixed)
    assert_codes(got, expected.astype(np.int32).ravel(), fixed)


def inverted_residual(channels: int = 8, expand: int = 3, size: int = 10) -> onnx.ModelProto:
    """A MobileNetV2 block: 1x1 expand + Relu6, 3x3 depthwise + Relu6, 1x1 project, + the input."""
    rng = np.random.default_rng(1)
    hidden = channels * expand
    inits = {
        "we": rng.standard_normal((hidden, channels, 1, 1)) * 0.3,
        "be": rng.standard_normal(hidden) * 0.1,
        "wd": rng.standard_normal((hidden, 1, 3, 3)) * 0.3,
        "bd": rng.standard_normal(hidden) * 0.1,
        "wp": rng.standard_normal((channels, hidden, 1, 1)) * 0.2,
        "bp": rng.standard_normal(channels) * 0.1,
        "zero": np.float32(0.0),
        "six": np.float32(6.0),
    }
    nodes = [
        onnx.helper.make_node("Conv", ["x", "we", "be"], ["e"]),
        onnx.helper.make_node("Clip", ["e", "zero", "six"], ["er"]),
        onnx.helper.make_node("Conv", ["er", "wd", "bd"], ["d"], group=hidden, pads=[1] * 4),
        onnx.helper.make_node("Clip", ["d", "zero", "six"], ["dr"]),
        onnx.helper.make_node("Conv", ["dr", "wp", "bp"], ["p"]),
        onnx.helper.make_node("Add", ["p", "x"], ["y"]),
    ]
    shape = [1, channels, size, size]
    return models.float_model(nodes, inits, {"x": shape}, {"y": shape})


@needs_arm
@pytest.mark.slow
@pytest.mark.parametrize("requantize", ["exact", "fixed"])
def test_inverted_residual_block_on_the_emulated_m7_gives_onnxruntimes_codes(tmp_path, requantize):
    """Exact: onnxruntime's codes. Fixed-point (SMMLAR requantization): within onnxruntime's own spread
    between its optimized and unoptimized runs, as ``measure`` measured it on the same input (without the
    2-LSB floor of ``tolerance``)."""
    model = models.quantize_qdq(inverted_residual())
    path = tmp_path / "block.onnx"
    onnx.save(model, str(path))
    directory = tmp_path / "c"
    emit_c(str(path), directory, "cortex-m7", requantize=requantize, order_seconds=1)
    source = (directory / "kernels.c").read_text()
    assert f"{DEPTHWISE_KERNEL}(" in source
    assert ("#define TVM_MEMPLAN_FIXED_POINT 1" in source) == (requantize == "fixed")
    pointwise = re.findall(rf"{POINTWISE_KERNEL}\(\w+, \w+, \w+, \w+, (\w+), (\w+),", source)  # (residual, y)
    assert len(pointwise) == 2 and any(residual != y for residual, y in pointwise)  # the add fused into the project
    y_scale = next(
        float(numpy_helper.to_array(i)) for i in model.graph.initializer if i.name.startswith("y_scale")
    )  # fmt: skip
    for device in ("qemu-cortex-m7", "host"):
        result = measure_c(directory, device)
        assert result.correct and result.arena_bytes == result.planned_arena_bytes, (device, result)
        if requantize == "exact":
            assert result.max_abs_diff < 0.5 * y_scale, (device, result)  # onnxruntime's codes
        else:
            assert result.spread_lsb is not None and result.diff_lsb <= result.spread_lsb, (device, result)
    disassembly = subprocess.run(
        ["arm-none-eabi-objdump", "-d", str(directory / "model.elf")], capture_output=True, text=True, check=True
    ).stdout
    fixed = requantize == "fixed"
    assert ("smmlar" in disassembly) == fixed


def expand_stride_project(channels: int = 8, hidden: int = 24, out: int = 16, size: int = 10) -> onnx.ModelProto:
    """A 3x3 stem (the window kernel, which quantizes the float input), a 1x1 expansion of its 8 channels (the
    5-8-channel kernel, 100 pixels in one tile: blocks of 8 and one of 4 with the fixed-point requantization, else
    blocks of 4), a 3x3 depthwise at stride 2 (rows of 5), a 1x1 projection with no residual (the 2x2 blocks, 25
    pixels: an odd tail)."""
    rng = np.random.default_rng(2)
    inits = {
        "ws": rng.standard_normal((channels, 3, 3, 3)) * 0.3,
        "bs": rng.standard_normal(channels) * 0.1,
        "we": rng.standard_normal((hidden, channels, 1, 1)) * 0.3,
        "be": rng.standard_normal(hidden) * 0.1,
        "wd": rng.standard_normal((hidden, 1, 3, 3)) * 0.3,
        "bd": rng.standard_normal(hidden) * 0.1,
        "wp": rng.standard_normal((out, hidden, 1, 1)) * 0.2,
        "bp": rng.standard_normal(out) * 0.1,
        "zero": np.float32(0.0),
        "six": np.float32(6.0),
    }
    nodes = [
        onnx.helper.make_node("Conv", ["x", "ws", "bs"], ["s"], pads=[1] * 4),
        onnx.helper.make_node("Clip", ["s", "zero", "six"], ["sr"]),
        onnx.helper.make_node("Conv", ["sr", "we", "be"], ["e"]),
        onnx.helper.make_node("Clip", ["e", "zero", "six"], ["er"]),
        onnx.helper.make_node("Conv", ["er", "wd", "bd"], ["d"], group=hidden, pads=[1] * 4, strides=[2, 2]),
        onnx.helper.make_node("Clip", ["d", "zero", "six"], ["dr"]),
        onnx.helper.make_node("Conv", ["dr", "wp", "bp"], ["y"]),
    ]
    half = (size + 1) // 2
    return models.float_model(nodes, inits, {"x": [1, 3, size, size]}, {"y": [1, out, half, half]})


def _on_the_m7(tmp_path, model: onnx.ModelProto, requantize: str = "fixed") -> str:
    """``model`` built for the Cortex-M7 and run on the emulated core: exact, onnxruntime's codes; fixed-point,
    within onnxruntime's own spread between its optimized and unoptimized runs. The ELF's disassembly."""
    path = tmp_path / "net.onnx"
    onnx.save(model, str(path))
    directory = tmp_path / "c"
    emit_c(str(path), directory, "cortex-m7", requantize=requantize, order_seconds=1)
    result = measure_c(directory, "qemu-cortex-m7")
    assert result.correct, result
    if requantize == "exact":
        assert result.diff_lsb == 0, result
    else:
        assert result.spread_lsb is not None and result.diff_lsb <= result.spread_lsb, result
    return subprocess.run(
        ["arm-none-eabi-objdump", "-d", str(directory / "model.elf")], capture_output=True, text=True, check=True
    ).stdout


@needs_arm
@pytest.mark.slow
@pytest.mark.parametrize("requantize", ["exact", "fixed"])
def test_the_asm_blocks_of_the_smlad_kernels_give_onnxruntimes_codes_on_the_emulated_m7(tmp_path, requantize):
    """The kernels' inline-asm blocks (DSP only, so the host tests above do not run them): 8 pixels of 5-8 input
    channels to stored codes a loop step (fixed point: one LDM a pixel) or 4 to accumulators, a step of the 2x2
    pointwise block (one LDM of two pixels' pairs), the unpacking of a channel pair's weights (one STM a step), the
    packing of a tile's pixels (PKH, SXTB16, one STM a pixel pair, or one STRD a pixel for 5-8 channels), the stem's
    two pairs of taps (one LDM of both channels' weights), against onnxruntime's run of the same QDQ file (exact: its
    codes; fixed: within its own spread)."""
    disassembly = _on_the_m7(tmp_path, models.quantize_qdq(expand_stride_project()), requantize)
    fixed = requantize == "fixed"
    # the 8-pixel loop: per pixel one LDM of its four packed words, the code stored post-indexed
    assert (
        bool(re.search(r"ssat\s+r0, #8, r0\n[^\n]*strb(?:\.w)?\s+r0, \[\w+\], #1\n[^\n]*ldmia", disassembly)) == fixed
    )
    assert bool(re.search(r"ldrd\s+\w+, \w+, \[\w+\], #64", disassembly))  # the 4-pixel block
    assert ("smmlar" in disassembly) == fixed
    # the 2x2 step's pixels, the stem's weights (LDM), the unpacked weights (STM after four SXTB16)
    assert len(re.findall(r"ldmia(?:\.w)?\s+\w+!, \{r0, r1, r2, r3\}\n[^\n]*ldrd", disassembly)) >= 2
    assert re.search(r"sxtb16\s+r3, \w+, ror #8\n[^\n]*stmia(?:\.w)?\s+\w+!, \{r0, r1, r2, r3\}", disassembly)
    # the pointwise tile's 4x4 byte transpose: PKHTB, and four SXTB16 to one STM per pixel pair
    assert re.search(r"pkhtb\s+\w+, \w+, \w+, asr #16", disassembly)
    assert re.search(r"sxtb16\s+r3, \w+, ror #8\n[^\n]*stmia(?:\.w)?\s+\w+, \{r0, r1, r2, r3\}", disassembly)


@needs_arm
@pytest.mark.slow
@pytest.mark.parametrize("hidden", [48, 56, 64])
def test_the_2x2_blocks_steps_run_as_one_ldm_loop_on_the_emulated_m7(tmp_path, hidden):
    """A projection of 48, 56 or 64 channels (12 steps: 6 an iteration; 14: 7; 16: 8) runs its 2x2 blocks' steps in one
    asm loop (one LDM of the unpacked weights, one of the packed pixels, eight SMLAD a step), ended by the sentinel
    after the unpacked weights; the network gives onnxruntime's codes within its own spread (fixed point)."""
    model = models.quantize_qdq(expand_stride_project(hidden=hidden))
    disassembly = _on_the_m7(tmp_path, model)
    steps = len(re.findall(r"ldmia(?:\.w)?\s+\w+!, \{r8, r9, sl, fp\}", disassembly))
    assert steps >= {48: 6, 56: 7, 64: 8}[hidden], steps
    assert re.search(r"cmp(?:\.w)?\s+r0, #1073758208", disassembly)  # the sentinel 0x40004000


@needs_arm
@pytest.mark.slow
def test_a_projection_too_wide_to_unpack_builds_for_the_m7_and_gives_onnxruntimes_codes(tmp_path):
    """576 channels (144 steps, MobileNetV2-1.0's widest projection): too few pixels fit beside the unpacked weights,
    so the tile holds the packed steps alone and is not unpacked; unpacking it anyway overflowed the fixed-size buffer
    into a variable-length array, whose frame pointer (r7) the named-register asm loops need: GCC refused the file."""
    model = models.quantize_qdq(expand_stride_project(hidden=576, out=8, size=6))
    _on_the_m7(tmp_path, model)


@needs_arm
@pytest.mark.slow
def test_the_depthwise_ring_copies_16_bytes_by_ldm_and_stm_on_the_emulated_m7(tmp_path):
    """A 48x48 plane goes through the depthwise kernel's ring of window rows (larger than ``MAX_PLANE``): its rows
    of 48 bytes, word-aligned, are copied by one LDM and two STM per 16 bytes; the network gives onnxruntime's codes
    within its own spread (fixed point)."""
    model = models.quantize_qdq(expand_stride_project(size=48))
    disassembly = _on_the_m7(tmp_path, model)
    assert re.search(r"ldmia(?:\.w)?\s+\w+!, \{r0, r1, r2, r3\}\n[^\n]*stmia(?:\.w)?\s+\w+!, \{r0, r1, r2, r3\}\n"
                     r"[^\n]*stmia(?:\.w)?\s+\w+!, \{r0, r1, r2, r3\}", disassembly)  # fmt: skip
