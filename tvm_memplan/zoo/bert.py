"""A BERT-tiny-sized transformer encoder (the splitting patent's transformer example).

Turc et al., "Well-Read Students Learn Better", 2019, ``google/bert_uncased_L-2_H-128_A-2``: 2 layers,
hidden 128, 2 heads of 64, feed-forward 512, vocabulary 30522, 512 positions, 2 token types,
post-LayerNorm, GELU (erf form), a tanh pooler on the first token — 4,385,920 parameters — plus a
``num_classes``-way linear head on the pooled output (``BertForSequenceClassification``).

The input is ``input_ids`` (int64, ``(1, resolution)``): for this model ``resolution`` is the sequence
length. Every token is attended (no mask) and has token type 0, so the position and token-type
lookups are constants TVM folds. Weights are N(0, 0.02) as in BERT's initialiser; LayerNorm scales
are near 1 and shifts near 0, so the random model stays numerically sane.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper

from .graph import GraphBuilder, T

VOCAB = 30522
MAX_POSITIONS = 512
TYPES = 2


class _Encoder:
    """The transformer layers on top of :class:`GraphBuilder` (which has no sequence ops)."""

    def __init__(self, g: GraphBuilder, hidden: int, heads: int) -> None:
        self.g, self.hidden, self.heads = g, hidden, heads

    def weight(self, base: str, shape: tuple[int, ...], std: float = 0.02) -> str:
        self.g.params += int(np.prod(shape))
        return self.g.const(base, (self.g.rng.standard_normal(shape) * std).astype(np.float32))

    def linear(self, x: T, nout: int, base: str) -> T:
        """``x @ W + b`` with W stored ``[in, out]`` (MatMul then Add, as exporters write it)."""
        w = self.weight(base + "_w", (x.shape[-1], nout))
        b = self.weight(base + "_b", (nout,))
        shape = (*x.shape[:-1], nout)
        y = self.g._node("MatMul", [x.name, w], shape, base=base + "_matmul")
        return self.g._node("Add", [y.name, b], shape, base=base + "_add")

    def layernorm(self, x: T, base: str) -> T:
        n = x.shape[-1]
        scale = self.g.const(base + "_scale", (1.0 + 0.02 * self.g.rng.standard_normal(n)).astype(np.float32))
        shift = self.g.const(base + "_shift", (0.02 * self.g.rng.standard_normal(n)).astype(np.float32))
        self.g.params += 2 * n
        return self.g._node("LayerNormalization", [x.name, scale, shift], x.shape, base=base, axis=-1, epsilon=1e-12)

    def op(self, op: str, inputs: list[str], shape: tuple[int, ...], **attrs) -> T:
        return self.g._node(op, inputs, shape, **attrs)

    def scalar(self, base: str, value: float) -> str:
        return self.g.const(base, np.array(value, dtype=np.float32))

    def heads_view(self, x: T, transpose_last: bool = False) -> T:
        """(1, S, hidden) -> (1, heads, S, d), or (1, heads, d, S) for the keys."""
        _, s, _ = x.shape
        d = self.hidden // self.heads
        shape = self.g.const("shape", np.array([1, s, self.heads, d], dtype=np.int64))
        y = self.op("Reshape", [x.name, shape], (1, s, self.heads, d))
        perm, out = ([0, 2, 3, 1], (1, self.heads, d, s)) if transpose_last else ([0, 2, 1, 3], (1, self.heads, s, d))
        return self.op("Transpose", [y.name], out, perm=perm)

    def attention(self, x: T) -> T:
        _, s, h = x.shape
        d = h // self.heads
        q = self.heads_view(self.linear(x, h, "query"))
        k = self.heads_view(self.linear(x, h, "key"), transpose_last=True)
        v = self.heads_view(self.linear(x, h, "value"))
        scores = self.op("MatMul", [q.name, k.name], (1, self.heads, s, s))
        scores = self.op("Div", [scores.name, self.scalar("sqrt_d", math.sqrt(d))], scores.shape)
        probs = self.op("Softmax", [scores.name], scores.shape, axis=-1)
        ctx = self.op("MatMul", [probs.name, v.name], (1, self.heads, s, d))
        ctx = self.op("Transpose", [ctx.name], (1, s, self.heads, d), perm=[0, 2, 1, 3])
        shape = self.g.const("shape", np.array([1, s, h], dtype=np.int64))
        ctx = self.op("Reshape", [ctx.name, shape], (1, s, h))
        out = self.linear(ctx, h, "output")
        return self.layernorm(self.op("Add", [out.name, x.name], x.shape), "attention_ln")

    def gelu(self, x: T) -> T:
        """``0.5 x (1 + erf(x / sqrt 2))`` written as ``h + h * erf(...)`` with ``h = x / 2`` (opset 17
        has no Gelu, and no constant goes into an Add, which parameter counting would take for a bias)."""
        half = self.op("Mul", [x.name, self.scalar("half", 0.5)], x.shape)
        scaled = self.op("Div", [x.name, self.scalar("sqrt2", math.sqrt(2.0))], x.shape)
        erf = self.op("Erf", [scaled.name], x.shape)
        prod = self.op("Mul", [half.name, erf.name], x.shape)
        return self.op("Add", [half.name, prod.name], x.shape, base="gelu")

    def layer(self, x: T, ffn: int) -> T:
        x = self.attention(x)
        y = self.linear(self.gelu(self.linear(x, ffn, "intermediate")), self.hidden, "ffn_output")
        return self.layernorm(self.op("Add", [y.name, x.name], x.shape), "output_ln")


def bert_tiny(resolution: int = 128, num_classes: int = 2, layers: int = 2, seed: int = 0) -> onnx.ModelProto:
    """BERT-tiny encoder over ``resolution`` tokens with a pooler and a ``num_classes``-way head."""
    if resolution > MAX_POSITIONS:
        raise ValueError(f"bert_tiny: sequence length {resolution} exceeds the {MAX_POSITIONS} positions")
    hidden, heads, ffn = 128, 2, 512
    g = GraphBuilder("bert_tiny", resolution, seed)
    enc = _Encoder(g, hidden, heads)
    s = resolution
    g._used.add("input_ids")
    g.inputs.append(helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, s]))
    with g.scope("embeddings"):
        words = enc.weight("word", (VOCAB, hidden))
        positions = enc.weight("position", (MAX_POSITIONS, hidden))
        types = enc.weight("token_type", (TYPES, hidden))
        x = enc.op("Gather", [words, "input_ids"], (1, s, hidden), axis=0)
        pos = enc.op(
            "Gather", [positions, g.const("position_ids", np.arange(s, dtype=np.int64)[None])], (1, s, hidden), axis=0
        )
        typ = enc.op(
            "Gather", [types, g.const("token_type_ids", np.zeros((1, s), dtype=np.int64))], (1, s, hidden), axis=0
        )
        x = enc.op("Add", [enc.op("Add", [x.name, pos.name], x.shape).name, typ.name], x.shape)
        x = enc.layernorm(x, "ln")
    for i in range(layers):
        with g.scope(f"layer{i}"):
            x = enc.layer(x, ffn)
    with g.scope("pooler"):
        first = enc.op("Gather", [x.name, g.const("first", np.array(0, dtype=np.int64))], (1, hidden), axis=1)
        pooled = enc.op("Tanh", [enc.linear(first, hidden, "dense").name], (1, hidden))
    logits = enc.linear(pooled, num_classes, "classifier")
    return g.finish(logits, doc="BERT-tiny (L=2, H=128, A=2) encoder with pooler and classifier")
