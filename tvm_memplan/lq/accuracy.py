"""Accuracy of ``tvm-memplan quantize`` with default options on networks it was not developed on.

Data sets that ship with scikit-learn, MLPs trained by scikit-learn (``MLPClassifier``), exported
to ONNX as Gemm + Relu/Tanh chains built with ``onnx.helper``, quantized by the CLI's own
``quantize`` command (default options, calibration on the first training rows), and scored as
the compiled library's predictions on the held-out rows. Binary classifiers have one logit
(scikit-learn's logistic output): a row is class 1 when its logit is positive.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .digits import upsample

CALIB_ROWS = 256
SETTINGS: tuple[tuple[int, int], ...] = ((1, 1), (2, 2), (3, 3), (4, 4))


@dataclass(frozen=True)
class Dataset:
    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max())) + 1


def _split(name: str, x: np.ndarray, y: np.ndarray, standardize: bool, test_size: float, seed: int) -> Dataset:
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    x_train, x_test, y_train, y_test = train_test_split(
        x.astype(np.float64), y, test_size=test_size, random_state=seed, stratify=y
    )
    if standardize:  # tabular features of unlike scales; the scaler is fitted on the training rows only
        scaler = StandardScaler().fit(x_train)
        x_train, x_test = scaler.transform(x_train), scaler.transform(x_test)
    return Dataset(
        name, x_train.astype(np.float32), y_train.astype(np.int64), x_test.astype(np.float32), y_test.astype(np.int64)
    )


def load_dataset(name: str, test_size: float = 0.3, seed: int = 0) -> Dataset:
    """``digits8`` (raw 8x8 pixels / 16), ``digits28`` (upsampled to 28x28), ``breast_cancer``,
    ``wine``, ``iris`` (standardized): a stratified split of scikit-learn's copy."""
    from sklearn import datasets

    if name in ("digits8", "digits28"):
        digits = datasets.load_digits()
        images = digits.images.astype(np.float64) / 16.0
        x = images.reshape(len(images), -1) if name == "digits8" else upsample(images).reshape(len(images), -1)
        return _split(name, x, digits.target, False, test_size, seed)
    loaders: dict[str, Callable] = {
        "breast_cancer": datasets.load_breast_cancer,
        "wine": datasets.load_wine,
        "iris": datasets.load_iris,
    }
    if name not in loaders:
        raise ValueError(f"unknown data set {name!r}")
    data = loaders[name]()
    return _split(name, data.data, data.target, True, test_size, seed)


@dataclass(frozen=True)
class Network:
    """An MLP shape on a data set: hidden widths and the hidden activation (relu or tanh)."""

    dataset: str
    hidden: tuple[int, ...]
    activation: str

    @property
    def label(self) -> str:
        return f"{self.dataset} {'-'.join(map(str, self.hidden))} {self.activation}"


# 1-3 hidden layers, widths 64-1024, ReLU and tanh, multi-class and single-logit binary outputs.
NETWORKS: tuple[Network, ...] = (
    Network("digits8", (1024, 1024), "relu"),
    Network("digits8", (128,), "tanh"),
    Network("digits28", (512,), "tanh"),
    Network("digits28", (256, 256, 256), "relu"),
    Network("breast_cancer", (256, 256), "relu"),
    Network("breast_cancer", (64,), "tanh"),
    Network("wine", (64, 64, 64), "relu"),
    Network("wine", (128,), "tanh"),
    Network("iris", (64,), "relu"),
    Network("iris", (128, 128), "tanh"),
)


def train(network: Network, data: Dataset, seed: int = 0, max_iter: int = 200, cache_dir: Path | None = None):
    """A scikit-learn MLPClassifier (Adam, its default stopping rule), pickled in ``cache_dir``:
    the 1024-wide digits network takes a minute or two to train on two cores."""
    import pickle
    import warnings

    import sklearn
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    key = f"{network.dataset}_{'x'.join(map(str, network.hidden))}_{network.activation}_s{seed}_i{max_iter}"
    path = cache_dir / f"mlp_{key}_sk{sklearn.__version__}.pkl" if cache_dir else None
    if path is not None and path.is_file():
        with path.open("rb") as f:
            return pickle.load(f)
    model = MLPClassifier(
        hidden_layer_sizes=network.hidden, activation=network.activation, max_iter=max_iter, random_state=seed
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(data.x_train, data.y_train)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            pickle.dump(model, f)
    return model


def to_onnx(model, name: str = "mlp") -> onnx.ModelProto:
    """The classifier's logits as Gemm (+ Relu/Tanh) nodes; a binary classifier has one logit."""
    act = {"relu": "Relu", "tanh": "Tanh"}[model.activation]
    nodes, inits = [], []
    current = "x"
    layers = list(zip(model.coefs_, model.intercepts_, strict=True))
    for index, (weight, bias) in enumerate(layers):
        inits += [
            numpy_helper.from_array(np.asarray(weight, np.float32), f"w{index}"),
            numpy_helper.from_array(np.asarray(bias, np.float32), f"b{index}"),
        ]
        out = f"gemm{index}" if index < len(layers) - 1 else "logits"
        nodes.append(helper.make_node("Gemm", [current, f"w{index}", f"b{index}"], [out]))
        current = out
        if index < len(layers) - 1:
            nodes.append(helper.make_node(act, [current], [f"h{index}"]))
            current = f"h{index}"
    n_in, n_out = layers[0][0].shape[0], layers[-1][0].shape[1]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", n_in])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", n_out])],
        inits,
    )
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx_model.ir_version = 8
    onnx.checker.check_model(onnx_model)
    return onnx_model


def predict(logits: np.ndarray) -> np.ndarray:
    """Class per row: argmax of several logits, ``logit > 0`` for a single-logit binary classifier."""
    logits = np.asarray(logits)
    if logits.ndim == 2 and logits.shape[1] == 1:
        return (logits[:, 0] > 0).astype(np.int64)
    return logits.argmax(axis=-1).astype(np.int64)


def onnx_logits(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The float model's logits by onnxruntime (independent of TVM)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x.astype(np.float32)})[0]


def library_logits(library: Path, x: np.ndarray) -> np.ndarray:
    """Logits of a library built by ``quantize`` (static batch 1), one row at a time."""
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.runtime.load_module(str(library)), tvm.cpu())
    dev = tvm.cpu()
    return np.concatenate([vm["main"](tvm.runtime.tensor(x[i : i + 1], dev)).numpy() for i in range(len(x))])


def quantize_cli(model_path: Path, calib: Path, wbits: int, abits: int, out: Path) -> tuple[dict, str]:
    """``tvm-memplan quantize MODEL --calib CALIB --wbits W --abits A -o OUT``: its report and printout."""
    from ..cli.main import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(
            [
                "quantize",
                str(model_path),
                "--calib",
                str(calib),
                "--wbits",
                str(wbits),
                "--abits",
                str(abits),
                "-o",
                str(out),
            ]
        )
    if code != 0:
        raise RuntimeError(f"quantize exited with {code}")
    return json.loads(out.with_suffix(".json").read_text()), printed.getvalue()


def evaluate(
    network: Network,
    settings: Sequence[tuple[int, int]] = SETTINGS,
    *,
    data: Dataset | None = None,
    seed: int = 0,
    max_iter: int = 200,
    cache_dir: Path | None = None,
) -> dict:
    """Float and per-setting accuracy of one network on its held-out rows, with each quantized report."""
    data = data or load_dataset(network.dataset, seed=seed)
    model = train(network, data, seed=seed, max_iter=max_iter, cache_dir=cache_dir)
    graph = to_onnx(model)
    float_logits = onnx_logits(graph, data.x_test)
    float_pred = predict(float_logits)
    if not np.array_equal(float_pred, model.predict(data.x_test)):
        raise AssertionError(f"{network.label}: the ONNX export disagrees with scikit-learn")
    row = {
        "network": network.label,
        "inputs": int(data.x_train.shape[1]),
        "outputs": int(float_logits.shape[1]),
        "test_rows": int(len(data.y_test)),
        "float": float(np.mean(float_pred == data.y_test)),
        "settings": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        model_path = tmp_path / "model.onnx"
        onnx.save(graph, str(model_path))
        calib = tmp_path / "calib.npz"
        np.savez(calib, x=data.x_train[:CALIB_ROWS])
        for wbits, abits in settings:
            library = tmp_path / f"w{wbits}a{abits}.so"
            report, _ = quantize_cli(model_path, calib, wbits, abits, library)
            pred = predict(library_logits(library, data.x_test))
            row["settings"][f"W{wbits}A{abits}"] = {
                "accuracy": float(np.mean(pred == data.y_test)),
                "size_ratio": report["size_bytes"] / report["float_bytes"],
                "layers": [
                    {k: layer[k] for k in ("status", "wbits", "abits", "output_rel_error", "reason")}
                    for layer in report["layers"]
                ],
            }
    return row


def markdown(rows: Sequence[dict], settings: Sequence[tuple[int, int]] = SETTINGS) -> str:
    """One line per network: float accuracy, then each setting's accuracy, change in points and size."""
    names = [f"W{w}A{a}" for w, a in settings]
    lines = [
        "| network | in→out | test rows | float | "
        + " | ".join(f"{n} (Δ, size)" for n in names)
        + " | layers kept in float or widened |",
        "|---|---|---:|---:|" + "---:|" * len(names) + "---|",
    ]
    for row in rows:
        cells, notes = [], []
        for name in names:
            entry = row["settings"][name]
            delta = 100 * (entry["accuracy"] - row["float"])
            cells.append(f"{100 * entry['accuracy']:.2f} % ({delta:+.2f}, {entry['size_ratio']:.3f})")
            changed = [
                f"L{i}:" + ("float" if layer["status"] != "lq" else f"W{int(layer['wbits'])}A{int(layer['abits'])}")
                for i, layer in enumerate(entry["layers"])
                if layer["status"] != "lq"
                or (layer.get("wbits"), layer.get("abits")) != tuple(int(c) for c in name[1:].split("A"))
            ]
            if changed:
                notes.append(f"{name}: {' '.join(changed)}")
        lines.append(
            f"| {row['network']} | {row['inputs']}→{row['outputs']} | {row['test_rows']} | {100 * row['float']:.2f} % "
            "| " + " | ".join(cells) + f" | {'; '.join(notes) or '-'} |"
        )
    return "\n".join(lines)
