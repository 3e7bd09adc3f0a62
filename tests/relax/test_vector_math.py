"""exp, sigmoid, SiLU, erf and softmax as vectorizable arithmetic: their accuracy, the kernels they leave (no exp
call in a SiLU epilogue, no erf call in a GELU one), and a squeeze-and-excitation block and a GELU feed-forward
layer that run as onnxruntime with the planned allocations."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import te

from tvm_memplan.frontend import load_model
from tvm_memplan.planner import plan_model
from tvm_memplan.relax.layout import channel_block
from tvm_memplan.relax.pipeline import schedule_passes
from tvm_memplan.relax.vector_math import VECTOR_MATH_LEGALIZE, vector_exp, vector_sigmoid
from tvm_memplan.schedule import DefaultCPUSchedule
from tvm_memplan.verify import verify_plan

HOST = tvm.target.Target.from_device("cpu")


def _vectorized_run(scalar, x: np.ndarray) -> np.ndarray:
    data = te.placeholder(x.shape, "float32")
    out = te.compute(x.shape, lambda i: scalar(data[i]))
    sch = tvm.s_tir.Schedule(te.create_prim_func([data, out]))
    (loop,) = sch.get_loops(sch.get_sblock(out.op.name))
    sch.vectorize(sch.split(loop, [None, 8])[1])
    library = tvm.tirx.build(sch.mod, target=HOST)
    result = tvm.runtime.tensor(np.zeros_like(x))
    library(tvm.runtime.tensor(x), result)
    return result.numpy()


def test_exp_and_sigmoid_are_within_an_ulp_or_two_of_float64() -> None:
    x = np.concatenate([np.linspace(-87, 88, 4000), np.linspace(-3, 3, 4000)]).astype("float32")
    exact = np.exp(x.astype("float64"))
    np.testing.assert_allclose(_vectorized_run(vector_exp, x), exact, rtol=2.5e-7, atol=0)
    np.testing.assert_allclose(_vectorized_run(vector_sigmoid, x), exact / (1 + exact), rtol=2.5e-7, atol=1e-38)
    # beyond the clamp: 0 and 1, never NaN or a negative
    ends = _vectorized_run(vector_sigmoid, np.array([-1e30, -200, 200, 1e30, np.inf, -np.inf] + [0] * 2, "float32"))
    np.testing.assert_allclose(ends[:6], [0, 0, 1, 1, 1, 0], atol=1e-37)


def _se_net(path) -> str:
    """A MobileNetV3/EfficientNet block: 1x1 expansion with SiLU, a depthwise conv with SiLU, squeeze and
    excitation (global pool, 1x1 reduce with SiLU, 1x1 expand, sigmoid, broadcast multiply), a 1x1
    projection with HardSwish and a residual add."""
    rng = np.random.default_rng(0)

    def init(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    convs = {"e": (32, 16, 1), "d": (32, 1, 3), "r": (8, 32, 1), "x": (32, 8, 1), "p": (16, 32, 1)}

    def silu(x, y):
        return [helper.make_node("Sigmoid", [x], [y + "_s"]), helper.make_node("Mul", [x, y + "_s"], [y])]

    nodes = [
        helper.make_node("Conv", ["x", "we", "be"], ["e"]),
        *silu("e", "ea"),
        helper.make_node("Conv", ["ea", "wd", "bd"], ["d"], pads=[1, 1, 1, 1], group=32),
        *silu("d", "da"),
        helper.make_node("GlobalAveragePool", ["da"], ["g"]),
        helper.make_node("Conv", ["g", "wr", "br"], ["r"]),
        *silu("r", "ra"),
        helper.make_node("Conv", ["ra", "wx", "bx"], ["s"]),
        helper.make_node("Sigmoid", ["s"], ["gate"]),
        helper.make_node("Mul", ["da", "gate"], ["se"]),
        helper.make_node("Conv", ["se", "wp", "bp"], ["p"]),
        helper.make_node("HardSwish", ["p"], ["ph"]),
        helper.make_node("Add", ["ph", "x"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "se_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 12, 12])],
        [init(f"w{name}", [o, i, k, k]) for name, (o, i, k) in convs.items()]
        + [init(f"b{name}", [o]) for name, (o, _, _) in convs.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return str(path)


@pytest.mark.parametrize("layout", ["nchw", "blocked"])
def test_silu_epilogues_are_vectorized_without_exp_calls(tmp_path, layout: str) -> None:
    if layout == "blocked" and channel_block(HOST) is None:
        pytest.skip("this CPU has no vectors of 8 or more float32 lanes")
    plan = plan_model(load_model(_se_net(tmp_path / "se.onnx")), HOST, layout=layout, order="program")
    reports = []
    passes = [DefaultCPUSchedule(plan.target, reports.append), *schedule_passes(plan.target, plan.options)[1:]]
    with plan.target:
        scheduled = tvm.transform.Sequential(passes)(plan.stock_staged)
    sigmoid_kernels = [gv.name_hint for gv in scheduled.get_global_vars() if "sigmoid" in gv.name_hint]
    assert len(sigmoid_kernels) >= 3  # expansion, depthwise and the excitation's reduction and gate
    convs = [name for name in sigmoid_kernels if "conv2d" in name and scheduled[name].params[0].shape[-1] > 1]
    assert convs and all(reports[0].rules[name] in ("blocked_conv", "tiled_reduction") for name in convs)
    for name in sigmoid_kernels:
        script = scheduled[name].script()
        assert "T.exp(" not in script and "T.sigmoid(" not in script, name
        assert name not in convs or "T.vectorized" in script, name


@pytest.mark.parametrize("layout", ["nchw", "blocked"])
def test_a_squeeze_excitation_block_runs_as_onnxruntime_with_the_planned_allocations(tmp_path, layout: str) -> None:
    plan = plan_model(load_model(_se_net(tmp_path / "se.onnx")), HOST, layout=layout, order="program")
    result = verify_plan(plan, stock=False, rtol=1e-4, atol=1e-5)
    assert result.problems == []
    assert result.trace_matches_plan


def test_erf_is_legalized_within_3e_7_of_float64_and_other_dtypes_keep_tvms() -> None:
    x = np.concatenate([np.linspace(-6, 6, 4001), [0.0, 1e-6, -1e-6, 30.0, -30.0]]).astype("float32")
    for dtype in ("float32", "float64"):
        builder = tvm.relax.BlockBuilder()
        data = tvm.relax.Var("x", tvm.relax.TensorType(x.shape, dtype))
        with builder.function("main", [data]):
            builder.emit_func_output(builder.emit(tvm.relax.op.erf(data)))
        legalized = tvm.relax.transform.LegalizeOps(VECTOR_MATH_LEGALIZE)(builder.get())
        script = legalized.script()
        assert ("T.erf(" in script) == (dtype == "float64"), dtype
        vm = tvm.relax.VirtualMachine(tvm.compile(legalized, HOST), tvm.cpu())
        result = vm["main"](tvm.runtime.tensor(x.astype(dtype))).numpy()
        exact = np.array([math.erf(v) for v in x.astype("float64")])
        np.testing.assert_allclose(result, exact, rtol=1e-6 if dtype == "float32" else 1e-12, atol=3e-7)


@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax_is_legalized_with_the_vector_exp_along_any_axis_and_other_dtypes_keep_tvms(axis: int) -> None:
    x = (np.random.default_rng(0).standard_normal((2, 5, 48)) * 20).astype("float32")
    for dtype in ("float32", "float64"):
        builder = tvm.relax.BlockBuilder()
        data = tvm.relax.Var("x", tvm.relax.TensorType(x.shape, dtype))
        with builder.function("main", [data]):
            builder.emit_func_output(builder.emit(tvm.relax.op.nn.softmax(data, axis=axis)))
        legalized = tvm.relax.transform.LegalizeOps(VECTOR_MATH_LEGALIZE)(builder.get())
        assert ("T.exp(" in legalized.script()) == (dtype == "float64"), dtype
        vm = tvm.relax.VirtualMachine(tvm.compile(legalized, HOST), tvm.cpu())
        result = vm["main"](tvm.runtime.tensor(x.astype(dtype))).numpy()
        shifted = np.exp(x.astype("float64") - x.max(axis=axis, keepdims=True))
        np.testing.assert_allclose(result, shifted / shifted.sum(axis=axis, keepdims=True), rtol=1e-6, atol=1e-12)


def _gelu_net(path) -> str:
    """A transformer's feed-forward input as the transformers exporter writes it: MatMul, bias, then GELU
    decomposed into ``Div(sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5``."""
    rng = np.random.default_rng(0)
    consts = [
        numpy_helper.from_array((rng.standard_normal((32, 64)) * 0.3).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b"),
        *(numpy_helper.from_array(np.array(v, np.float32), n) for n, v in [("r2", 2**0.5), ("one", 1), ("half", 0.5)]),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["h"]),
        helper.make_node("Div", ["h", "r2"], ["s"]),
        helper.make_node("Erf", ["s"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["h", "e1"], ["g"]),
        helper.make_node("Mul", ["g", "half"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "gelu_ffn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 64])],
        consts,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return str(path)


def test_a_gelu_epilogue_is_vectorized_without_erf_calls_and_runs_as_onnxruntime(tmp_path) -> None:
    plan = plan_model(load_model(_gelu_net(tmp_path / "gelu.onnx")), HOST, order="program")
    reports = []
    passes = [DefaultCPUSchedule(plan.target, reports.append), *schedule_passes(plan.target, plan.options)[1:]]
    with plan.target:
        scheduled = tvm.transform.Sequential(passes)(plan.stock_staged)
    (kernel,) = [gv.name_hint for gv in scheduled.get_global_vars() if "erf" in gv.name_hint]
    assert "matmul" in kernel and reports[0].rules[kernel] == "tiled_reduction"
    script = scheduled[kernel].script()
    assert "T.erf(" not in script and "T.vectorized" in script
    result = verify_plan(plan, stock=False, rtol=1e-4, atol=1e-5)
    assert result.problems == []
    assert result.trace_matches_plan
