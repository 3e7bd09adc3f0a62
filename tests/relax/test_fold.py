"""The numpy folding of constant-only data movement gives the module TVM's FoldConstant gives."""

from __future__ import annotations

import numpy as np
import onnx
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from tvm_memplan.frontend import load_model, to_relax
from tvm_memplan.relax.fold import FOLDS, FoldDataMovementConstants
from tvm_memplan.relax.pipeline import stage_passes


def _conv_clip_gemm(path) -> str:
    """Conv with a bias (reshape), Clip (isnan + where of its bounds), Gemm with transB (permute_dims)."""
    rng = np.random.default_rng(0)

    def init(name, shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c", "lo", "hi"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_clip_gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        [
            init("w", [4, 3, 3, 3]),
            init("b", [4]),
            numpy_helper.from_array(np.array(0, np.float32), "lo"),
            numpy_helper.from_array(np.array(6, np.float32), "hi"),
            init("wf", [5, 64]),
            init("bf", [5]),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return str(path)


def _calls(mod: tvm.IRModule, constant_only: bool) -> list[str]:
    """The FOLDS ops main calls (with only constant operands, or all of them)."""
    return [
        binding.value.op.name
        for block in mod["main"].body.blocks
        for binding in block.bindings
        if isinstance(binding.value, relax.Call)
        and isinstance(binding.value.op, tvm.ir.Op)
        and binding.value.op.name in FOLDS
        and (
            not constant_only or all(isinstance(a, (tvm.ir.GenericConst, relax.ShapeExpr)) for a in binding.value.args)
        )
    ]


def test_the_frontends_constant_only_ops_fold_to_what_fold_constant_makes(tmp_path):
    imported = to_relax(load_model(_conv_clip_gemm(tmp_path / "m.onnx")))
    # the model has every fold but the layout transforms of packed weights (tests/relax/test_layout.py)
    assert sorted(set(_calls(imported, constant_only=False))) == sorted(set(FOLDS) - {"relax.layout_transform"})
    assert _calls(imported, constant_only=True)
    folded = FoldDataMovementConstants()(imported)
    assert _calls(folded, constant_only=True) == []
    assert _calls(folded, constant_only=False) == ["relax.reshape"]  # Flatten's, of the activation
    target = tvm.target.Target("llvm")
    passes = stage_passes(target).dataflow
    names = [p.info.name for p in passes]
    fold = names.index("tvm_memplan.FoldDataMovementConstants")
    # only the int8 lowering (nothing to do on a float model) comes before the numpy folding
    assert names[:fold] == ["tvm_memplan.LowerQDQ"]
    with target:  # the rest of the stage, TVM's passes, with and without the numpy folding first
        tvm.ir.assert_structural_equal(
            tvm.transform.Sequential(passes[fold + 1 :])(folded), tvm.transform.Sequential(passes[fold + 1 :])(imported)
        )
