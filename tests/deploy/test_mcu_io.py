"""Inputs and outputs inside the arena (``build --emit-c --io-in-arena``, TFLite Micro's
``interpreter.input(i)``), integer inputs and outputs of a QDQ model (``--int8-io``) and kernels without
argument checks (``--no-kernel-checks``)."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest

from tvm_memplan.deploy.build import plan_for
from tvm_memplan.deploy.mcu_program import KernelCall, Storage, TensorRef, check_io_lifetimes, extract_program
from tvm_memplan.deploy.targets import get_target
from tvm_memplan.errors import UserError
from tvm_memplan.frontend import load_model
from tvm_memplan.quant.int8_io import with_int8_io
from tvm_memplan.quant.reference import run_onnxruntime
from tvm_memplan.relax.io_tensors import io_copies, with_io_tensors

from ..quant import models
from .conftest import run_cli_json

needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="arm-none-eabi-gcc or qemu-system-arm missing (.ci/run installs them)",
)


@pytest.fixture(scope="module")
def int8_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("mcuio") / "early.int8.onnx"
    onnx.save(models.quantize_qdq(models.early_activation()), str(path))
    return path


def _edge(model: onnx.ModelProto, op_type: str, tensor: str) -> tuple[float, int]:
    consts = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    node = next(n for n in model.graph.node if n.op_type == op_type and tensor in (n.input[0], n.output[0]))
    return float(consts[node.input[1]]), int(consts[node.input[2]])


def test_int8_io_graph_computes_the_qdq_graphs_codes(int8_model):
    """Fed the codes the QDQ graph's QuantizeLinear makes of a float input, the integer graph gives
    the codes its last DequantizeLinear reads."""
    model = onnx.load(str(int8_model))
    integer = with_int8_io(model)
    assert [i.type.tensor_type.elem_type for i in integer.graph.input] == [onnx.TensorProto.INT8]
    assert [o.type.tensor_type.elem_type for o in integer.graph.output] == [onnx.TensorProto.INT8]
    x = np.random.default_rng(0).standard_normal((1, 3, 24, 24)).astype(np.float32)
    x_scale, x_zero = _edge(model, "QuantizeLinear", "x")
    codes = np.clip(np.rint(x / np.float32(x_scale)) + x_zero, -128, 127).astype(np.int8)
    (real,) = run_onnxruntime(model, {"x": x})
    (got,) = run_onnxruntime(integer, {"x": codes})
    y_scale, y_zero = _edge(model, "DequantizeLinear", model.graph.output[0].name)
    np.testing.assert_array_equal((got.astype(np.float32) - y_zero) * np.float32(y_scale), real)
    with pytest.raises(UserError, match="not read by per-tensor QuantizeLinear"):
        with_int8_io(models.network())  # a float model


def test_the_input_in_the_arena_is_reused_after_its_last_reader(int8_model):
    plan = plan_for(load_model(str(int8_model)), get_target("cortex-m7"), prepare=with_io_tensors, order="program")
    roles = io_copies(plan.planned)
    assert sorted(roles.values()) == ["input0", "output0"]
    program = extract_program(plan.planned["main"], "m", roles)
    assert program.io_in_arena and not any(step.kernel in roles for step in program.steps)
    (x,), (y,) = program.inputs, program.outputs
    assert x.storage.kind == y.storage.kind == "arena" and x.name == "x" and x.dtype == "float32"
    reads = [i for i, s in enumerate(program.steps) if any(a.offset == x.offset and a.shape == x.shape for a in s.args)]
    after = [a for s in program.steps[reads[-1] + 1 :] for a in s.args if a.storage is x.storage]
    assert any(a.offset < x.offset + x.nbytes and x.offset < a.offset + a.nbytes for a in after)


def test_a_kernel_writing_an_inputs_bytes_before_its_copy_is_refused():
    arena = Storage("arena", "arena0")
    x = TensorRef(Storage("input", "in0"), 0, (1, 16), "float32", "x")
    placed = TensorRef(arena, 64, (1, 16), "float32", "alloc")
    clobber = TensorRef(arena, 96, (1, 8), "float32", "other")
    out = TensorRef(arena, 0, (1, 4), "float32", "y")
    ok = check_io_lifetimes({"input0": (placed, 0), "output0": (out, 1)}, [x], 1, [KernelCall("k", [])])
    assert ok[0][0].name == "x"
    with pytest.raises(UserError, match="input0 cannot live in the arena: early"):
        check_io_lifetimes({"input0": (placed, 1), "output0": (out, 1)}, [x], 1, [KernelCall("early", [clobber])])


@needs_arm
def test_io_in_arena_and_int8_io_on_the_emulated_m7(capsys, int8_model, tmp_path):
    directory = tmp_path / "c"
    built = run_cli_json(
        capsys, "build", str(int8_model), "--target", "cortex-m7", "--emit-c", str(directory), "--order-seconds", "1",
        "--io-in-arena", "--int8-io", "--no-kernel-checks",
    )  # fmt: skip
    assert built["io_in_arena"]
    header, harness = (directory / "model.h").read_text(), (directory / "main.c").read_text()
    assert "void* early_int8_input(int index);" in header and "int early_int8_run(void);" in header
    assert '#define EARLY_INT8_INPUT0_DTYPE "int8"' in header and "#define EARLY_INT8_INPUT0_ZERO_POINT" in header
    assert "static" not in harness.split("int main")[0].split("#ifdef MEMPLAN_PROFILE")[0]  # no buffers of its own
    assert "__tvm_assert_parts" not in (directory / "kernels.c").read_text()  # no argument checks, no messages
    measured = run_cli_json(capsys, "measure", str(directory), "--device", "qemu-cortex-m7")["memplan"]
    assert measured["correct"] and measured["max_abs_diff"] <= 1, measured  # within a code of onnxruntime's
    assert measured["arena_bytes"] == measured["planned_arena_bytes"] == built["arena_bytes"]
    # the arena holds the 1-byte input: SRAM is the arena, the scratch, the stack and little else
    assert measured["sram_bytes"] <= built["arena_bytes"] + built["workspace_bytes"] + measured["stack_bytes"] + 1024
