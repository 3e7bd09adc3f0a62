"""TIR expressions as GLSL expressions: constants, arithmetic, comparisons, casts, vector lanes,
buffer loads and calls (math functions, bit casts); the statement and kernel printer in
:mod:`tvm_memplan.backends.vulkan.glsl` builds on it."""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass, field

import tvm
import tvm_ffi

from ...names import unique_name
from .glsl_language import (
    ARITH,
    BINARY_MATH,
    CALL_BINARY,
    CMP_SCALAR,
    CMP_VECTOR,
    HELPER_MATH,
    HELPERS,
    LANEWISE_HELPERS,
    OP_NAMESPACES,
    UNARY_MATH,
    Unsupported,
    dtype_of,
    glsl_type,
)


@dataclass
class Storage:
    """Where a buffer's data lives in the shader."""

    expr: str
    """The GLSL array: ``b_x.data`` for a storage buffer, the array's name otherwise."""
    dtype: tvm_ffi.dtype
    """The array's element type (bool storage buffers hold ``uint8_t``)."""
    is_bool_bytes: bool = False


@dataclass
class ExpressionPrinter:
    """Prints expressions of one kernel, instantiating the helper functions they call."""

    helpers: dict[str, str] = field(default_factory=dict)
    names: dict = field(default_factory=dict)
    """Var -> GLSL expression (a name, or a push-constant member)."""
    storage: dict = field(default_factory=dict)
    """Buffer (in TVM 0.27 a Var of BufferType) or handle argument -> Storage."""
    used: set[str] = field(default_factory=set)

    # ---- names, types, helpers ----
    def fresh(self, hint: str) -> str:
        return unique_name("v_" + re.sub(r"\W", "_", hint), self.used)

    def bind(self, var: tvm.tirx.Var) -> str:
        name = self.fresh(var.name)
        self.names[var] = name
        return name

    def helper(self, name: str, dtype: tvm_ffi.dtype) -> str:
        """Instantiate helper ``name`` for ``dtype`` (one overload per GLSL type)."""
        if dtype.lanes > 1 and name not in LANEWISE_HELPERS:
            raise Unsupported(f"{name.removeprefix('tvm_')} on vectors")
        gtype = glsl_type(dtype, name)
        self.helpers.setdefault(f"{name}:{gtype}", HELPERS[name].replace("T", gtype))
        return name

    # ---- expressions ----
    def expr(self, e: tvm.ir.Expr) -> str:
        kind = type(e).__name__
        if kind in ARITH:
            return self.binary(e, ARITH[kind])
        method = getattr(self, f"e_{kind}", None)
        if method is None:
            raise Unsupported(f"expression {kind}")
        return method(e)

    def e_Var(self, e: tvm.tirx.Var) -> str:
        if e in self.names:
            return self.names[e]
        raise Unsupported(f"variable {e.name} used outside its definition (or a buffer as a value)")

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
        raise Unsupported("vector shuffle")

    def e_StringImm(self, e: tvm.ir.Expr) -> str:
        raise Unsupported(f"string {e.value!r} as a value")

    # ---- buffers ----
    def buffer_storage(self, buffer: tvm.tirx.Var) -> Storage:
        if buffer not in self.storage:
            raise Unsupported(f"buffer {buffer.name} that is neither an argument nor allocated in the kernel")
        return self.storage[buffer]

    def element_indices(
        self, buffer: tvm.tirx.Var, indices: list[tvm.ir.Expr], lanes: int
    ) -> tuple[Storage, list[str] | str]:
        """The storage and, per lane, the GLSL index into it (one string when the access is whole)."""
        if len(indices) != 1:
            raise Unsupported(f"multi-dimensional access to {buffer.name} (the buffer was not flattened)")
        store = self.buffer_storage(buffer)
        index = indices[0]
        index_dtype = dtype_of(index)
        if lanes == store.dtype.lanes:
            if index_dtype.lanes != 1:
                raise Unsupported(f"vector index into {buffer.name}")
            return store, self.index(self.expr(index), index_dtype)
        if store.dtype.lanes != 1 or index_dtype.lanes != lanes:
            raise Unsupported(f"{lanes}-lane access to {buffer.name} of {store.dtype}")
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

    def load_element(self, store: Storage, index: str) -> str:
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

    def check_view(self, buffer: tvm.tirx.Var, store: Storage, dtype: tvm_ffi.dtype) -> None:
        element = dtype.with_lanes(1)
        stored = tvm_ffi.dtype("bool") if store.is_bool_bytes else store.dtype.with_lanes(1)
        if element != stored:
            raise Unsupported(f"{buffer.name} accessed as {dtype} over {stored} storage")

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
                raise Unsupported("if_then_else on vectors")
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
        raise Unsupported(f"call to {op}")

    def math(self, name: str, args: list[tvm.ir.Expr], dtype: tvm_ffi.dtype) -> str:
        """A math function by its TIR name (``exp``) or C name (``expf``, ``exp``, ``__expf``)."""
        if not dtype.is_float:
            if name == "abs":
                return f"abs({self.expr(args[0])})"
            raise Unsupported(f"call to {name} on {dtype}")
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
        raise Unsupported(f"call to {name}")

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
            raise Unsupported(f"reinterpret {source} as {dtype}")
        return f"{functions[key]}({self.expr(value)})"

    def e_Let(self, e: tvm.ir.Expr) -> str:
        """GLSL has no let: the value is substituted (TIR expressions are pure, so only the text grows)."""
        self.names[e.var] = f"({self.expr(e.value)})"
        return self.expr(e.body)
