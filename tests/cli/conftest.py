import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def _save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)


def residual_net(path, batch: int | str = 1, side: int = 16, concat: bool = True) -> str:
    """conv → relu → conv → add (residual) [→ concat] → pool → gemm on x[batch, 3, side, side]; a string
    ``batch`` is a dynamic dimension, as exporters write one."""
    rng = np.random.default_rng(0)

    def init(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    pooled = "cat" if concat else "a"
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["a"]),
        *([helper.make_node("Concat", ["a", "r1"], ["cat"], axis=1)] if concat else []),
        helper.make_node("GlobalAveragePool", [pooled], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    features = 16 if concat else 8
    graph = helper.make_graph(
        nodes,
        "residual_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        [
            init("w1", [8, 3, 3, 3]),
            init("b1", [8]),
            init("w2", [8, 8, 3, 3]),
            init("b2", [8]),
            init("wf", [10, features]),
            init("bf", [10]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return _save(model, path)


@pytest.fixture
def small_onnx(tmp_path) -> str:
    """A few planned tensors: :func:`residual_net` at batch 1."""
    return residual_net(tmp_path / "small.onnx")


@pytest.fixture
def unsupported_onnx(tmp_path) -> str:
    """A valid ONNX model whose only operator (Det) TVM's Relax frontend cannot import."""
    graph = helper.make_graph(
        [helper.make_node("Det", ["x"], ["y"])],
        "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    return _save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), tmp_path / "det.onnx"
    )
