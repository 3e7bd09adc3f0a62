"""A tiny ONNX graph builder shared by the zoo families.

``GraphBuilder`` appends nodes and initializers with unique names, tracks every tensor's static
shape (NCHW, batch 1, float32) and counts parameters the way PyTorch does, so each family file
only states its published layer configuration.

Conventions
-----------
* ``conv(..., bn=True)`` is a convolution followed by an inference BatchNorm that has been folded
  into the convolution (weights + bias). PyTorch counts ``W + gamma + beta`` for such a pair while
  the ONNX graph stores ``W + bias``; the builder records the folded channel count so
  :func:`num_params` can report the PyTorch-equivalent number (model metadata
  ``tvm_memplan.zoo.folded_params``: PyTorch parameters that folding removed from the graph).
* Weights are zero-mean normal with a fan-in scaled variance, ``var = gain / (fan_in * m2)``, where
  ``m2 = mean^2 + var`` is the builder's running estimate of the input's second moment: every
  tensor carries an estimated per-element (mean, variance), propagated through ReLU with the
  rectified-Gaussian formulas, summed by Add, channel-mixed by Concat. For a zero-mean ReLU input
  this is exactly He-normal (``2 / fan_in``); the tracking also keeps residual sums,
  concatenations and depthwise+pointwise pairs without a ReLU between them at O(1), so
  random-weight outputs stay numerically sane at any depth. Real BatchNorms get running
  statistics near the tracked ones. Folded biases are small uniform values so that bias
  handling is exercised.
* Padding: an int, ``(ph, pw)``, ONNX ``(top, left, bottom, right)``, or ``"same"`` for TF-style
  SAME padding (asymmetric for even sizes with stride 2, as NASNet uses).
* A feature map that shrinks below 1x1 raises :class:`ResolutionTooSmall` (a ``UserError`` and a
  ``ValueError``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import UserError
from ..names import unique_name

OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17; accepted by every onnxruntime >= 1.10

META_PARAMS = "tvm_memplan.zoo.params"
META_FOLDED = "tvm_memplan.zoo.folded_params"
META_NAME = "tvm_memplan.zoo.name"
META_SPEC = "tvm_memplan.zoo.spec"


class ResolutionTooSmall(UserError, ValueError):
    """The requested input resolution makes a feature map vanish (or not line up)."""


@dataclass(frozen=True)
class T:
    """A tensor in the graph under construction."""

    name: str
    shape: tuple[int, ...]
    relu: bool = False  # produced by a ReLU / ReLU6 (non-negative)
    mean: float = 0.0  # estimated per-element mean ...
    var: float = 1.0  # ... and variance, used to scale the next layer's weights

    @property
    def m2(self) -> float:
        """Estimated second moment E[x^2]."""
        return self.mean * self.mean + self.var

    @property
    def stats(self) -> tuple[float, float]:
        return self.mean, self.var

    @property
    def c(self) -> int:
        return self.shape[1]

    @property
    def hw(self) -> tuple[int, int]:
        return self.shape[2], self.shape[3]


def _relu_stats(x: T) -> tuple[float, float]:
    """(mean, var) of ReLU(y) for y ~ N(x.mean, x.var) (rectified Gaussian)."""
    mu, sd = x.mean, math.sqrt(max(x.var, 1e-12))
    a = mu / sd
    cdf = 0.5 * (1.0 + math.erf(a / math.sqrt(2.0)))
    pdf = math.exp(-0.5 * a * a) / math.sqrt(2.0 * math.pi)
    mean = mu * cdf + sd * pdf
    m2 = (mu * mu + sd * sd) * cdf + mu * sd * pdf
    return mean, max(m2 - mean * mean, 1e-6)


def _pair(v: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(v, int):
        return v, v
    a, b = v
    return int(a), int(b)


def same_pads(size: int, k: int, s: int, d: int = 1) -> tuple[int, int]:
    """TF ``SAME`` padding (before, after) for one axis."""
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return total // 2, total - total // 2


def resolve_pads(
    pad, size: tuple[int, int], kernel: tuple[int, int], stride: tuple[int, int], dilation: int = 1
) -> tuple[int, int, int, int]:
    """ONNX ``pads`` order (top, left, bottom, right) from "same", one int, (vertical, horizontal) or all four."""
    if pad == "same":
        pt, pb = same_pads(size[0], kernel[0], stride[0], dilation)
        pl, pr = same_pads(size[1], kernel[1], stride[1], dilation)
        return pt, pl, pb, pr
    if isinstance(pad, int):
        return pad, pad, pad, pad
    if len(pad) == 2:
        return int(pad[0]), int(pad[1]), int(pad[0]), int(pad[1])
    pt, pl, pb, pr = (int(p) for p in pad)
    return pt, pl, pb, pr


def _out_size(n: int, k: int, s: int, before: int, after: int, d: int = 1, ceil: bool = False) -> int:
    eff = (k - 1) * d + 1
    span = n + before + after - eff
    if span < 0:
        return 0
    if ceil:
        out = -(-span // s) + 1
        # PyTorch / ONNX: the last window must start inside the input or the left padding.
        if (out - 1) * s >= n + before:
            out -= 1
        return out
    return span // s + 1


class GraphBuilder:
    """Appends ONNX nodes/initializers; see the module docstring for conventions."""

    def __init__(self, model_name: str, resolution: int | None = None, seed: int = 0) -> None:
        self.model_name = model_name
        self.resolution = resolution
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self._used: set[str] = set()
        self._scope: list[str] = []
        self._relu_cache: dict[str, T] = {}
        self.params = 0  # PyTorch-equivalent parameter count
        self.folded = 0  # PyTorch parameters not stored because a BatchNorm was folded into a conv

    # ----------------------------------------------------------------- naming
    @contextmanager
    def scope(self, name: str):
        self._scope.append(str(name).replace(".", "_"))
        try:
            yield self
        finally:
            self._scope.pop()

    def _name(self, base: str) -> str:
        return unique_name("_".join([*self._scope, base]) if self._scope else base, self._used, first_suffix=2)

    def _check(self, op: str, shape: tuple[int, ...]) -> None:
        if any(d < 1 for d in shape):
            where = "/".join(self._scope) or "top level"
            res = f"resolution {self.resolution}" if self.resolution is not None else "this input size"
            raise ResolutionTooSmall(
                f"{self.model_name}: {res} is too small (feature map {list(shape)} after {op} at {where})"
            )

    def _node(
        self,
        op: str,
        inputs: Sequence[str],
        shape: tuple[int, ...],
        relu: bool = False,
        stats: tuple[float, float] = (0.0, 1.0),
        base: str | None = None,
        **attrs,
    ) -> T:
        self._check(op, shape)
        out = self._name(base or op.lower())
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=out, **attrs))
        return T(out, tuple(int(d) for d in shape), relu, float(stats[0]), float(stats[1]))

    def const(self, base: str, value: np.ndarray) -> str:
        name = self._name(base)
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    # ----------------------------------------------------------------- inputs
    def input(self, shape: Sequence[int], name: str = "input") -> T:
        shape = tuple(int(d) for d in shape)
        self._check("input", shape)
        self._used.add(name)
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return T(name, shape)

    # ----------------------------------------------------------------- weights
    def _he(self, shape: Sequence[int], fan_in: int, x: T, gain: float = 1.0) -> np.ndarray:
        std = math.sqrt(gain / (fan_in * max(x.m2, 1e-6)))
        return (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def _bias(self, n: int) -> np.ndarray:
        return self.rng.uniform(-0.1, 0.1, size=n).astype(np.float32)

    # ----------------------------------------------------------------- layers
    def conv(
        self,
        x: T,
        cout: int,
        k: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        pad: int | Sequence[int] | str | None = None,
        group: int = 1,
        dilation: int = 1,
        bias: bool = False,
        bn: bool = False,
        act: str | None = None,
        gain: float = 1.0,
        base: str = "conv",
    ) -> T:
        """Conv2d (+ folded BN when ``bn``) (+ ``act`` in {"relu", "relu6", None})."""
        n, cin, h, w = x.shape
        kh, kw = _pair(k)
        sh, sw = _pair(stride)
        if cin % group or cout % group:
            raise ValueError(f"{self.model_name}: channels {cin}->{cout} not divisible by group {group}")
        if pad is None:
            pad = ((kh - 1) // 2 * dilation, (kw - 1) // 2 * dilation)
        pt, pl, pb, pr = resolve_pads(pad, (h, w), (kh, kw), (sh, sw), dilation)
        oh = _out_size(h, kh, sh, pt, pb, dilation)
        ow = _out_size(w, kw, sw, pl, pr, dilation)
        fan_in = cin // group * kh * kw
        wname = self.const(base + "_w", self._he((cout, cin // group, kh, kw), fan_in, x, gain))
        self.params += cout * fan_in
        ins = [x.name, wname]
        if bn or bias:
            ins.append(self.const(base + "_b", self._bias(cout)))
        if bn:  # PyTorch: conv (W [+ b]) + BN (gamma, beta); ONNX: W' + b'
            self.params += 2 * cout + (cout if bias else 0)
            self.folded += cout + (cout if bias else 0)
        elif bias:
            self.params += cout
        attrs = dict(kernel_shape=[kh, kw], strides=[sh, sw], pads=[pt, pl, pb, pr])
        if dilation != 1:
            attrs["dilations"] = [dilation, dilation]
        if group != 1:
            attrs["group"] = group
        y = self._node("Conv", ins, (n, cout, oh, ow), stats=(0.0, gain), base=base, **attrs)
        return self.activation(y, act)

    def separable(
        self,
        x: T,
        cout: int,
        k: int,
        stride: int = 1,
        pad: int | str | None = None,
        bn_dw: bool = False,
        bn: bool = False,
        act: str | None = None,
        base: str = "sep",
    ) -> T:
        """Depthwise kxk conv then pointwise 1x1 conv (Xception / NASNet ``SeparableConv2d``)."""
        y = self.conv(x, x.c, k, stride, pad, group=x.c, bn=bn_dw, base=base + "_dw")
        return self.conv(y, cout, 1, bn=bn, act=act, base=base + "_pw")

    def activation(self, x: T, act: str | None) -> T:
        if act is None:
            return x
        if act == "relu":
            return self.relu(x)
        if act == "relu6":
            return self.relu6(x)
        raise ValueError(f"unknown activation {act!r}")

    def relu(self, x: T) -> T:
        """ReLU; the ReLU of a ReLU output is the identity and a tensor's ReLU is made only once."""
        if x.relu:
            return x
        if x.name not in self._relu_cache:
            self._relu_cache[x.name] = self._node("Relu", [x.name], x.shape, relu=True, stats=_relu_stats(x))
        return self._relu_cache[x.name]

    def relu6(self, x: T) -> T:
        """ReLU6 as ``Clip(x, 0, 6)`` with min/max as inputs (opset >= 11)."""
        lo = self.const("clip_min", np.array(0.0, dtype=np.float32))
        hi = self.const("clip_max", np.array(6.0, dtype=np.float32))
        return self._node("Clip", [x.name, lo, hi], x.shape, relu=True, stats=_relu_stats(x), base="relu6")

    def _pool(
        self,
        op: str,
        x: T,
        k: int | Sequence[int],
        stride: int | Sequence[int] | None,
        pad: int | Sequence[int] | str,
        ceil: bool,
        **extra,
    ) -> T:
        n, c, h, w = x.shape
        kh, kw = _pair(k)
        sh, sw = _pair(stride if stride is not None else (kh, kw))
        pt, pl, pb, pr = resolve_pads(pad, (h, w), (kh, kw), (sh, sw))
        oh = _out_size(h, kh, sh, pt, pb, ceil=ceil)
        ow = _out_size(w, kw, sw, pl, pr, ceil=ceil)
        attrs = dict(kernel_shape=[kh, kw], strides=[sh, sw], pads=[pt, pl, pb, pr], **extra)
        if ceil:
            attrs["ceil_mode"] = 1
        return self._node(op, [x.name], (n, c, oh, ow), relu=x.relu, stats=x.stats, base=op.lower(), **attrs)

    def maxpool(self, x: T, k, stride=None, pad=0, ceil: bool = False) -> T:
        return self._pool("MaxPool", x, k, stride, pad, ceil)

    def avgpool(self, x: T, k, stride=None, pad=0, ceil: bool = False, count_include_pad: bool = True) -> T:
        """AveragePool; ``count_include_pad`` defaults to PyTorch's ``nn.AvgPool2d`` default (True)."""
        return self._pool("AveragePool", x, k, stride, pad, ceil, count_include_pad=int(count_include_pad))

    def global_avgpool(self, x: T) -> T:
        n, c = x.shape[:2]
        return self._node("GlobalAveragePool", [x.name], (n, c, 1, 1), relu=x.relu, stats=x.stats, base="gap")

    def concat(self, xs: Iterable[T]) -> T:
        xs = list(xs)
        n, _, h, w = xs[0].shape
        for t in xs[1:]:
            if t.hw != (h, w):
                raise ResolutionTooSmall(
                    f"{self.model_name}: resolution {self.resolution} gives mismatched branch sizes "
                    f"{xs[0].hw} vs {t.hw} at {'/'.join(self._scope)}"
                )
        c = sum(t.c for t in xs)
        mean = sum(t.mean * t.c for t in xs) / c
        m2 = sum(t.m2 * t.c for t in xs) / c
        return self._node(
            "Concat",
            [t.name for t in xs],
            (n, c, h, w),
            relu=all(t.relu for t in xs),
            stats=(mean, max(m2 - mean * mean, 1e-6)),
            axis=1,
        )

    def add(self, a: T, b: T) -> T:
        if a.shape != b.shape:
            raise ResolutionTooSmall(
                f"{self.model_name}: resolution {self.resolution} gives mismatched shapes "
                f"{a.shape} + {b.shape} at {'/'.join(self._scope)}"
            )
        return self._node(
            "Add", [a.name, b.name], a.shape, relu=a.relu and b.relu, stats=(a.mean + b.mean, a.var + b.var)
        )

    def batchnorm(self, x: T, eps: float = 1e-5) -> T:
        """A real (unfolded) inference BatchNormalization, for pre-activation nets (DenseNet)."""
        c = x.c
        scale = self.const("bn_scale", (1.0 + 0.1 * self.rng.standard_normal(c)).astype(np.float32))
        shift = self.const("bn_shift", self._bias(c))
        rmean = x.mean + 0.1 * math.sqrt(x.var) * self.rng.standard_normal(c)
        rvar = x.var * self.rng.uniform(0.8, 1.25, size=c)
        mean = self.const("bn_mean", rmean.astype(np.float32))
        var = self.const("bn_var", rvar.astype(np.float32))
        self.params += 2 * c
        return self._node(
            "BatchNormalization", [x.name, scale, shift, mean, var], x.shape, stats=(0.0, 1.0), base="bn", epsilon=eps
        )

    def pad(self, x: T, top: int, left: int, bottom: int, right: int) -> T:
        """Zero padding of H and W (ONNX Pad, constant mode)."""
        n, c, h, w = x.shape
        pads = self.const("pads", np.array([0, 0, top, left, 0, 0, bottom, right], dtype=np.int64))
        return self._node(
            "Pad",
            [x.name, pads],
            (n, c, h + top + bottom, w + left + right),
            relu=x.relu,
            stats=x.stats,
            mode="constant",
        )

    def slice_hw(self, x: T, start: int, step: int = 1) -> T:
        """``x[:, :, start::step, start::step]`` (ONNX Slice)."""
        n, c, h, w = x.shape
        starts = self.const("starts", np.array([start, start], dtype=np.int64))
        ends = self.const("ends", np.array([h, w], dtype=np.int64))
        axes = self.const("axes", np.array([2, 3], dtype=np.int64))
        steps = self.const("steps", np.array([step, step], dtype=np.int64))
        oh = len(range(start, h, step))
        ow = len(range(start, w, step))
        return self._node("Slice", [x.name, starts, ends, axes, steps], (n, c, oh, ow), relu=x.relu, stats=x.stats)

    def flatten(self, x: T) -> T:
        return self._node(
            "Flatten", [x.name], (x.shape[0], int(np.prod(x.shape[1:]))), relu=x.relu, stats=x.stats, axis=1
        )

    def gemm(self, x: T, nout: int, act: str | None = None, base: str = "fc", matmul: bool = False) -> T:
        """Linear layer ``y = x W^T + b``: one Gemm with W stored [out, in] as in PyTorch, or with
        ``matmul`` a MatMul (W stored [in, out]) followed by an Add of the bias."""
        n, nin = x.shape
        self.params += nout * nin + nout
        if matmul:
            w = self.const(base + "_w", self._he((nin, nout), nin, x))
            b = self.const(base + "_b", self._bias(nout))
            y = self._node("MatMul", [x.name, w], (n, nout), base=base + "_matmul")
            y = self._node("Add", [y.name, b], (n, nout), base=base + "_add")
        else:
            w = self.const(base + "_w", self._he((nout, nin), nin, x))
            b = self.const(base + "_b", self._bias(nout))
            y = self._node("Gemm", [x.name, w, b], (n, nout), base=base, transB=1)
        return self.activation(y, act)

    def classifier(self, x: T, num_classes: int, base: str = "fc") -> T:
        """GlobalAveragePool -> Flatten -> Gemm, the usual ImageNet head (dropout is a no-op)."""
        return self.gemm(self.flatten(self.global_avgpool(x)), num_classes, base=base)

    # ----------------------------------------------------------------- output
    def finish(self, outputs: T | Sequence[T], doc: str = "") -> onnx.ModelProto:
        outs = [outputs] if isinstance(outputs, T) else list(outputs)
        final: list[onnx.ValueInfoProto] = []
        for i, t in enumerate(outs):
            name = "output" if len(outs) == 1 else f"output{i}"
            self.nodes.append(helper.make_node("Identity", [t.name], [name], name=name + "_identity"))
            final.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(t.shape)))
        graph = helper.make_graph(self.nodes, self.model_name, self.inputs, final, self.initializers)
        model = helper.make_model(
            graph,
            producer_name="tvm_memplan.zoo",
            opset_imports=[helper.make_opsetid("", OPSET)],
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        helper.set_model_props(
            model,
            {
                META_NAME: self.model_name,
                META_PARAMS: str(self.params),
                META_FOLDED: str(self.folded),
            },
        )
        return model


def num_params(model: onnx.ModelProto) -> int:
    """PyTorch-equivalent parameter count of a zoo model, derived from its initializers.

    Counts float initializers used as weights/biases of Conv, Gemm, MatMul, Add, embedding tables
    (Gather data), and the scale/shift of BatchNormalization and LayerNormalization (BatchNorm's
    running mean/var are buffers in PyTorch, not parameters), then adds
    the parameters that folding BatchNorms into convolutions removed (beta became the conv bias,
    gamma was absorbed into the weight: one parameter per channel is not stored).
    """
    inits = {t.name: t for t in model.graph.initializer}
    counted: set[str] = set()
    total = 0
    for node in model.graph.node:
        if node.op_type in ("Conv", "Gemm", "MatMul", "Add"):
            idx = range(len(node.input))
        elif node.op_type in ("BatchNormalization", "LayerNormalization"):
            idx = (1, 2)
        elif node.op_type == "Gather":  # embedding tables
            idx = (0,)
        else:
            continue
        for i in idx:
            name = node.input[i]
            if name in inits and name not in counted and inits[name].data_type == TensorProto.FLOAT:
                counted.add(name)
                total += int(np.prod(inits[name].dims))
    props = {p.key: p.value for p in model.metadata_props}
    return total + int(props.get(META_FOLDED, 0))


def num_macs(model: onnx.ModelProto) -> int:
    """Multiply-accumulates of the Conv, Gemm and MatMul nodes (the usual "Mult-Adds" figure)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes: dict[str, list[int]] = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        shapes[vi.name] = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    inits = {t.name: list(t.dims) for t in model.graph.initializer}
    total = 0
    for node in model.graph.node:
        if node.op_type == "Conv":
            w = inits[node.input[1]]
            total += int(np.prod(shapes[node.output[0]])) * int(np.prod(w[1:]))
        elif node.op_type == "Gemm":
            w = inits[node.input[1]]
            total += int(np.prod(shapes[node.output[0]])) * int(np.prod(w) // shapes[node.output[0]][-1])
        elif node.op_type == "MatMul":  # weights or two activations (attention), batched or not
            a = inits.get(node.input[0]) or shapes[node.input[0]]
            total += int(np.prod(shapes[node.output[0]])) * int(a[-1])
    return total
