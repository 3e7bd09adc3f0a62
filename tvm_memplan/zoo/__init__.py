"""Model zoo: ONNX models with published layer configurations and random (seeded) weights.

>>> from tvm_memplan import zoo
>>> zoo.names()[:3]
['bert_tiny', 'densenet121', 'googlenet']
>>> model = zoo.build("mobilenet_v2", width=0.35, resolution=96)
>>> zoo.input_shape(model)
(1, 3, 96, 96)
>>> zoo.parse_spec("zoo:mobilenet_v2?width=0.35&resolution=144")
('mobilenet_v2', {'width': 0.35, 'resolution': 144})

Every model is batch 1, NCHW (the MLP takes ``(1, features)``), float32, ONNX opset 17, built with
``onnx.helper`` from the published configuration; weights are He-normal from
``numpy.random.default_rng(seed)`` and BatchNorms after convolutions are folded. Every builder takes
``resolution`` (input H = W), ``num_classes`` and ``seed``; some take more (``describe(name)`` and
``params(name)``). Only operators that TVM 0.27's Relax ONNX frontend imports are used: Conv
(grouped/depthwise), Relu, Clip (ReLU6), MaxPool, AveragePool, GlobalAveragePool, Concat, Add,
BatchNormalization (DenseNet), Pad, Slice (NASNet), Flatten, Gemm, MatMul, Identity; the transformer
``bert_tiny`` (token ids in, ``resolution`` = sequence length) adds Gather, LayerNormalization,
Reshape, Transpose, Softmax, Div, Mul, Erf and Tanh.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import onnx

from ..errors import UserError
from .bert import bert_tiny
from .densenet import densenet121
from .graph import META_SPEC, GraphBuilder, ResolutionTooSmall, num_macs, num_params
from .inception import googlenet, inception_v3
from .mobilenet import make_divisible, mobilenet_v2
from .nasnet import nasnet_a_mobile
from .resnet import resnext50_32x4d
from .small import mcu_cnn, mlp, squeezenet1_0
from .xception import xception

SPEC_PREFIX = "zoo:"


@dataclass(frozen=True)
class Entry:
    builder: Callable[..., onnx.ModelProto]
    what: str
    source: str
    published_params: int | None  # PyTorch-counted parameters of the default configuration


_REGISTRY: dict[str, Entry] = {
    "resnext50_32x4d": Entry(
        resnext50_32x4d,
        "ResNeXt-50 32x4d (grouped 3x3 bottlenecks), 224x224",
        "Xie et al. CVPR 2017; torchvision resnext50_32x4d",
        25_028_904,
    ),
    "googlenet": Entry(
        googlenet,
        "GoogLeNet / Inception v1 without aux heads, 224x224",
        "Szegedy et al. CVPR 2015; torchvision googlenet",
        6_624_904,
    ),
    "mobilenet_v2": Entry(
        mobilenet_v2,
        "MobileNetV2 with width multiplier (channels rounded to 8), 224x224",
        "Sandler et al. CVPR 2018; torchvision mobilenet_v2",
        3_504_872,
    ),
    "xception": Entry(
        xception,
        "Xception: entry/middle/exit flows of depthwise-separable convs, 299x299",
        "Chollet CVPR 2017; Cadene pretrainedmodels / timm legacy_xception",
        22_855_952,
    ),
    "inception_v3": Entry(
        inception_v3,
        "Inception v3 without the aux head, 299x299",
        "Szegedy et al. CVPR 2016; torchvision inception_v3 (27,161,264 with aux)",
        23_834_568,
    ),
    "densenet121": Entry(
        densenet121,
        "DenseNet-121 (blocks 6-12-24-16, growth 32, bn_size 4), concat heavy, 224x224",
        "Huang et al. CVPR 2017; torchvision densenet121",
        7_978_856,
    ),
    "squeezenet1_0": Entry(
        squeezenet1_0,
        "SqueezeNet 1.0 (fire modules: squeeze, expand 1x1 + 3x3, concat), 224x224",
        "Iandola et al. 2016; torchvision squeezenet1_0",
        1_248_424,
    ),
    "nasnet_a_mobile": Entry(
        nasnet_a_mobile,
        "NASNet-A Mobile 4 @ 1056 (searched normal/reduction cells), 224x224",
        "Zoph et al. CVPR 2018; timm / Cadene nasnetamobile",
        5_289_978,
    ),
    "mcu_cnn": Entry(
        mcu_cnn,
        "microcontroller-class CNN (conv, pools, depthwise-separable, residual), 3x32x32",
        "this project's own configuration (TinyML style)",
        None,
    ),
    "bert_tiny": Entry(
        bert_tiny,
        "BERT-tiny encoder (2 layers, hidden 128, 2 heads), resolution = sequence length, token ids in",
        "Turc et al. 2019; google/bert_uncased_L-2_H-128_A-2 (4,385,920) + a linear head",
        4_386_178,
    ),
    "mlp": Entry(
        mlp,
        "2-layer MLP 784 -> 512 -> 10 with ReLU (Gemm, or MatMul + Add with matmul=1)",
        "classic MNIST MLP",
        407_050,
    ),
}


def names() -> list[str]:
    """Registered model names, sorted."""
    return sorted(_REGISTRY)


def _entry(name: str) -> Entry:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UserError(f"unknown zoo model {name!r}; known: {', '.join(names())}") from None


def params(name: str) -> dict[str, Any]:
    """The parameters ``build(name, ...)`` accepts, with their defaults."""
    sig = inspect.signature(_entry(name).builder)
    return {k: p.default for k, p in sig.parameters.items()}


def describe(name: str) -> str:
    """One line: what the model is, its parameters and where the configuration comes from."""
    e = _entry(name)
    opts = ", ".join(f"{k}={v}" for k, v in params(name).items())
    count = f"; {e.published_params:,} params" if e.published_params else ""
    return f"{name}: {e.what} ({opts}){count}. Source: {e.source}."


def _check_value(model: str, key: str, value: Any, default: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"zoo model {model}: parameter {key}={value!r} must be a number")
    if isinstance(default, int) and not isinstance(default, bool):
        if isinstance(value, float):
            if not value.is_integer():
                raise UserError(f"zoo model {model}: parameter {key}={value!r} must be an integer")
            value = int(value)
        lo = 0 if key in ("seed", "matmul") else 1
        if value < lo:
            raise UserError(f"zoo model {model}: parameter {key}={value} must be >= {lo}")
        return value
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"zoo model {model}: parameter {key}={value} must be a positive number")
    return value


def build(name: str, **kwargs: Any) -> onnx.ModelProto:
    """Build zoo model ``name``; raises ``UserError`` for an unknown name or a bad parameter."""
    e = _entry(name)
    defaults = params(name)
    unknown = sorted(set(kwargs) - set(defaults))
    if unknown:
        raise UserError(f"zoo model {name}: unknown parameter(s) {', '.join(unknown)}; accepted: {', '.join(defaults)}")
    clean = {k: _check_value(name, k, v, defaults[k]) for k, v in kwargs.items()}
    try:
        model = e.builder(**clean)
    except UserError:
        raise
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    model.metadata_props.add(key=META_SPEC, value=format_spec(name, clean))
    return model


_INT_RE = re.compile(r"^[+-]?\d+$")


def _parse_value(key: str, text: str) -> int | float:
    text = text.strip()
    if _INT_RE.match(text):
        return int(text)
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"zoo spec: value of {key!r} must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise UserError(f"zoo spec: value of {key!r} must be finite, got {text!r}")
    return value


def parse_spec(spec: str) -> tuple[str, dict[str, int | float]]:
    """``"zoo:mobilenet_v2?width=0.35&resolution=144"`` -> ``("mobilenet_v2", {...})``.

    The ``zoo:`` prefix is optional. Values parse as int when they look like one, else as float.
    Unknown model names and parameters raise ``UserError``.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise UserError("zoo spec is empty; expected e.g. zoo:mobilenet_v2?width=0.35")
    text = spec.strip()
    if text.startswith(SPEC_PREFIX):
        text = text[len(SPEC_PREFIX) :]
    name, _, query = text.partition("?")
    name = name.strip()
    if not name:
        raise UserError(f"zoo spec {spec!r} has no model name; known: {', '.join(names())}")
    defaults = params(name)  # raises UserError for an unknown name
    out: dict[str, int | float] = {}
    if query.strip():
        for item in query.split("&"):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or not key or not value.strip():
                raise UserError(f"zoo spec {spec!r}: expected key=value, got {item!r}")
            if key not in defaults:
                raise UserError(
                    f"zoo spec {spec!r}: unknown parameter {key!r} for {name}; accepted: {', '.join(defaults)}"
                )
            if key in out:
                raise UserError(f"zoo spec {spec!r}: parameter {key!r} given twice")
            out[key] = _parse_value(key, value)
    return name, out


def format_spec(name: str, kwargs: dict[str, Any] | None = None) -> str:
    """Inverse of :func:`parse_spec`."""
    query = "&".join(f"{k}={v}" for k, v in (kwargs or {}).items())
    return f"{SPEC_PREFIX}{name}" + (f"?{query}" if query else "")


def build_spec(spec: str) -> onnx.ModelProto:
    """``build(*parse_spec(spec))``."""
    name, kwargs = parse_spec(spec)
    return build(name, **kwargs)


def input_shape(model: onnx.ModelProto) -> tuple[int, ...]:
    """Static shape of the model's (first) graph input that is not an initializer."""
    inits = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        if any(not d.HasField("dim_value") for d in dims):
            raise UserError(f"model input {vi.name!r} has a dynamic shape")
        return tuple(int(d.dim_value) for d in dims)
    raise UserError("model has no graph input")


__all__ = [
    "GraphBuilder",
    "ResolutionTooSmall",
    "build",
    "build_spec",
    "describe",
    "format_spec",
    "input_shape",
    "make_divisible",
    "names",
    "num_macs",
    "num_params",
    "params",
    "parse_spec",
]
