"""The unseen-networks accuracy harness on tiny networks: data, ONNX export, single-logit scoring, the CLI path."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_memplan.lq import accuracy


def test_single_logit_is_a_binary_decision_and_several_logits_an_argmax():
    np.testing.assert_array_equal(accuracy.predict(np.array([[-0.5], [0.2], [3.0]])), [0, 1, 1])
    np.testing.assert_array_equal(accuracy.predict(np.array([[0.1, 0.9, 0.0], [2.0, -1.0, 1.0]])), [1, 0])


@pytest.mark.parametrize(
    "name,features,classes",
    [("digits8", 64, 10), ("digits28", 784, 10), ("breast_cancer", 30, 2), ("wine", 13, 3), ("iris", 4, 3)],
)
def test_datasets_split_and_scale(name, features, classes):
    data = accuracy.load_dataset(name)
    assert data.x_train.shape[1] == data.x_test.shape[1] == features and data.classes == classes
    assert len(data.x_test) > 0.25 * (len(data.x_train) + len(data.x_test))
    if name.startswith("digits"):
        assert data.x_train.min() >= 0.0 and data.x_train.max() <= 1.0
    else:  # standardized on the training rows
        np.testing.assert_allclose(data.x_train.mean(axis=0), 0.0, atol=1e-5)


@pytest.mark.parametrize("dataset,activation", [("breast_cancer", "relu"), ("iris", "tanh")])
def test_onnx_export_matches_scikit_learn(dataset, activation):
    data = accuracy.load_dataset(dataset)
    model = accuracy.train(accuracy.Network(dataset, (16, 8), activation), data, max_iter=50)
    graph = accuracy.to_onnx(model)
    assert [node.op_type for node in graph.graph.node] == [
        "Gemm",
        activation.title(),
        "Gemm",
        activation.title(),
        "Gemm",
    ]
    logits = accuracy.onnx_logits(graph, data.x_test)
    assert logits.shape == (len(data.x_test), 1 if dataset == "breast_cancer" else 3)
    np.testing.assert_array_equal(accuracy.predict(logits), model.predict(data.x_test))


@pytest.mark.slow
def test_evaluate_runs_the_default_quantize_command_on_a_binary_network(tmp_path):
    row = accuracy.evaluate(
        accuracy.Network("breast_cancer", (32, 32), "relu"), [(2, 2)], max_iter=100, cache_dir=tmp_path
    )
    assert row["outputs"] == 1 and row["test_rows"] == 171
    entry = row["settings"]["W2A2"]
    assert [layer["status"] for layer in entry["layers"]] == ["lq", "lq", "lq"]
    middle = entry["layers"][1]  # at the asked width unless the per-layer check widened it
    assert middle["wbits"] == 2 or "widened" in middle["reason"]
    assert entry["layers"][0]["wbits"] >= 4 and entry["layers"][-1]["wbits"] >= 4
    assert 0.5 < row["float"] and abs(entry["accuracy"] - row["float"]) < 0.1
    assert entry["size_ratio"] < 0.5
    assert list(tmp_path.glob("mlp_breast_cancer_32x32_relu_*.pkl")), "the trained model is cached"
    text = accuracy.markdown([row], [(2, 2)])
    assert "| breast_cancer 32-32 relu | 30→1 | 171 |" in text and "L0:W4A4" in text
