"""Importing exporters' graphs: shapes computed at run time are folded when the inputs are static."""

from pathlib import Path

import numpy as np
import pytest

from tvm_memplan.frontend import computes_shapes, load_model, to_relax
from tvm_memplan.planner import plan_model
from tvm_memplan.verify import verify_plan

FIXTURES = Path(__file__).parent / "fixtures"


def test_torchscript_chunk_sizes_are_folded_and_the_unit_runs():
    """torchvision's ShuffleNetV2 unit through the TorchScript exporter: ``x.chunk(2)`` becomes
    Shape/Gather/Div/Slice, which TVM imports as shape computations it cannot legalize."""
    from tvm.relax.frontend.onnx import from_onnx

    model = load_model(str(FIXTURES / "torchvision_shufflenet_v2_unit.torchscript.onnx"))
    assert computes_shapes(from_onnx(model.onnx_model, keep_params_in_input=False))
    assert not computes_shapes(to_relax(model))
    result = verify_plan(plan_model(model, "llvm", order_seconds=1))  # against onnxruntime on the original file
    assert result.ok, result.problems


@pytest.mark.parametrize("spec", ["zoo:bert_tiny?resolution=16", "zoo:mcu_cnn"])
def test_graphs_that_do_not_fold_are_imported_as_they_are(spec):
    """bert_tiny keeps a shape computation after folding too: the importer's own graph is kept."""
    from tvm.relax.frontend.onnx import from_onnx

    model = load_model(spec)
    direct = from_onnx(model.onnx_model, keep_params_in_input=False)
    assert to_relax(model)["main"].script(show_meta=False) == direct["main"].script(show_meta=False)
    assert np.isfinite(plan_model(model, "llvm", order_seconds=1).total("arena_bytes"))


def _window_reshape(path: Path) -> str:
    """Swin's window partition as the TorchScript exporter writes it: a Reshape to a shape computed from the
    input's (``Shape -> Gather -> Div -> Concat``), then a Reshape with a -1 that needs the first one's shape, and an
    output whose first dimension the exporter left symbolic."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def ints(name, values):
        return numpy_helper.from_array(np.array(values, np.int64), name)

    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i2"], ["g"], axis=0),
        helper.make_node("Div", ["g", "two"], ["h"]),
        helper.make_node("Concat", ["lead", "h", "two"], ["c"], axis=0),
        helper.make_node("Reshape", ["x", "c"], ["r"]),
        helper.make_node("Reshape", ["r", "flat"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "window_reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 6])],
        [ints("i2", [2]), ints("two", [2]), ints("lead", [1, 4]), ints("flat", [-1, 6])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return str(path)


def test_a_graph_the_importer_refuses_is_imported_folded(tmp_path, capsys):
    """TVM's importer cannot import the window partition at all (its second Reshape needs the first one's shape);
    with static inputs the folded graph imports, without the importer's printout of the operator it failed on, and
    the output's size comes from it as well."""
    from tvm.relax.frontend.onnx import from_onnx

    from tvm_memplan.deploy.build import output_bytes

    model = load_model(_window_reshape(tmp_path / "window.onnx"))
    with pytest.raises(Exception, match="Reshape"):
        from_onnx(model.onnx_model, keep_params_in_input=False)
    capsys.readouterr()
    assert not computes_shapes(to_relax(model))
    assert "Error converting" not in capsys.readouterr().out
    assert output_bytes(model.onnx_model) == 4 * 6 * 4
    result = verify_plan(plan_model(model, "llvm", order_seconds=1))
    assert result.ok, result.problems
