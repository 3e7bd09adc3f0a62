"""The BERT-tiny zoo model: published parameter count, MACs, onnxruntime and TVM agree."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tvm_memplan import zoo
from tvm_memplan.errors import UserError

ort = pytest.importorskip("onnxruntime")

# google/bert_uncased_L-2_H-128_A-2 (BertModel, with pooler): 4,385,920 parameters;
# one layer is 4 * (128*128 + 128) + 2*128 + (128*512 + 512) + (512*128 + 128) + 2*128 = 198,272.
BERT_TINY = 4_385_920
LAYER = 198_272


@pytest.mark.parametrize("num_classes,layers", [(2, 2), (10, 2), (2, 4)])
def test_parameter_count_is_bert_tiny_plus_head(num_classes, layers):
    model = zoo.build("bert_tiny", num_classes=num_classes, layers=layers)
    onnx.checker.check_model(model)
    expected = BERT_TINY + (layers - 2) * LAYER + 128 * num_classes + num_classes
    assert zoo.num_params(model) == expected
    props = {p.key: p.value for p in model.metadata_props}
    assert int(props["tvm_memplan.zoo.params"]) == expected
    assert zoo.num_params(zoo.build("bert_tiny")) == zoo._REGISTRY["bert_tiny"].published_params


def test_macs_at_128_tokens():
    s, h, ffn, layers = 128, 128, 512, 2
    per_layer = 4 * s * h * h + 2 * s * s * h + 2 * s * h * ffn  # QKVO, QK^T and PV, FFN
    assert zoo.num_macs(zoo.build("bert_tiny")) == layers * per_layer + h * h + h * 2


def test_sequence_input_and_limits():
    model = zoo.build("bert_tiny", resolution=40)
    assert zoo.input_shape(model) == (1, 40)
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT64
    with pytest.raises(UserError, match="512 positions"):
        zoo.build("bert_tiny", resolution=513)


def test_runs_in_onnxruntime_and_attention_mixes_tokens():
    model = zoo.build("bert_tiny", resolution=24)
    onnx.shape_inference.infer_shapes(model, strict_mode=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(0).integers(0, 30522, size=(1, 24)).astype(np.int64)
    y = sess.run(None, {"input_ids": ids})[0]
    assert y.shape == (1, 2) and np.isfinite(y).all()
    # the pooled first token depends on the last token through attention
    ids2 = ids.copy()
    ids2[0, -1] = (ids[0, -1] + 1) % 30522
    assert not np.allclose(sess.run(None, {"input_ids": ids2})[0], y)


@pytest.mark.slow
def test_tvm_plan_matches_onnxruntime_and_vm_requests_equal_plan():
    from tvm_memplan.frontend import LoadedModel
    from tvm_memplan.planner import plan_model
    from tvm_memplan.verify import verify_plan

    plan = plan_model(LoadedModel("bert_tiny", zoo.build("bert_tiny", resolution=16)))
    result = verify_plan(plan)
    assert result.ok, result.problems
    assert result.max_abs_diff_vs_onnxruntime is not None and result.max_abs_diff_vs_onnxruntime < 1e-4
