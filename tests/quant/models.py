"""Tiny float ONNX models and their QDQ versions made by onnxruntime's own ``quantize_static``."""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def float_model(
    nodes: list, inits: dict[str, np.ndarray], inputs: dict[str, list[int]], outputs: dict[str, list[int] | None]
) -> onnx.ModelProto:
    """A float32 opset-17 model from nodes, initializers and the static shapes of its inputs and outputs."""
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs.items()],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in outputs.items()],
        [numpy_helper.from_array(np.asarray(value, dtype=np.float32), name) for name, value in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.output}
    for value in model.graph.output:  # outputs given without a shape take the inferred one
        if not value.type.tensor_type.HasField("shape"):
            value.type.tensor_type.shape.CopyFrom(inferred[value.name].type.tensor_type.shape)
    onnx.checker.check_model(model)
    return model


def quantize_qdq(
    model: onnx.ModelProto, activation: str = "int8", per_channel: bool = True, seed: int = 0, samples: int = 8
) -> onnx.ModelProto:
    """``model`` quantized as a user would: onnxruntime's ``quantize_static``, QDQ format, int8
    weights (per channel), int8 or uint8 activations, MinMax calibration on normal random inputs."""
    import tempfile
    from pathlib import Path

    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    rng = np.random.default_rng(seed)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    batches = [
        {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()} for _ in range(samples)
    ]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(batches)

        def get_next(self):
            return next(self.batches, None)

    logging.getLogger().setLevel(logging.ERROR)  # the quantizer's "consider pre-processing" warnings
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "float.onnx", Path(tmp) / "int8.onnx"
        onnx.save(model, str(source))
        quantize_static(
            str(source),
            str(target),
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=per_channel,
            activation_type=QuantType.QInt8 if activation == "int8" else QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )
        return onnx.load(str(target))


def _rand(rng: np.random.Generator, *shape: int, scale: float = 0.3) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def conv(
    cin: int = 8,
    cout: int = 8,
    groups: int = 1,
    kernel: int = 3,
    stride: int = 1,
    pad: int = 1,
    size: int = 9,
    activation: str | None = None,
    seed: int = 0,
) -> onnx.ModelProto:
    """One Conv (regular, grouped or depthwise), optionally followed by Relu or Clip(0, 6)."""
    rng = np.random.default_rng(seed)
    inits = {"w": _rand(rng, cout, cin // groups, kernel, kernel), "b": _rand(rng, cout, scale=0.1)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4, strides=[stride] * 2, group=groups)]
    out = "c"
    if activation == "relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
        out = "y"
    elif activation == "clip":
        inits.update(lo=np.array(0.0), hi=np.array(6.0))
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
        out = "y"
    osize = (size + 2 * pad - kernel) // stride + 1
    return float_model(nodes, inits, {"x": [1, cin, size, size]}, {out: [1, cout, osize, osize]})


def gemm(m: int = 2, k: int = 16, n: int = 10, matmul: bool = False, seed: int = 0) -> onnx.ModelProto:
    """Gemm (weights transposed, with bias) or a bias-free MatMul."""
    rng = np.random.default_rng(seed)
    if matmul:
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
        inits = {"w": _rand(rng, k, n)}
    else:
        node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)
        inits = {"w": _rand(rng, n, k), "b": _rand(rng, n, scale=0.1)}
    return float_model([node], inits, {"x": [m, k]}, {"y": [m, n]})


def binary(op: str = "Add", shape: tuple[int, ...] = (1, 4, 5, 5)) -> onnx.ModelProto:
    """``op`` of two inputs of different ranges (so their scales differ)."""
    nodes = [helper.make_node("Mul", ["b", "half"], ["b2"]), helper.make_node(op, ["a", "b2"], ["y"])]
    return float_model(nodes, {"half": np.array(0.5)}, {"a": list(shape), "b": list(shape)}, {"y": list(shape)})


def unary(op: str, shape: tuple[int, ...] = (1, 4, 6, 6), **attrs) -> onnx.ModelProto:
    """One single-input op (pools, Sigmoid, HardSwish, Reshape by a constant shape, ...)."""
    return float_model([helper.make_node(op, ["x"], ["y"], **attrs)], {}, {"x": list(shape)}, {"y": None})


def network(seed: int = 0) -> onnx.ModelProto:
    """A small MobileNet-like network: stem conv + ReLU, depthwise conv + Clip, pointwise conv,
    residual Add, grouped conv, MaxPool, Concat, GlobalAveragePool, Flatten, Gemm."""
    rng = np.random.default_rng(seed)
    inits = {
        "w1": _rand(rng, 16, 3, 3, 3),
        "b1": _rand(rng, 16, scale=0.1),
        "w2": _rand(rng, 16, 1, 3, 3),
        "b2": _rand(rng, 16, scale=0.1),
        "w3": _rand(rng, 16, 16, 1, 1),
        "b3": _rand(rng, 16, scale=0.1),
        "w4": _rand(rng, 16, 4, 3, 3),
        "b4": _rand(rng, 16, scale=0.1),
        "wf": _rand(rng, 10, 32),
        "bf": _rand(rng, 10, scale=0.1),
        "lo": np.array(0.0),
        "hi": np.array(6.0),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4, strides=[2, 2]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1] * 4, group=16),
        helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"]),
        helper.make_node("Add", ["c3", "r1"], ["a"]),
        helper.make_node("Conv", ["a", "w4", "b4"], ["c4"], pads=[1] * 4, group=4),
        helper.make_node("MaxPool", ["c4"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("MaxPool", ["a"], ["pa"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Concat", ["p", "pa"], ["cat"], axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    return float_model(nodes, inits, {"x": [1, 3, 32, 32]}, {"y": [1, 10]})


def early_activation(seed: int = 0, size: int = 24) -> onnx.ModelProto:
    """A MobileNet-like stem whose first tensor is the largest (16 channels at full resolution):
    conv + ReLU, strided depthwise conv + Clip, pointwise conv, strided conv, GlobalAveragePool, Gemm."""
    rng = np.random.default_rng(seed)
    shapes = {"w1": (16, 3, 3, 3), "w2": (16, 1, 3, 3), "w3": (8, 16, 1, 1), "w4": (8, 8, 3, 3), "wf": (10, 8)}
    inits = {name: _rand(rng, *shape) for name, shape in shapes.items()}
    inits |= {f"b{name[1:]}": _rand(rng, shape[0], scale=0.1) for name, shape in shapes.items()}
    inits |= {"lo": np.array(0.0), "hi": np.array(6.0)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1] * 4, strides=[2, 2], group=16),
        helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"]),
        helper.make_node("Conv", ["c3", "w4", "b4"], ["c4"], pads=[1] * 4, strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["c4"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    return float_model(nodes, inits, {"x": [1, 3, size, size]}, {"y": [1, 10]})


def after_conv(op: str, size: int = 8, **attrs) -> onnx.ModelProto:
    """Conv(3→8) then ``op`` on its output, so the quantizer quantizes ``op``'s input (it leaves a
    data-movement op on a float graph input alone). Concat, Add and Mul take a second conv's output."""
    rng = np.random.default_rng(1)
    inits = {"w": _rand(rng, 8, 3, 3, 3), "b": _rand(rng, 8, scale=0.1), "w2": _rand(rng, 8, 3, 1, 1)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4)]
    inputs = ["c"]
    if op in ("Concat", "Add", "Mul"):
        nodes.append(helper.make_node("Conv", ["x", "w2"], ["c2"]))
        inputs.append("c2")
    if op == "Reshape":
        inits["shape"] = np.array([1, 8, size * size])
        inputs.append("shape")
    nodes.append(helper.make_node(op, inputs, ["y"], **attrs))
    model = float_model(nodes, inits, {"x": [1, 3, size, size]}, {"y": None})
    if op == "Reshape":  # the shape is an int64 initializer, not float
        shape = next(i for i in model.graph.initializer if i.name == "shape")
        shape.CopyFrom(numpy_helper.from_array(np.array([1, 8, size * size], dtype=np.int64), "shape"))
    return model


def qoperator(dynamic: bool = False) -> onnx.ModelProto:
    """The conv model in onnxruntime's QOperator format (QLinearConv) or dynamically quantized (ConvInteger)."""
    import tempfile
    from pathlib import Path

    from onnxruntime.quantization import QuantFormat, quantize_dynamic, quantize_static

    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "float.onnx", Path(tmp) / "q.onnx"
        onnx.save(conv(), str(source))
        if dynamic:
            quantize_dynamic(str(source), str(target), op_types_to_quantize=["Conv"])
        else:
            rng = np.random.default_rng(0)

            class Reader:
                def __init__(self) -> None:
                    self.batches = iter([{"x": rng.standard_normal((1, 8, 9, 9)).astype(np.float32)}])

                def get_next(self):
                    return next(self.batches, None)

            logging.getLogger().setLevel(logging.ERROR)
            quantize_static(str(source), str(target), Reader(), quant_format=QuantFormat.QOperator)
        return onnx.load(str(target))


def qdq_by_hand(
    zero_point: np.ndarray | None = None, elem_type: int = TensorProto.INT8, block_size: int = 0, opset: int = 21
) -> onnx.ModelProto:
    """x → QuantizeLinear → DequantizeLinear → Relu with the given zero-point type (float8, int4, ...)
    or blocked scales (``block_size``): the QDQ encodings tvm_memplan refuses."""
    shape = [4, 8]
    attrs = {}
    if block_size:
        attrs = {"axis": 1, "block_size": block_size}
        scale = np.full((4, 8 // block_size), 0.05, np.float32)
        zp = helper.make_tensor("zp", elem_type, scale.shape, np.zeros(scale.size, np.int32).tolist())
    else:
        scale = np.array(0.05, np.float32)
        zp = helper.make_tensor("zp", elem_type, [], [0])
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"], name="quant", **attrs),
        helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["d"], name="dequant", **attrs),
        helper.make_node("Relu", ["d"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(scale, "scale"), zp],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(model)
    return model


def between_convs(op: str) -> onnx.ModelProto:
    """Conv → ``op`` → Conv: an activation onnxruntime's quantizer leaves in float (HardSwish, Tanh)
    still sits between a DequantizeLinear and the next conv's QuantizeLinear."""
    rng = np.random.default_rng(2)
    inits = {
        "w": _rand(rng, 8, 3, 3, 3),
        "b": _rand(rng, 8, scale=0.1),
        "w2": _rand(rng, 4, 8, 1, 1),
        "b2": _rand(rng, 4, scale=0.1),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4),
        helper.make_node(op, ["c"], ["h"]),
        helper.make_node("Conv", ["h", "w2", "b2"], ["y"]),
    ]
    return float_model(nodes, inits, {"x": [1, 3, 8, 8]}, {"y": [1, 4, 8, 8]})


def torch_style_conv(seed: int = 0) -> onnx.ModelProto:
    """A QDQ conv as PyTorch's exporter writes it: float weights quantized in the graph
    (QuantizeLinear → DequantizeLinear, per channel) and a float bias."""
    rng = np.random.default_rng(seed)
    w = _rand(rng, 8, 4, 3, 3)
    w_scale = (np.abs(w).reshape(8, -1).max(axis=1) / 127).astype(np.float32)
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(w_scale, "w_scale"),
        numpy_helper.from_array(np.zeros(8, np.int8), "w_zp"),
        numpy_helper.from_array(_rand(rng, 8, scale=0.1), "b"),
        numpy_helper.from_array(np.array(0.02, np.float32), "x_scale"),
        numpy_helper.from_array(np.array(3, np.int8), "x_zp"),
        numpy_helper.from_array(np.array(0.05, np.float32), "y_scale"),
        numpy_helper.from_array(np.array(-5, np.int8), "y_zp"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xd"]),
        helper.make_node("QuantizeLinear", ["w", "w_scale", "w_zp"], ["wq"], axis=0),
        helper.make_node("DequantizeLinear", ["wq", "w_scale", "w_zp"], ["wd"], axis=0),
        helper.make_node("Conv", ["xd", "wd", "b"], ["c"], pads=[1] * 4),
        helper.make_node("QuantizeLinear", ["c", "y_scale", "y_zp"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "y_scale", "y_zp"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "torch_qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    return model


def with_classifier(model: onnx.ModelProto, classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    """``model`` (one NCHW output) with a classifier head, Flatten then Gemm to ``classes`` logits, so
    a top class is defined (the torchvision fixtures are stems). No pooling: an average over random
    inputs hardly varies, and the top class would be the same for every input."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    (output,) = graph.output
    features = int(np.prod([d.dim_value for d in output.type.tensor_type.shape.dim[1:]]))
    rng = np.random.default_rng(seed)
    graph.initializer.extend(
        [
            numpy_helper.from_array(_rand(rng, classes, features, scale=0.05), "head_w"),
            numpy_helper.from_array(_rand(rng, classes, scale=0.01), "head_b"),
        ]
    )
    graph.node.extend(
        [
            helper.make_node("Flatten", [output.name], ["head_flat"]),
            helper.make_node("Gemm", ["head_flat", "head_w", "head_b"], ["logits"], transB=1),
        ]
    )
    graph.output.pop()
    graph.output.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes]))
    onnx.checker.check_model(model)
    return model
