"""The benchmark's data and model: scikit-learn's handwritten digits at 28x28 and a 784→512→10 MLP.

The seed's table comes from a 2-layer Keras MLP (tanh hidden layer, softmax output) on MNIST;
MNIST does not install offline, so the 1797 real 8x8 digits that ship inside scikit-learn are
upsampled to MNIST's 28x28 and the same architecture is trained on them (needs scikit-learn for the data only).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import UserError

SIDE = 28
HIDDEN = 512
CLASSES = 10


@dataclass(frozen=True)
class DigitsSplit:
    """Train/test split; images flattened to (n, 784) float32 in [0, 1]."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def _sklearn() -> ModuleType:
    try:
        import sklearn.datasets
        import sklearn.model_selection
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise UserError("lq-bench needs scikit-learn (pip install scikit-learn)") from exc
    return sklearn


def upsample(images: np.ndarray, side: int = SIDE) -> np.ndarray:
    """(n, h, w) → (n, side, side) by bilinear interpolation with aligned corners."""
    n, h, w = images.shape
    rows = np.linspace(0, h - 1, side)
    cols = np.linspace(0, w - 1, side)
    r0 = np.floor(rows).astype(int).clip(0, h - 2)
    c0 = np.floor(cols).astype(int).clip(0, w - 2)
    fr = (rows - r0)[None, :, None]
    fc = (cols - c0)[None, None, :]
    top = images[:, r0][:, :, c0] * (1 - fc) + images[:, r0][:, :, c0 + 1] * fc
    bottom = images[:, r0 + 1][:, :, c0] * (1 - fc) + images[:, r0 + 1][:, :, c0 + 1] * fc
    return top * (1 - fr) + bottom * fr


def load_digits_28(test_size: float = 0.3, seed: int = 0) -> DigitsSplit:
    """scikit-learn's digits (values 0..16) upsampled to 28x28, scaled to [0, 1], stratified split."""
    sk = _sklearn()
    digits = sk.datasets.load_digits()
    images = upsample(digits.images.astype(np.float64) / 16.0).reshape(len(digits.images), -1)
    x_train, x_test, y_train, y_test = sk.model_selection.train_test_split(
        images.astype(np.float32), digits.target, test_size=test_size, random_state=seed, stratify=digits.target
    )
    return DigitsSplit(x_train, y_train.astype(np.int64), x_test, y_test.astype(np.int64))


@dataclass(frozen=True)
class MLP:
    """Weights of the 784→hidden→10 tanh MLP, stored (in, out) like ONNX Gemm with transB=0."""

    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray

    def save(self, path: Path) -> None:
        np.savez(path, w1=self.w1, b1=self.b1, w2=self.w2, b2=self.b2)

    @classmethod
    def load(cls, path: Path) -> MLP:
        with np.load(path) as data:
            return cls(data["w1"], data["b1"], data["w2"], data["b2"])

    def logits(self, x: np.ndarray) -> np.ndarray:
        return np.tanh(x @ self.w1 + self.b1) @ self.w2 + self.b2


def train_mlp(
    split: DigitsSplit, seed: int = 0, epochs: int = 60, hidden: int = HIDDEN, batch: int = 64, lr: float = 1e-3
) -> MLP:
    """Float32 numpy training: Glorot init, softmax cross-entropy, Adam, L2 1e-4 (deterministic).

    Written out instead of scikit-learn's MLPClassifier, which needs minutes in float64 on two cores.
    """
    rng = np.random.default_rng(seed)
    x, y = split.x_train, split.y_train
    sizes = [(x.shape[1], hidden), (hidden, CLASSES)]
    params: list[np.ndarray] = []
    for fan_in, fan_out in sizes:
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        params += [rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32), np.zeros(fan_out, np.float32)]
    moments = [(np.zeros_like(p), np.zeros_like(p)) for p in params]
    beta1, beta2, eps, l2 = 0.9, 0.999, 1e-8, 1e-4
    onehot = np.eye(CLASSES, dtype=np.float32)[y]
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), batch):
            idx = order[start : start + batch]
            w1, b1, w2, b2 = params
            hidden = np.tanh(x[idx] @ w1 + b1)
            logits = hidden @ w2 + b2
            probs = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs /= probs.sum(axis=1, keepdims=True)
            d_logits = (probs - onehot[idx]) / len(idx)
            d_hidden = (d_logits @ w2.T) * (1.0 - hidden * hidden)
            grads = [x[idx].T @ d_hidden + l2 * w1, d_hidden.sum(0), hidden.T @ d_logits + l2 * w2, d_logits.sum(0)]
            step += 1
            for p, g, (m, v) in zip(params, grads, moments, strict=True):
                m *= beta1
                m += (1 - beta1) * g
                v *= beta2
                v += (1 - beta2) * g * g
                p -= lr * (m / (1 - beta1**step)) / (np.sqrt(v / (1 - beta2**step)) + eps)
    return MLP(*params)


def mlp_to_onnx(mlp: MLP, batch: int | str = "N") -> onnx.ModelProto:
    """ONNX graph Gemm → Tanh → Gemm → Softmax, the quantizer thesis's Keras model in ONNX form."""
    inits = [
        numpy_helper.from_array(mlp.w1, "w1"),
        numpy_helper.from_array(mlp.b1, "b1"),
        numpy_helper.from_array(mlp.w2, "w2"),
        numpy_helper.from_array(mlp.b2, "b2"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="dense1"),
        helper.make_node("Tanh", ["h"], ["t"], name="tanh"),
        helper.make_node("Gemm", ["t", "w2", "b2"], ["logits"], name="dense2"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "digits_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, SIDE * SIDE])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, CLASSES])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
