"""Print one lowered TIR device kernel as a GLSL compute shader for Vulkan.

The input is what TVM's GPU pipeline hands ``target.build.vulkan``: flat buffers, thread bindings as
``thread_extent`` attributes, shared/local allocations, barriers as ``tvm_storage_sync`` and
cross-thread reductions already lowered to shared memory (Vulkan targets have ``thread_warp_size`` 1,
so TVM emits no warp shuffles). The calling convention is that of TVM's Vulkan runtime
(``vulkan_wrapped_func.cc``): buffer arguments are storage buffers at bindings 0..n-1 of set 0, and
scalar arguments follow them, each in an 8-byte slot of a push-constant block. Beyond the
push-constant bytes that runtime would pass the scalars in a uniform buffer, which it writes when a
launch is recorded, not when it runs (every queued launch reads the last one's scalars): a kernel
with more scalars than fit is refused, and the Relax pipeline keeps kernels within the limit
(:func:`tvm_memplan.relax.offsets.BakeKernelOffsets`). Whatever has no GLSL form raises a one-line
:class:`UserError` naming the construct and the kernel.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass, field

import tvm
import tvm_ffi

from ...errors import UserError

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
SCALAR_ARG_TYPES = ("int32", "uint32", "int64", "uint64", "float32", "float64")
"""Scalars TVM's runtime packs into 8-byte slots (``PackFuncNonBufferArg``)."""
SLOT_BYTES = 8
DEFAULT_PUSH_CONSTANT_BYTES = 128
"""What every Vulkan device offers (the spec's minimum ``maxPushConstantsSize``), as TVM assumes."""


def push_constant_bytes(target: tvm.target.Target) -> int:
    """The push-constant bytes kernels for ``target`` may use (its ``max_push_constants_size``)."""
    return int(target.attrs.get("max_push_constants_size", DEFAULT_PUSH_CONSTANT_BYTES))


def scalar_slots(target: tvm.target.Target) -> int:
    """How many scalar arguments a kernel for ``target`` can take in push constants."""
    return push_constant_bytes(target) // SLOT_BYTES


HEADER = """#version 450
#extension GL_EXT_shader_explicit_arithmetic_types : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_16bit_storage : require
"""

THREAD_BUILTINS = {"threadIdx": "gl_LocalInvocationID", "blockIdx": "gl_WorkGroupID"}

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
PASSTHROUGH_ATTRS = (
    "pragma_",
    "reduce_scope",
    "storage_alignment",
    "compute_scope",
    "volatile_scope",
    "buffer_bound",
    "double_buffer_scope",
    "async_",
    "device_scope",
)
"""Attributes that only annotate their body: the shader is the body."""


def dtype_of(node: tvm.ir.Expr) -> tvm_ffi.dtype:
    return node.ty.dtype


def glsl_type(dtype: tvm_ffi.dtype, what: str) -> str:
    """The GLSL type of a TIR dtype (scalar or 2-4 lanes)."""
    base = str(dtype.with_lanes(1))
    if base not in SCALAR_TYPES or not 1 <= dtype.lanes <= 4:
        raise _Unsupported(f"type {dtype} ({what})")
    return SCALAR_TYPES[base] if dtype.lanes == 1 else f"{VECTOR_PREFIX[base]}{dtype.lanes}"


def declared(gtype: str) -> str:
    """``gtype`` as declared: floating point ``precise``, so that the driver computes each operation as
    written (no contraction into fma, no reassociation). Without it Mesa's lavapipe rounded the same TIR
    differently depending on the code around it: a kernel fused into a group's launch gave other bits."""
    return f"precise {gtype}" if re.fullmatch(r"float|float16_t|double|vec\d|f16vec\d|dvec\d", gtype) else gtype


class _Unsupported(Exception):
    """Raised inside the printer; :func:`kernel_to_glsl` adds the kernel's name."""


class _TooManyScalars(Exception):
    """The kernel's scalar arguments do not fit in push constants; :func:`kernel_to_glsl` adds its name."""


@dataclass
class Kernel:
    """One compute shader and what TVM's runtime needs to launch it."""

    name: str
    glsl: str
    arg_types: list[str]
    launch_param_tags: list[str]


@dataclass
class _Storage:
    """Where a buffer's data lives in the shader."""

    expr: str
    """The GLSL array: ``b_x.data`` for a storage buffer, the array's name otherwise."""
    dtype: tvm_ffi.dtype
    """The array's element type (bool storage buffers hold ``uint8_t``)."""
    is_bool_bytes: bool = False


@dataclass
class _Printer:
    """Prints one kernel: statements into ``lines``, shared arrays into ``globals``."""

    max_push_constant_bytes: int
    lines: list[str] = field(default_factory=list)
    globals: list[str] = field(default_factory=list)
    helpers: dict[str, str] = field(default_factory=dict)
    names: dict = field(default_factory=dict)
    """Var -> GLSL expression (a name, or a push-constant member)."""
    storage: dict = field(default_factory=dict)
    """Buffer (in TVM 0.27 a Var of BufferType) or handle argument -> _Storage."""
    used: set[str] = field(default_factory=set)
    workgroup: dict[str, int] = field(default_factory=dict)
    indent: int = 1

    # ---- names, types, helpers ----
    def fresh(self, hint: str) -> str:
        base = "v_" + re.sub(r"\W", "_", hint)
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

    def bind(self, var: tvm.tirx.Var) -> str:
        name = self.fresh(var.name)
        self.names[var] = name
        return name

    def helper(self, name: str, dtype: tvm_ffi.dtype) -> str:
        """Instantiate helper ``name`` for ``dtype`` (one overload per GLSL type)."""
        if dtype.lanes > 1 and name not in LANEWISE_HELPERS:
            raise _Unsupported(f"{name.removeprefix('tvm_')} on vectors")
        gtype = glsl_type(dtype, name)
        self.helpers.setdefault(f"{name}:{gtype}", HELPERS[name].replace("T", gtype))
        return name

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.indent + line)

    # ---- expressions ----
    def expr(self, e: tvm.ir.Expr) -> str:
        kind = type(e).__name__
        if kind in ARITH:
            return self.binary(e, ARITH[kind])
        method = getattr(self, f"e_{kind}", None)
        if method is None:
            raise _Unsupported(f"expression {kind}")
        return method(e)

    def e_Var(self, e: tvm.tirx.Var) -> str:
        if e in self.names:
            return self.names[e]
        raise _Unsupported(f"variable {e.name} used outside its definition (or a buffer as a value)")

    e_SizeVar = e_Var

    def e_IntImm(self, e: tvm.tirx.IntImm) -> str:
        dtype, value = dtype_of(e), int(e.value)
        base = str(dtype)
        if base == "bool":
            return "true" if value else "false"
        if base == "int32":
            if value == -(2**31):
                return "(-2147483647 - 1)"  # 2147483648 alone does not fit an int
            return f"({value})" if value < 0 else str(value)
        if base == "int64":
            if value == -(2**63):
                return "(-9223372036854775807l - 1l)"
            return f"({value}l)" if value < 0 else f"{value}l"
        if base == "uint32":
            return f"{value}u"
        if base == "uint64":
            return f"{value}ul"
        return f"{glsl_type(dtype, 'integer constant')}({value})"

    def e_FloatImm(self, e: tvm.tirx.FloatImm) -> str:
        dtype, value = dtype_of(e), float(e.value)
        gtype = glsl_type(dtype, "float constant")
        if math.isnan(value) or math.isinf(value):
            bits = {math.inf: 0x7F800000, -math.inf: 0xFF800000}.get(value, 0x7FC00000)
            text = f"uintBitsToFloat({bits:#x}u)"
            return text if gtype == "float" else f"{gtype}({text})"
        if str(dtype) == "float64":
            return f"({value!r}lf)" if value < 0 else f"{value!r}lf"
        value = struct.unpack("f", struct.pack("f", value))[0]  # float32 round trip: 9 digits are exact
        text = f"{value:.9g}"
        if "e" not in text and "." not in text:
            text += ".0"
        text = f"({text})" if value < 0 else text
        return text if gtype == "float" else f"{gtype}({text})"

    def binary(self, e: tvm.ir.Expr, op: str) -> str:
        return f"({self.expr(e.a)} {op} {self.expr(e.b)})"

    def e_BitwiseNot(self, e: tvm.ir.Expr) -> str:
        return f"(~{self.expr(e.a)})"

    def e_Div(self, e: tvm.ir.Expr) -> str:
        return self.binary(e, "/")  # integers: SPIR-V's OpSDiv truncates, as TIR's Div does

    def call_helper(self, name: str, dtype: tvm_ffi.dtype, *args: tvm.ir.Expr) -> str:
        return f"{self.helper(name, dtype)}({', '.join(self.expr(a) for a in args)})"

    def e_Mod(self, e: tvm.ir.Expr) -> str:
        dtype = dtype_of(e)
        return self.call_helper("tvm_fmod" if dtype.is_float else "tvm_truncmod", dtype, e.a, e.b)

    def e_FloorDiv(self, e: tvm.ir.Expr) -> str:
        dtype = dtype_of(e)
        return self.call_helper("tvm_floordiv_f" if dtype.is_float else "tvm_floordiv", dtype, e.a, e.b)

    def e_FloorMod(self, e: tvm.ir.Expr) -> str:
        dtype = dtype_of(e)
        return self.call_helper("tvm_floormod_f" if dtype.is_float else "tvm_floormod", dtype, e.a, e.b)

    def e_Min(self, e: tvm.ir.Expr) -> str:
        return f"min({self.expr(e.a)}, {self.expr(e.b)})"

    def e_Max(self, e: tvm.ir.Expr) -> str:
        return f"max({self.expr(e.a)}, {self.expr(e.b)})"

    def compare(self, e: tvm.ir.Expr) -> str:
        kind = type(e).__name__
        if dtype_of(e.a).lanes > 1:
            return f"{CMP_VECTOR[kind]}({self.expr(e.a)}, {self.expr(e.b)})"
        return self.binary(e, CMP_SCALAR[kind])

    e_LT = e_LE = e_GT = e_GE = e_EQ = e_NE = compare

    def lanewise(self, e: tvm.ir.Expr, parts: list[str], op: str) -> str:
        """A boolean op on vectors, lane by lane (GLSL's && and || take scalars only)."""
        lanes = dtype_of(e).lanes
        return f"bvec{lanes}({', '.join(f'({parts[0]}[{k}] {op} {parts[1]}[{k}])' for k in range(lanes))})"

    def e_And(self, e: tvm.ir.Expr) -> str:
        if dtype_of(e).lanes > 1:
            return self.lanewise(e, [self.expr(e.a), self.expr(e.b)], "&&")
        return self.binary(e, "&&")

    def e_Or(self, e: tvm.ir.Expr) -> str:
        if dtype_of(e).lanes > 1:
            return self.lanewise(e, [self.expr(e.a), self.expr(e.b)], "||")
        return self.binary(e, "||")

    def e_Not(self, e: tvm.ir.Expr) -> str:
        return f"not({self.expr(e.a)})" if dtype_of(e).lanes > 1 else f"(!{self.expr(e.a)})"

    def e_Select(self, e: tvm.ir.Expr) -> str:
        if dtype_of(e.condition).lanes > 1:
            return f"mix({self.expr(e.false_value)}, {self.expr(e.true_value)}, {self.expr(e.condition)})"
        return f"({self.expr(e.condition)} ? {self.expr(e.true_value)} : {self.expr(e.false_value)})"

    def e_Cast(self, e: tvm.ir.Expr) -> str:
        return self.cast(self.expr(e.value), dtype_of(e.value), dtype_of(e))

    def cast(self, text: str, source: tvm_ffi.dtype, dtype: tvm_ffi.dtype) -> str:
        gtype = glsl_type(dtype, "cast")
        if source.is_bool and not dtype.is_bool:
            if dtype.lanes > 1:
                return f"mix({gtype}(0), {gtype}(1), {text})"
            return f"({text} ? {gtype}(1) : {gtype}(0))"
        if dtype.is_bool and not source.is_bool:
            zero = f"{glsl_type(source, 'cast')}(0)"
            return f"notEqual({text}, {zero})" if dtype.lanes > 1 else f"({text} != {zero})"
        return f"{gtype}({text})"

    def e_Broadcast(self, e: tvm.ir.Expr) -> str:
        return f"{glsl_type(dtype_of(e), 'broadcast')}({self.expr(e.value)})"

    def e_Ramp(self, e: tvm.ir.Expr) -> str:
        return f"{glsl_type(dtype_of(e), 'ramp')}({', '.join(self.ramp_lanes(e))})"

    def ramp_lanes(self, e: tvm.ir.Expr) -> list[str]:
        base, stride = self.expr(e.base), self.expr(e.stride)
        return [
            base if k == 0 else f"({base} + {stride} * {self.e_IntImm(tvm.tirx.IntImm(str(dtype_of(e.base)), k))})"
            for k in range(int(e.lanes))
        ]

    def e_Shuffle(self, e: tvm.ir.Expr) -> str:
        if len(e.vectors) == 1 and len(e.indices) == 1:
            return f"{self.expr(e.vectors[0])}[{self.expr(e.indices[0])}]"
        raise _Unsupported("vector shuffle")

    def e_StringImm(self, e: tvm.ir.Expr) -> str:
        raise _Unsupported(f"string {e.value!r} as a value")

    # ---- buffers ----
    def buffer_storage(self, buffer: tvm.tirx.Var) -> _Storage:
        if buffer not in self.storage:
            raise _Unsupported(f"buffer {buffer.name} that is neither an argument nor allocated in the kernel")
        return self.storage[buffer]

    def element_indices(
        self, buffer: tvm.tirx.Var, indices: list[tvm.ir.Expr], lanes: int
    ) -> tuple[_Storage, list[str] | str]:
        """The storage and, per lane, the GLSL index into it (one string when the access is whole)."""
        if len(indices) != 1:
            raise _Unsupported(f"multi-dimensional access to {buffer.name} (the buffer was not flattened)")
        store = self.buffer_storage(buffer)
        index = indices[0]
        index_dtype = dtype_of(index)
        if lanes == store.dtype.lanes:
            if index_dtype.lanes != 1:
                raise _Unsupported(f"vector index into {buffer.name}")
            return store, self.index(self.expr(index), index_dtype)
        if store.dtype.lanes != 1 or index_dtype.lanes != lanes:
            raise _Unsupported(f"{lanes}-lane access to {buffer.name} of {store.dtype}")
        if type(index).__name__ == "Ramp":
            parts = self.ramp_lanes(index)
        else:
            text = self.expr(index)
            parts = [f"{text}[{k}]" for k in range(lanes)]
        scalar = index_dtype.with_lanes(1)
        return store, [self.index(p, scalar) for p in parts]

    @staticmethod
    def index(text: str, dtype: tvm_ffi.dtype) -> str:
        return text if str(dtype) == "int32" else f"int({text})"  # GLSL indexes arrays with int

    def load_element(self, store: _Storage, index: str) -> str:
        text = f"{store.expr}[{index}]"
        return f"({text} != uint8_t(0))" if store.is_bool_bytes else text

    def e_TensorLoad(self, e: tvm.ir.Expr) -> str:
        """A buffer load (TVM 0.27's ``BufferLoad`` builds an ``ir.TensorLoad`` from the buffer)."""
        dtype = dtype_of(e)
        store, index = self.element_indices(e.source, e.indices, dtype.lanes)
        self.check_view(e.source, store, dtype)
        if isinstance(index, str):
            return self.load_element(store, index)
        return f"{glsl_type(dtype, 'load')}({', '.join(self.load_element(store, i) for i in index)})"

    def check_view(self, buffer: tvm.tirx.Var, store: _Storage, dtype: tvm_ffi.dtype) -> None:
        element = dtype.with_lanes(1)
        stored = tvm_ffi.dtype("bool") if store.is_bool_bytes else store.dtype.with_lanes(1)
        if element != stored:
            raise _Unsupported(f"{buffer.name} accessed as {dtype} over {stored} storage")

    # ---- calls ----
    @staticmethod
    def op_name(call: tvm.ir.Call) -> str:
        name = str(getattr(call.op, "name", call.op))
        return name.split(".", 1)[1] if name.startswith(OP_NAMESPACES) else name

    def e_Call(self, e: tvm.ir.Expr) -> str:
        op = self.op_name(e)
        args = list(e.args)
        dtype = dtype_of(e)
        if op in ("call_pure_extern", "call_extern"):
            return self.math(str(args[0].value), args[1:], dtype)
        if op == "if_then_else":
            if dtype_of(args[0]).lanes > 1:
                raise _Unsupported("if_then_else on vectors")
            return f"({self.expr(args[0])} ? {self.expr(args[1])} : {self.expr(args[2])})"
        if op in ("likely", "tvm_thread_invariant"):  # hints: the value is the condition itself
            return self.expr(args[0])
        if op in CALL_BINARY:
            return f"({self.expr(args[0])} {CALL_BINARY[op]} {self.expr(args[1])})"
        if op == "bitwise_not":
            return f"(~{self.expr(args[0])})"
        if op in ("isnan", "isinf"):
            return f"{op}({self.expr(args[0])})"
        if op == "isfinite":
            x = self.expr(args[0])
            return f"(!(isnan({x}) || isinf({x})))"
        if op == "fma":
            return f"fma({', '.join(self.expr(a) for a in args)})"
        if op == "popcount":
            return f"{glsl_type(dtype, 'popcount')}(bitCount({self.expr(args[0])}))"
        if op == "reinterpret":
            return self.reinterpret(args[0], dtype)
        if op in UNARY_MATH or op in BINARY_MATH or op in HELPER_MATH or op == "abs":
            return self.math(op, args, dtype)
        raise _Unsupported(f"call to {op}")

    def math(self, name: str, args: list[tvm.ir.Expr], dtype: tvm_ffi.dtype) -> str:
        """A math function by its TIR name (``exp``) or C name (``expf``, ``exp``, ``__expf``)."""
        if not dtype.is_float:
            if name == "abs":
                return f"abs({self.expr(args[0])})"
            raise _Unsupported(f"call to {name} on {dtype}")
        base = name.removeprefix("__")
        if base not in UNARY_MATH and base not in BINARY_MATH and base not in HELPER_MATH and base.endswith("f"):
            base = base[:-1]
        base = "fabs" if base == "abs" else base
        if base in UNARY_MATH and len(args) == 1:
            return f"{UNARY_MATH[base]}({self.expr(args[0])})"
        if base in HELPER_MATH and len(args) == 1:
            return self.call_helper(HELPER_MATH[base], dtype, args[0])
        if base in BINARY_MATH and len(args) == 2:
            function = BINARY_MATH[base]
            if function in HELPERS:
                return self.call_helper(function, dtype, *args)
            return f"{function}({self.expr(args[0])}, {self.expr(args[1])})"
        raise _Unsupported(f"call to {name}")

    def reinterpret(self, value: tvm.ir.Expr, dtype: tvm_ffi.dtype) -> str:
        source = dtype_of(value)
        functions = {
            ("float32", "int32"): "floatBitsToInt",
            ("float32", "uint32"): "floatBitsToUint",
            ("int32", "float32"): "intBitsToFloat",
            ("uint32", "float32"): "uintBitsToFloat",
        }
        key = (str(source.with_lanes(1)), str(dtype.with_lanes(1)))
        if key not in functions:
            raise _Unsupported(f"reinterpret {source} as {dtype}")
        return f"{functions[key]}({self.expr(value)})"

    def e_Let(self, e: tvm.ir.Expr) -> str:
        """GLSL has no let: the value is substituted (TIR expressions are pure, so only the text grows)."""
        self.names[e.var] = f"({self.expr(e.value)})"
        return self.expr(e.body)

    # ---- statements ----
    def stmt(self, s: tvm.tirx.Stmt) -> None:
        kind = type(s).__name__
        method = getattr(self, f"s_{kind}", None)
        if method is None:
            raise _Unsupported(f"statement {kind}")
        method(s)

    def block(self, s: tvm.tirx.Stmt) -> None:
        self.indent += 1
        self.stmt(s)
        self.indent -= 1

    def s_SeqStmt(self, s: tvm.tirx.Stmt) -> None:
        for item in s.seq:
            self.stmt(item)

    def s_Bind(self, s: tvm.tirx.Stmt) -> None:
        value = self.expr(s.value)
        self.emit(f"{declared(glsl_type(dtype_of(s.var), 'variable ' + s.var.name))} {self.bind(s.var)} = {value};")

    def s_LetStmt(self, s: tvm.tirx.Stmt) -> None:
        self.emit("{")
        self.indent += 1
        self.s_Bind(s)
        self.stmt(s.body)
        self.indent -= 1
        self.emit("}")

    def s_DeclBuffer(self, s: tvm.tirx.Stmt) -> None:
        source = s.data
        if type(source).__name__ == "Call" and self.op_name(source) == "buffer_data":
            source = source.args[0]  # a view of another buffer's data
        if source not in self.storage:
            raise _Unsupported(f"buffer {s.buffer.name} declared over {type(source).__name__}")
        self.storage[s.buffer] = self.storage[source]

    def s_AllocBuffer(self, s: tvm.tirx.Stmt) -> None:
        buffer = s.buffer
        scope = buffer.scope()
        extent = 1
        for dim in buffer.shape:
            if type(dim).__name__ != "IntImm":
                raise _Unsupported(f"allocation {buffer.name} of dynamic size")
            extent *= int(dim.value)
        dtype = tvm_ffi.dtype(str(buffer.dtype))
        gtype = declared(glsl_type(dtype, f"allocation {buffer.name}"))
        name = self.fresh(buffer.name)
        if scope in ("shared", "shared.dyn"):
            self.globals.append(f"shared {gtype} {name}[{extent}];")
        elif scope in ("local", "local.var", "global", ""):
            self.emit(f"{gtype} {name}[{extent}];")
        else:
            raise _Unsupported(f"allocation {buffer.name} in {scope!r} memory")
        self.storage[buffer] = _Storage(name, dtype)

    def s_AttrStmt(self, s: tvm.tirx.Stmt) -> None:
        key = str(s.attr_key)
        if key == "thread_extent":
            self.thread(s)
        elif key.startswith(PASSTHROUGH_ATTRS):
            self.stmt(s.body)
        else:
            raise _Unsupported(f"attribute {key!r}")

    def thread(self, s: tvm.tirx.Stmt) -> None:
        iter_var = s.node
        tag = str(iter_var.thread_tag)
        kind, _, axis = tag.partition(".")
        if kind not in THREAD_BUILTINS or axis not in ("x", "y", "z"):
            raise _Unsupported(f"thread binding {tag!r}")
        if kind == "threadIdx":
            if type(s.value).__name__ != "IntImm":
                raise _Unsupported(f"{tag} with a dynamic extent")
            extent = int(s.value.value)
            if self.workgroup.setdefault(axis, extent) != extent:
                raise _Unsupported(f"{tag} bound with two extents")
        var = iter_var.var
        gtype = glsl_type(dtype_of(var), tag)
        self.emit(f"{gtype} {self.bind(var)} = {gtype}({THREAD_BUILTINS[kind]}.{axis});")
        self.stmt(s.body)

    def s_For(self, s: tvm.tirx.Stmt) -> None:
        var = s.loop_var
        gtype = glsl_type(dtype_of(var), f"loop variable {var.name}")
        start, extent = self.expr(s.min), self.expr(s.extent)
        step = self.expr(s.step) if getattr(s, "step", None) is not None else None
        name = self.bind(var)
        bound = extent if start in ("0", "0l") else f"{start} + {extent}"
        increment = f"{name} += {step}" if step is not None else f"++{name}"
        self.emit(f"for ({gtype} {name} = {start}; {name} < {bound}; {increment}) {{")
        self.block(s.body)
        self.emit("}")

    def s_While(self, s: tvm.tirx.Stmt) -> None:
        self.emit(f"while ({self.expr(s.condition)}) {{")
        self.block(s.body)
        self.emit("}")

    def s_IfThenElse(self, s: tvm.tirx.Stmt) -> None:
        self.emit(f"if ({self.expr(s.condition)}) {{")
        self.block(s.then_case)
        if s.else_case is not None:
            self.emit("} else {")
            self.block(s.else_case)
        self.emit("}")

    def s_BufferStore(self, s: tvm.tirx.Stmt) -> None:
        if getattr(s, "predicate", None) is not None:
            raise _Unsupported(f"predicated store to {s.buffer.name}")
        dtype = dtype_of(s.value)
        store, index = self.element_indices(s.buffer, s.indices, dtype.lanes)
        self.check_view(s.buffer, store, dtype)
        value = self.expr(s.value)
        if isinstance(index, str):
            self.emit(f"{store.expr}[{index}] = {self.stored(store, value)};")
            return
        temp = self.fresh("lanes")
        self.emit(f"{declared(glsl_type(dtype, 'store'))} {temp} = {value};")
        for k, i in enumerate(index):
            self.emit(f"{store.expr}[{i}] = {self.stored(store, f'{temp}[{k}]')};")

    @staticmethod
    def stored(store: _Storage, value: str) -> str:
        return f"({value} ? uint8_t(1) : uint8_t(0))" if store.is_bool_bytes else value

    def s_Evaluate(self, s: tvm.tirx.Stmt) -> None:
        value = s.value
        kind = type(value).__name__
        if kind == "IntImm":
            return
        if kind == "Call" and self.op_name(value) == "tvm_storage_sync":
            scope = str(value.args[0].value)
            if scope not in ("shared", "shared.dyn", "warp"):
                raise _Unsupported(f"tvm_storage_sync({scope!r})")
            if scope != "warp":  # one thread per warp on Vulkan targets: nothing to wait for
                # glslang's barrier() for Vulkan is OpControlBarrier with AcquireRelease|WorkgroupMemory
                self.emit("barrier();")
            return
        if kind == "Call":
            op = self.op_name(value)
            called = str(value.args[0].value) if op in ("call_extern", "call_pure_extern") else op
            raise _Unsupported(f"call to {called} as a statement")
        raise _Unsupported(f"statement {kind}")

    def s_Break(self, s: tvm.tirx.Stmt) -> None:
        self.emit("break;")

    def s_Continue(self, s: tvm.tirx.Stmt) -> None:
        self.emit("continue;")

    # ---- the kernel ----
    def arguments(self, func: tvm.tirx.PrimFunc) -> tuple[list[str], list[str]]:
        """Declare the buffers and scalars; returns (arg_types, declarations)."""
        arg_types, declarations, scalars = [], [], []
        restrict = "restrict " if func.attrs.get("tirx.noalias", False) else ""
        seen_scalar = False
        for param in func.params:
            ty = param.ty
            if type(ty).__name__ == "PointerType":
                if seen_scalar:
                    raise _Unsupported(f"buffer argument {param.name} after a scalar one")
                element = tvm_ffi.dtype(str(ty.element_type.dtype))
                binding = len(arg_types)
                name = self.fresh(param.name)
                is_bool = element.is_bool
                gtype = "uint8_t" if is_bool else declared(glsl_type(element, f"argument {param.name}"))
                declarations.append(
                    f"layout(std430, set = 0, binding = {binding}) {restrict}buffer B{binding} "
                    f"{{ {gtype} data[]; }} {name};"
                )
                self.storage[param] = _Storage(f"{name}.data", element, is_bool)
                arg_types.append("handle")
            else:
                seen_scalar = True
                dtype = str(ty.dtype)
                if dtype not in SCALAR_ARG_TYPES:
                    raise _Unsupported(f"scalar argument {param.name} of type {dtype}")
                scalars.append((param, dtype))
                arg_types.append(dtype)
        if len(scalars) * SLOT_BYTES > self.max_push_constant_bytes:
            raise _TooManyScalars(
                f"{len(scalars)} scalar arguments ({len(scalars) * SLOT_BYTES} bytes), more than the "
                f"{self.max_push_constant_bytes} bytes of push constants (TVM's Vulkan runtime would pass "
                "them in a uniform buffer that launches still queued overwrite)"
            )
        if scalars:
            members = []
            for slot, (param, dtype) in enumerate(scalars):
                member = self.fresh(param.name)
                members.append(f"layout(offset = {slot * SLOT_BYTES}) {SCALAR_TYPES[dtype]} {member};")
                self.names[param] = f"args.{member}"
            declarations.append(f"layout(push_constant) uniform Args {{ {' '.join(members)} }} args;")
        return arg_types, declarations


def kernel_to_glsl(
    name: str, func: tvm.tirx.PrimFunc, max_push_constant_bytes: int = DEFAULT_PUSH_CONSTANT_BYTES
) -> Kernel:
    """The GLSL compute shader of one device kernel, or a one-line UserError naming what it cannot print."""
    printer = _Printer(max_push_constant_bytes)
    try:
        arg_types, declarations = printer.arguments(func)
        printer.stmt(func.body)
    except _Unsupported as exc:
        raise UserError(f"Vulkan code generator: kernel {name} uses {exc}, which has no GLSL form here") from None
    except _TooManyScalars as exc:
        raise UserError(f"Vulkan code generator: kernel {name} takes {exc}") from None
    size = printer.workgroup
    layout = (
        f"layout(local_size_x = {size.get('x', 1)}, local_size_y = {size.get('y', 1)}, "
        f"local_size_z = {size.get('z', 1)}) in;"
    )
    source = "\n".join(
        [
            HEADER,
            layout,
            *declarations,
            *printer.globals,
            *printer.helpers.values(),
            "void main() {",
            *printer.lines,
            "}",
            "",
        ]
    )
    tags = [str(t) for t in func.attrs.get("tirx.kernel_launch_params", [])]
    return Kernel(name, source, arg_types, tags)
