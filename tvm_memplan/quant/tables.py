"""Lookup tables of the int8 lowering: a chain of float elementwise ops of one quantized input,
evaluated in float32 numpy for each of its 256 codes, and requantization from one scale to another."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax

from ..relax.ir_utils import constant_value, op_name
from .kernels import INT_RANGE
from .qdq_graph import QDQGraph, QParams, prim_float


def dequantized_codes(q: QParams) -> np.ndarray:
    """The real value of every code of ``q``'s type, in code order (float32, as DequantizeLinear computes)."""
    low, high = INT_RANGE[q.dtype]
    codes = np.arange(low, high + 1, dtype=np.int32)
    return ((codes - q.zero_point).astype(np.float32) * np.float32(q.scale)).astype(np.float32)


def quantized_table(values: np.ndarray, q: QParams) -> np.ndarray:
    """QuantizeLinear of float32 ``values``: divide, round half to even, saturate."""
    low, high = INT_RANGE[q.dtype]
    return np.clip(np.rint(values / np.float32(q.scale)) + q.zero_point, low, high).astype(q.dtype)


def requantization_table(source: QParams, out: QParams) -> np.ndarray:
    return quantized_table(dequantized_codes(source), out)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return (np.float32(1) / (np.float32(1) + np.exp(-x))).astype(np.float32)


ELEMENTWISE: dict[str, Callable[..., np.ndarray]] = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.divide": np.divide,
    "relax.minimum": np.minimum,
    "relax.maximum": np.maximum,
    "relax.sigmoid": sigmoid,
    "relax.tanh": np.tanh,
    "relax.exp": np.exp,
    "relax.nn.relu": lambda x: np.maximum(x, np.float32(0)),
    "relax.clip": lambda x, low, high: np.clip(x, np.float32(low), np.float32(high)),
    "relax.negative": np.negative,
}
"""Elementwise Relax ops a lookup table may contain, in float32 numpy (the same IEEE operations as
onnxruntime's float kernels; exp, tanh and sigmoid may differ in the last float bit)."""


def tabulate(g: QDQGraph, data: relax.Expr) -> tuple[np.ndarray, relax.Expr] | None:
    """``data`` as a function of one dequantized activation, evaluated for each of its 256 codes
    (float32 values), with that activation's quantized source; None where ``data`` is not a tree of
    :data:`ELEMENTWISE` ops of one activation, scalar constants and inner ``dq(q(...))`` used only there."""
    found: list[tuple[relax.Expr, QParams]] = []

    def evaluate(expr: relax.Expr, top: bool) -> np.ndarray | None:
        through = see_through(expr, top)
        if through is not None:
            return through
        source = g.activation(expr)
        if source is not None:
            if found and (not found[0][0].same_as(source[0]) or found[0][1] != source[1]):
                return None
            found.append(source)
            return dequantized_codes(source[1])
        constant = constant_value(expr)
        if constant is None:  # a dequantized constant scalar (a Mul by a quantized constant)
            quantized = g.dequantized_constant(expr)
            if quantized is not None:
                ints, scale, zero_point = quantized
                constant = ((ints.astype(np.int32) - zero_point).astype(np.float32) * scale).astype(np.float32)
        if constant is not None:
            return constant.astype(np.float32).reshape(()) if constant.size == 1 else None
        if not top and not g.single_use(expr):
            return None
        call = g.value(expr)
        name = op_name(call)
        if name not in ELEMENTWISE or expr is call:
            return None
        tensors = [a for a in call.args if isinstance(a, (relax.Var, tvm.ir.GenericConst))]
        operands = [evaluate(a, False) for a in tensors]
        if any(o is None for o in operands):
            return None
        extra = [prim_float(a) for a in call.args if not isinstance(a, (relax.Var, tvm.ir.GenericConst))]
        return np.asarray(ELEMENTWISE[name](*operands, *extra), dtype=np.float32)

    def see_through(expr: relax.Expr, top: bool) -> np.ndarray | None:
        """``dq(q(v))`` of a function ``v`` of the same input, the quantized value used only here
        (EfficientNet's SiLU: ``x * sigmoid(x)`` with the sigmoid quantized in between)."""
        call = g.value(expr)
        if op_name(call) != "relax.dequantize" or not (top or g.single_use(expr)):
            return None
        params = g.activation(expr)
        inner = g.value(call.args[0])
        if params is None or op_name(inner) != "relax.quantize" or not g.single_use(call.args[0]):
            return None
        scale, zero_point = constant_value(inner.args[1]), constant_value(inner.args[2])
        if scale is None or zero_point is None or scale.size != 1 or zero_point.size != 1:
            return None
        if QParams(float(scale.reshape(())), int(zero_point.reshape(())), params[1].dtype) != params[1]:
            return None
        depth = len(found)
        values = evaluate(inner.args[0], False)
        if values is None or values.shape != (256,):
            del found[depth:]
            return None
        codes = quantized_table(values, params[1]).astype(np.int32)
        return ((codes - params[1].zero_point).astype(np.float32) * np.float32(params[1].scale)).astype(np.float32)

    with np.errstate(all="ignore"):
        values = evaluate(data, True)
    if values is None or not found or values.shape != (256,):
        return None
    return values, found[0][0]
