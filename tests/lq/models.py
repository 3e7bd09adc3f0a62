"""Small ONNX models for the LQ tests."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tvm_memplan.lq.quantizer import LQQuantizer


def mlp(
    sizes: tuple[int, ...] = (40, 24, 6), batch: int | str = 1, seed: int = 0, relu: bool = True
) -> onnx.ModelProto:
    """Gemm/activation stack: the shape every dense test needs (bias folding, {0,1} and ±1 inputs)."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    current = "x"
    for index, (n, o) in enumerate(pairwise(sizes)):
        w, b = f"w{index}", f"b{index}"
        inits += [
            numpy_helper.from_array((rng.normal(size=(n, o)) / np.sqrt(n)).astype(np.float32), w),
            numpy_helper.from_array((0.1 * rng.normal(size=o)).astype(np.float32), b),
        ]
        out = f"h{index}"
        nodes.append(helper.make_node("Gemm", [current, w, b], [out]))
        current = out
        if index < len(sizes) - 2:
            act = f"a{index}"
            nodes.append(helper.make_node("Relu" if relu else "Tanh", [current], [act]))
            current = act
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, sizes[0]])],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, [batch, sizes[-1]])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def two_input_matmul(n: int = 8) -> onnx.ModelProto:
    """x @ y with both operands inputs, then a constant Gemm: one layer the pass must leave in float."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.normal(size=(n, 4)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "y"], ["p"]), helper.make_node("MatMul", ["p", "w"], ["out"])]
    graph = helper.make_graph(
        nodes,
        "two",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, n]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [3, 4])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def convnet(batch: int = 2, seed: int = 0) -> onnx.ModelProto:
    """Conv(3→8, 3x3, pad 1) → Relu → Conv(8→6, 3x3, stride 2, pad 1) → Relu → Flatten → Gemm(96→5)."""
    rng = np.random.default_rng(seed)

    def init(name, shape, scale):
        return numpy_helper.from_array((scale * rng.normal(size=shape)).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "k1", "c1"], ["y1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["y1"], ["r1"]),
        helper.make_node("Conv", ["r1", "k2", "c2"], ["y2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["y2"], ["r2"]),
        helper.make_node("Flatten", ["r2"], ["f"]),
        helper.make_node("Gemm", ["f", "w", "b"], ["out"]),
    ]
    inits = [
        init("k1", (8, 3, 3, 3), 0.3),
        init("c1", (8,), 0.1),
        init("k2", (6, 8, 3, 3), 0.15),
        init("c2", (6,), 0.1),
        init("w", (96, 5), 0.1),
        init("b", (5,), 0.1),
    ]
    graph = helper.make_graph(
        nodes,
        "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [batch, 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def kernel_case(m, n, o, kx, kw, seed=0):
    """Random activations quantized by a random basis, random weight bits, integer-valued scales.

    Integer scales make the float epilogue exact, so the comparison can be exact too.
    """
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(m, n)).astype(np.float32)
    act = LQQuantizer(np.sort(rng.uniform(0.1, 1.0, (1, kx)), axis=1), "pm1")
    xbits = act.code_bits(x.reshape(1, -1)).reshape(kx, m, n)
    wbits = rng.integers(0, 2, (kw, o, n)).astype(np.uint8)
    ax = rng.integers(1, 5, kx).astype(np.float32)
    aw = rng.integers(-4, 5, (kw, o)).astype(np.float32)
    bias = rng.integers(-8, 9, o).astype(np.float32)
    return x, act, xbits, wbits, ax, aw, bias
