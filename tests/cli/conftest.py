import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def _save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)


@pytest.fixture
def small_onnx(tmp_path) -> str:
    """conv → relu → conv → add (residual) → concat → pool → gemm: a few planned tensors."""
    rng = np.random.default_rng(0)

    def init(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["a"]),
        helper.make_node("Concat", ["a", "r1"], ["cat"], axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [init("w1", [8, 3, 3, 3]), init("b1", [8]), init("w2", [8, 8, 3, 3]), init("b2", [8]), init("wf", [10, 16]), init("bf", [10])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return _save(model, tmp_path / "small.onnx")


@pytest.fixture
def unsupported_onnx(tmp_path) -> str:
    """A valid ONNX model whose only operator (Det) TVM's Relax frontend cannot import."""
    graph = helper.make_graph(
        [helper.make_node("Det", ["x"], ["y"])],
        "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), tmp_path / "det.onnx")
