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
