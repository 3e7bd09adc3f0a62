"""What TIR's types and operators are in GLSL: scalar and vector types, operator and math-function
names, and the helper functions GLSL lacks (floor division on integers, erf, ...), shared by the
expression and kernel printers of :mod:`tvm_memplan.backends.vulkan.glsl`."""

from __future__ import annotations

import re

import tvm
import tvm_ffi

SCALAR_TYPES = {
    "float32": "float",
    "float16": "float16_t",
    "float64": "double",
    "bool": "bool",
    "int8": "int8_t",
    "int16": "int16_t",
    "int32": "int",
    "int64": "int64_t",
    "uint8": "uint8_t",
    "uint16": "uint16_t",
    "uint32": "uint",
    "uint64": "uint64_t",
}
VECTOR_PREFIX = {
    "float32": "vec",
    "float16": "f16vec",
    "float64": "dvec",
    "bool": "bvec",
    "int8": "i8vec",
    "int16": "i16vec",
    "int32": "ivec",
    "int64": "i64vec",
    "uint8": "u8vec",
    "uint16": "u16vec",
    "uint32": "uvec",
    "uint64": "u64vec",
}

# Math on floats: TIR intrinsics (``tirx.exp``) and the C names LowerIntrin turns them into (``expf``).
UNARY_MATH = {
    "exp": "exp",
    "exp2": "exp2",
    "log": "log",
    "log2": "log2",
    "sqrt": "sqrt",
    "rsqrt": "inversesqrt",
    "tanh": "tanh",
    "sin": "sin",
    "cos": "cos",
    "tan": "tan",
    "asin": "asin",
    "acos": "acos",
    "atan": "atan",
    "sinh": "sinh",
    "cosh": "cosh",
    "asinh": "asinh",
    "acosh": "acosh",
    "atanh": "atanh",
    "fabs": "abs",
    "floor": "floor",
    "ceil": "ceil",
    "trunc": "trunc",
    "round": "roundEven",
    "nearbyint": "roundEven",
    "rint": "roundEven",
}
BINARY_MATH = {
    "pow": "pow",
    "fmin": "min",
    "fmax": "max",
    "atan2": "atan",
    "fmod": "tvm_fmod",
    "copysign": "tvm_copysign",
}
HELPER_MATH = {
    "erf": "tvm_erf",
    "log10": "tvm_log10",
    "log1p": "tvm_log1p",
    "expm1": "tvm_expm1",
    "sigmoid": "tvm_sigmoid",
}

# Helper functions by name; ``T`` is replaced by the GLSL type they are instantiated for.
HELPERS = {
    # Abramowitz and Stegun 7.1.26, |error| < 1.5e-7: float32 rounding is of the same order.
    "tvm_erf": "T tvm_erf(T x) { T t = T(1) / (T(1) + T(0.3275911) * abs(x)); "
    "T y = T(1) - (((((T(1.061405429) * t - T(1.453152027)) * t) + T(1.421413741)) * t - T(0.284496736)) * t "
    "+ T(0.254829592)) * t * exp(-x * x); return sign(x) * y; }",
    "tvm_log10": "T tvm_log10(T x) { return log2(x) * T(0.30102999566398120); }",
    "tvm_log1p": "T tvm_log1p(T x) { return log(T(1) + x); }",
    "tvm_expm1": "T tvm_expm1(T x) { return exp(x) - T(1); }",
    "tvm_sigmoid": "T tvm_sigmoid(T x) { return T(1) / (T(1) + exp(-x)); }",
    "tvm_fmod": "T tvm_fmod(T a, T b) { return a - b * trunc(a / b); }",
    "tvm_copysign": "T tvm_copysign(T a, T b) { return (b < T(0)) == (a < T(0)) ? a : -a; }",
    "tvm_floordiv_f": "T tvm_floordiv_f(T a, T b) { return floor(a / b); }",
    "tvm_floormod_f": "T tvm_floormod_f(T a, T b) { return a - b * floor(a / b); }",
    "tvm_truncmod": "T tvm_truncmod(T a, T b) { return a - (a / b) * b; }",
    "tvm_floordiv": "T tvm_floordiv(T a, T b) { T q = a / b; T r = a - q * b; "
    "return (r != T(0) && ((r < T(0)) != (b < T(0)))) ? q - T(1) : q; }",
    "tvm_floormod": "T tvm_floormod(T a, T b) { T r = a - (a / b) * b; "
    "return (r != T(0) && ((r < T(0)) != (b < T(0)))) ? r + b : r; }",
}
LANEWISE_HELPERS = (
    "tvm_erf",
    "tvm_log10",
    "tvm_log1p",
    "tvm_expm1",
    "tvm_sigmoid",
    "tvm_fmod",
    "tvm_floordiv_f",
    "tvm_floormod_f",
)
"""Helpers that are correct lane by lane on vectors (the others compare with scalar ``?:``)."""

CMP_SCALAR = {"LT": "<", "LE": "<=", "GT": ">", "GE": ">=", "EQ": "==", "NE": "!="}
CMP_VECTOR = {
    "LT": "lessThan",
    "LE": "lessThanEqual",
    "GT": "greaterThan",
    "GE": "greaterThanEqual",
    "EQ": "equal",
    "NE": "notEqual",
}
ARITH = {
    "Add": "+",
    "Sub": "-",
    "Mul": "*",
    "BitwiseAnd": "&",
    "BitwiseOr": "|",
    "BitwiseXor": "^",
    "LShift": "<<",
    "RShift": ">>",
}
CALL_BINARY = {"shift_left": "<<", "shift_right": ">>", "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}
OP_NAMESPACES = ("tirx.", "prim.")
"""TIR's operators are registered as ``tirx.exp`` or ``prim.if_then_else``: the printer uses the last part."""


class Unsupported(Exception):
    """A TIR construct with no GLSL form; :func:`~tvm_memplan.backends.vulkan.glsl.kernel_to_glsl` adds the
    kernel's name."""


def dtype_of(node: tvm.ir.Expr) -> tvm_ffi.dtype:
    return node.ty.dtype


def glsl_type(dtype: tvm_ffi.dtype, what: str) -> str:
    """The GLSL type of a TIR dtype (scalar or 2-4 lanes)."""
    base = str(dtype.with_lanes(1))
    if base not in SCALAR_TYPES or not 1 <= dtype.lanes <= 4:
        raise Unsupported(f"type {dtype} ({what})")
    return SCALAR_TYPES[base] if dtype.lanes == 1 else f"{VECTOR_PREFIX[base]}{dtype.lanes}"


def declared(gtype: str) -> str:
    """``gtype`` as declared: floating point ``precise``, so that the driver computes each operation as
    written (no contraction into fma, no reassociation). Without it Mesa's lavapipe rounded the same TIR
    differently depending on the code around it: a kernel fused into a group's launch gave other bits."""
    return f"precise {gtype}" if re.fullmatch(r"float|float16_t|double|vec\d|f16vec\d|dvec\d", gtype) else gtype
