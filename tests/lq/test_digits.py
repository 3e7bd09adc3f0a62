"""The benchmark's data and model: real digits at 28x28, the MLP, its ONNX form, and the accuracy targets."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from tvm_memplan.lq import bench
from tvm_memplan.lq.digits import MLP, load_digits_28, mlp_to_onnx, train_mlp, upsample
from tvm_memplan.lq.timing import Timing


@pytest.fixture(scope="module")
def split():
    return load_digits_28()


def test_upsample_keeps_corners_and_range():
    image = np.arange(16, dtype=np.float64).reshape(1, 4, 4)
    big = upsample(image, 28)
    assert big.shape == (1, 28, 28)
    assert big[0, 0, 0] == 0 and big[0, -1, -1] == 15 and big[0, 0, -1] == 3
    assert big.min() >= 0 and big.max() <= 15


def test_split_is_real_and_held_out(split):
    assert split.x_train.shape[1] == 784 and split.x_test.shape == (540, 784)
    assert len(split.x_train) + len(split.x_test) == 1797
    assert 0.0 <= split.x_train.min() and split.x_train.max() <= 1.0
    assert set(np.unique(split.y_test)) == set(range(10))


def test_small_mlp_learns_and_exports_to_onnx(split, tmp_path):
    mlp = train_mlp(split, seed=1, epochs=4, hidden=32)
    accuracy = np.mean(mlp.logits(split.x_test).argmax(1) == split.y_test)
    assert accuracy > 0.85
    session = ort.InferenceSession(mlp_to_onnx(mlp).SerializeToString())
    probs = session.run(None, {"x": split.x_test[:5]})[0]
    np.testing.assert_allclose(probs.argmax(1), mlp.logits(split.x_test[:5]).argmax(1))
    mlp.save(tmp_path / "m.npz")
    np.testing.assert_array_equal(MLP.load(tmp_path / "m.npz").w2, mlp.w2)


@pytest.mark.slow
def test_accuracy_targets_on_the_benchmark_mlp(split, tmp_path_factory):
    """W2A2 within 1 point of fp32 and W1A1 within 5 on the 784→512→10 MLP, from the compiled TVM model."""
    mlp = bench.trained_mlp(split, seed=0, epochs=60, hidden=512, cache_dir=None)
    rows = bench.accuracy_rows(split, mlp, [(32, 32), (2, 2), (1, 1)], timing=Timing(1, 1, 1))
    accuracy = {(r["wbits"], r["abits"]): r["accuracy"] for r in rows}
    assert accuracy[32, 32] > 0.95
    assert accuracy[2, 2] >= accuracy[32, 32] - 0.010
    assert accuracy[1, 1] >= accuracy[32, 32] - 0.050
    size = {(r["wbits"], r["abits"]): r["size_bytes"] for r in rows}
    bases = 4 * (512 * 2 + 10 * 2 + 2 + 2)
    assert size[2, 2] <= 1.10 * (size[32, 32] * 2 / 32 + bases)
    bases = 4 * (512 + 10 + 1 + 1)
    assert size[1, 1] <= 1.10 * (size[32, 32] / 32 + bases)
