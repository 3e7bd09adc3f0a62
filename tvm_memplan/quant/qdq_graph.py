"""A QDQ Relax function as ``LowerQDQ`` reads it: quantization parameters, constants seen through
their dequantize, use counts, and the float clamps a kernel's output range absorbs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from ..relax.ir_utils import constant_value, op_name, static_shape, top_level_bindings
from .kernels import INT_RANGE


@dataclass(frozen=True)
class QParams:
    """Per-tensor quantization of an activation."""

    scale: float
    zero_point: int
    dtype: str


def prim_float(expr: relax.Expr) -> float | None:
    value = getattr(expr, "value", None)
    if value is None:
        return None
    inner = getattr(value, "value", value)
    try:
        return float(inner)
    except (TypeError, ValueError):
        return None


def tensor_dtype(expr: relax.Expr) -> str:
    return str(expr.ty.dtype)


class QDQGraph:
    """The bindings of one Relax function: definitions and how often each var is used."""

    def __init__(self, func: relax.Function) -> None:
        self.defs: dict[relax.Var, relax.Expr] = {}
        self.uses: dict[relax.Var, int] = {}
        for binding in top_level_bindings(func):
            if isinstance(binding, relax.VarBinding):
                self.defs[binding.var] = binding.value
                self._count(binding.value)
        self._count(func.body.body)

    def _count(self, expr: relax.Expr) -> None:
        if isinstance(expr, relax.Var):
            self.uses[expr] = self.uses.get(expr, 0) + 1
        elif isinstance(expr, relax.Call):
            for arg in expr.args:
                self._count(arg)
        elif isinstance(expr, relax.Tuple):
            for field in expr.fields:
                self._count(field)
        elif isinstance(expr, relax.TupleGetItem):
            self._count(expr.tuple_value)

    def value(self, expr: relax.Expr) -> relax.Expr:
        return self.defs.get(expr, expr) if isinstance(expr, relax.Var) else expr

    def single_use(self, expr: relax.Expr) -> bool:
        return isinstance(expr, relax.Var) and self.uses.get(expr, 0) == 1

    def activation(self, expr: relax.Expr) -> tuple[relax.Expr, QParams] | None:
        """``expr = dequantize(x, scale, zp)`` of a non-constant int8/uint8 ``x`` with per-tensor
        parameters: (x, its parameters)."""
        call = self.value(expr)
        if op_name(call) != "relax.dequantize":
            return None
        data, scale, zero_point = call.args
        if isinstance(data, tvm.ir.GenericConst) or tensor_dtype(data) not in INT_RANGE:
            return None
        s, z = constant_value(scale), constant_value(zero_point)
        if s is None or z is None or s.size != 1 or z.size != 1:
            return None
        return data, QParams(float(s.reshape(())), int(z.reshape(())), tensor_dtype(data))

    def _quantized_constant(self, expr: relax.Expr) -> np.ndarray | None:
        """``quantize(float constant)`` computed here (PyTorch's exports quantize float weights in the
        graph): divide, round half to even, saturate, as QuantizeLinear."""
        call = self.value(expr)
        if op_name(call) != "relax.quantize":
            return None
        values, scale, zero_point = (constant_value(a) for a in call.args)
        dtype = str(call.attrs.out_dtype)
        if values is None or scale is None or zero_point is None or dtype not in INT_RANGE:
            return None
        shape = [1] * values.ndim
        if scale.size > 1:
            shape[int(call.attrs.axis) % values.ndim] = scale.size
        scale = scale.astype(np.float32).reshape(shape if scale.size > 1 else ())
        zero_point = zero_point.astype(np.int64).reshape(shape if zero_point.size > 1 else ())
        low, high = INT_RANGE[dtype]
        return np.clip(np.rint(values.astype(np.float32) / scale) + zero_point, low, high).astype(dtype)

    def float_constant(self, expr: relax.Expr) -> np.ndarray | None:
        """``expr = [reshape](float constant)``: a bias PyTorch's exports leave in float."""
        call = self.value(expr)
        while op_name(call) == "relax.reshape":
            call = self.value(call.args[0])
        values = constant_value(call)
        return values if values is not None and values.dtype == np.float32 else None

    def dequantized_constant(self, expr: relax.Expr) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``expr = [reshape|permute_dims](dequantize(constant, scale, zp))``: (integers, scale, zp),
        scale and zp broadcast to the integers' shape, the data movement applied."""
        call = self.value(expr)
        moves = []
        while op_name(call) in ("relax.reshape", "relax.permute_dims"):
            moves.append(call)
            call = self.value(call.args[0])
        if op_name(call) != "relax.dequantize":
            return None
        values, scale, zero_point = (constant_value(a) for a in call.args)
        if values is None:
            values = self._quantized_constant(call.args[0])
        if values is None or scale is None or zero_point is None:
            return None
        axis = int(call.attrs.axis) % max(values.ndim, 1)
        shape = [1] * values.ndim
        if scale.size > 1:
            shape[axis] = scale.size
        scale = np.broadcast_to(scale.astype(np.float32).reshape(shape if scale.size > 1 else ()), values.shape)
        zero_shape = shape if zero_point.size > 1 else ()
        zero_point = np.broadcast_to(zero_point.astype(np.int64).reshape(zero_shape), values.shape)
        arrays = [values, scale, zero_point]
        for move in reversed(moves):
            if op_name(move) == "relax.reshape":
                target = static_shape(move.ty)
                if target is None:
                    return None
                arrays = [a.reshape(target) for a in arrays]
            else:
                axes = move.attrs.axes
                arrays = [np.transpose(a, None if axes is None else [int(x) for x in axes]) for a in arrays]
        return arrays[0], arrays[1], arrays[2]


@dataclass
class Clamp:
    low: float = -np.inf
    high: float = np.inf

    def bounds(self, q: QParams) -> tuple[int, int]:
        """The output's quantized range with this float clamp folded in (quantize is monotonic)."""
        low, high = INT_RANGE[q.dtype]
        if np.isfinite(self.low):
            low = max(low, quantize_scalar(self.low, q))
        if np.isfinite(self.high):
            high = min(high, quantize_scalar(self.high, q))
        return low, high


def quantize_scalar(value: float, q: QParams) -> int:
    low, high = INT_RANGE[q.dtype]
    return int(np.clip(np.rint(np.float32(value) / np.float32(q.scale)) + q.zero_point, low, high))


def called_functions(func: relax.Function) -> list[tvm.ir.GlobalVar]:
    """The GlobalVars ``func``'s bindings call (through call_tir or directly)."""
    found = []
    for binding in top_level_bindings(func):
        value = binding.value
        if isinstance(value, relax.Call):
            found += [item for item in [value.op, *value.args] if isinstance(item, tvm.ir.GlobalVar)]
    return found


def has_qdq(func: relax.Function) -> bool:
    """Whether ``func`` quantizes anything (a QDQ model)."""
    return any(op_name(binding.value) == "relax.quantize" for binding in top_level_bindings(func))
