"""Matmuls with constant weights read them in column panels: which matmuls are packed, the panels' bytes, and a
transformer-like block (prime token count, Gemm and MatMul weights, GELU) built as onnxruntime runs it."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import relax

from tvm_memplan.frontend import load_model
from tvm_memplan.planner import plan_model
from tvm_memplan.relax.layout import BlockedLayout, channel_block
from tvm_memplan.relax.matmul_layout import PACKED_MATMUL, panel_width
from tvm_memplan.verify import verify_plan

from .modules import save_graph, tensor

HOST = tvm.target.Target.from_device("cpu")


@pytest.mark.parametrize(
    "columns, lanes, width", [(3072, 16, 32), (48, 16, 16), (100, 16, None), (768, 8, 16), (12, 4, 4)]
)
def test_a_panel_is_two_vectors_wide_or_one_where_two_do_not_divide(columns, lanes, width) -> None:
    assert panel_width(columns, lanes) == width


W0 = np.random.default_rng(0).standard_normal((64, 96)).astype("float32")


def _matmuls(rows: int, shared: bool) -> tvm.IRModule:
    """``x [1, rows, 64] @ W0 [64, 96] + b``, then ``@ W1`` (W0 again where ``shared``), and a one-row product."""
    rng = np.random.default_rng(1)
    w0 = relax.const(W0)
    w1 = w0 if shared else relax.const(rng.standard_normal((64, 96)).astype("float32"))
    bias = relax.const(rng.standard_normal(96).astype("float32"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", tensor((1, rows, 64)))
    row = relax.Var("row", tensor((1, 64)))
    with bb.function("main", [x, row]):
        with bb.dataflow():
            a = bb.emit(relax.op.add(relax.op.matmul(x, w0), bias))
            b = bb.emit(relax.op.matmul(x, w1))
            c = bb.emit(relax.op.matmul(row, w0))
            out = bb.emit_output(relax.Tuple([a, b, c]))
        bb.emit_func_output(out)
    return bb.get()


def _packed_calls(mod: tvm.IRModule) -> list[relax.Call]:
    names = {gv for gv in mod.get_global_vars() if gv.name_hint.startswith(PACKED_MATMUL)}
    return [
        b.value
        for block in mod["main"].body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call) and len(b.value.args) > 0 and b.value.args[0] in names
    ]


def test_weights_are_packed_in_panels_and_a_matrix_vector_product_keeps_its_rows() -> None:
    mod = _matmuls(29, shared=False)
    with HOST:
        packed = BlockedLayout(16)(mod)
    calls = _packed_calls(packed)
    assert len(calls) == 2  # the one-row product stays a matmul, read row after row by its rule
    weights = [c.args[1].fields[1].value.numpy() for c in calls]
    assert weights[0].shape == (3, 64, 32)  # 96 columns in panels of two 16-lane vectors
    np.testing.assert_array_equal(weights[0][1, 5], W0[5, 32:64])


def test_a_weight_two_matmuls_read_is_packed_once() -> None:
    with HOST:
        calls = _packed_calls(BlockedLayout(16)(_matmuls(29, shared=True)))
    assert len(calls) == 2 and calls[0].args[1].fields[1].same_as(calls[1].args[1].fields[1])


def _transformer_block(path, tokens: int) -> str:
    """A feed-forward block as transformers exports it: Gemm-free MatMul + Add, GELU (Erf), MatMul + Add, residual;
    then a Gemm (transB) on the flattened tokens' first row as a classifier would read it."""
    rng = np.random.default_rng(0)

    def init(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["m0"]),
        helper.make_node("Add", ["m0", "b0"], ["a0"]),
        helper.make_node("Div", ["a0", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["a0", "e1"], ["g0"]),
        helper.make_node("Mul", ["g0", "half"], ["g"]),
        helper.make_node("MatMul", ["g", "w1"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["a1"]),
        helper.make_node("Add", ["a1", "x"], ["r"]),
        helper.make_node("Reshape", ["r", "flat"], ["f"]),
        helper.make_node("Gemm", ["f", "w2", "b2"], ["y"], transB=1),
    ]
    initializers = [init("w0", [32, 128]), init("b0", [128]), init("w1", [128, 32]), init("b1", [32])]
    initializers += [init("w2", [48, 32]), init("b2", [48])]
    initializers += [
        numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("sqrt2", 2**0.5), ("one", 1), ("half", 0.5))
    ]
    initializers.append(numpy_helper.from_array(np.array([tokens, 32], np.int64), "flat"))
    return save_graph(path, "ffn", nodes, ([1, tokens, 32], [tokens, 48]), initializers)


def test_a_transformer_block_with_a_prime_token_count_runs_packed_as_onnxruntime(tmp_path) -> None:
    block = channel_block(HOST)
    if block is None:
        pytest.skip("this CPU has no vectors of 8 or more float32 lanes")
    model = load_model(_transformer_block(tmp_path / "ffn.onnx", 29))
    plan = plan_model(model, HOST, layout="blocked", order="program")
    kernels = [gv.name_hint for gv, f in plan.planned.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    # all three products packed, each with its epilogue (bias, GELU, residual) in one kernel
    assert sum(name.startswith(f"fused_{PACKED_MATMUL}") for name in kernels) == 3, kernels
    result = verify_plan(plan, stock=False)
    assert result.problems == []  # onnxruntime's outputs; the VM's requests are the plan
    assert result.trace_matches_plan
