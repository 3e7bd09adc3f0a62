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

This module prints statements and the kernel's interface; expressions are printed by
:mod:`.glsl_expressions`, and the TIR → GLSL names of types and operators are in :mod:`.glsl_language`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
import tvm_ffi

from ...errors import UserError
from .glsl_expressions import ExpressionPrinter, Storage
from .glsl_language import SCALAR_TYPES, Unsupported, declared, dtype_of, glsl_type

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
class _KernelPrinter(ExpressionPrinter):
    """Prints one kernel: statements into ``lines``, shared arrays into ``globals``."""

    max_push_constant_bytes: int = DEFAULT_PUSH_CONSTANT_BYTES
    lines: list[str] = field(default_factory=list)
    globals: list[str] = field(default_factory=list)
    workgroup: dict[str, int] = field(default_factory=dict)
    indent: int = 1

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.indent + line)

    # ---- statements ----
    def stmt(self, s: tvm.tirx.Stmt) -> None:
        kind = type(s).__name__
        method = getattr(self, f"s_{kind}", None)
        if method is None:
            raise Unsupported(f"statement {kind}")
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
            raise Unsupported(f"buffer {s.buffer.name} declared over {type(source).__name__}")
        self.storage[s.buffer] = self.storage[source]

    def s_AllocBuffer(self, s: tvm.tirx.Stmt) -> None:
        buffer = s.buffer
        scope = buffer.scope()
        extent = 1
        for dim in buffer.shape:
            if type(dim).__name__ != "IntImm":
                raise Unsupported(f"allocation {buffer.name} of dynamic size")
            extent *= int(dim.value)
        dtype = tvm_ffi.dtype(str(buffer.dtype))
        gtype = declared(glsl_type(dtype, f"allocation {buffer.name}"))
        name = self.fresh(buffer.name)
        if scope in ("shared", "shared.dyn"):
            self.globals.append(f"shared {gtype} {name}[{extent}];")
        elif scope in ("local", "local.var", "global", ""):
            self.emit(f"{gtype} {name}[{extent}];")
        else:
            raise Unsupported(f"allocation {buffer.name} in {scope!r} memory")
        self.storage[buffer] = Storage(name, dtype)

    def s_AttrStmt(self, s: tvm.tirx.Stmt) -> None:
        key = str(s.attr_key)
        if key == "thread_extent":
            self.thread(s)
        elif key.startswith(PASSTHROUGH_ATTRS):
            self.stmt(s.body)
        else:
            raise Unsupported(f"attribute {key!r}")

    def thread(self, s: tvm.tirx.Stmt) -> None:
        iter_var = s.node
        tag = str(iter_var.thread_tag)
        kind, _, axis = tag.partition(".")
        if kind not in THREAD_BUILTINS or axis not in ("x", "y", "z"):
            raise Unsupported(f"thread binding {tag!r}")
        if kind == "threadIdx":
            if type(s.value).__name__ != "IntImm":
                raise Unsupported(f"{tag} with a dynamic extent")
            extent = int(s.value.value)
            if self.workgroup.setdefault(axis, extent) != extent:
                raise Unsupported(f"{tag} bound with two extents")
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
            raise Unsupported(f"predicated store to {s.buffer.name}")
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
    def stored(store: Storage, value: str) -> str:
        return f"({value} ? uint8_t(1) : uint8_t(0))" if store.is_bool_bytes else value

    def s_Evaluate(self, s: tvm.tirx.Stmt) -> None:
        value = s.value
        kind = type(value).__name__
        if kind == "IntImm":
            return
        if kind == "Call" and self.op_name(value) == "tvm_storage_sync":
            scope = str(value.args[0].value)
            if scope not in ("shared", "shared.dyn", "warp"):
                raise Unsupported(f"tvm_storage_sync({scope!r})")
            if scope != "warp":  # one thread per warp on Vulkan targets: nothing to wait for
                # glslang's barrier() for Vulkan is OpControlBarrier with AcquireRelease|WorkgroupMemory
                self.emit("barrier();")
            return
        if kind == "Call":
            op = self.op_name(value)
            called = str(value.args[0].value) if op in ("call_extern", "call_pure_extern") else op
            raise Unsupported(f"call to {called} as a statement")
        raise Unsupported(f"statement {kind}")

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
                    raise Unsupported(f"buffer argument {param.name} after a scalar one")
                element = tvm_ffi.dtype(str(ty.element_type.dtype))
                binding = len(arg_types)
                name = self.fresh(param.name)
                is_bool = element.is_bool
                gtype = "uint8_t" if is_bool else declared(glsl_type(element, f"argument {param.name}"))
                declarations.append(
                    f"layout(std430, set = 0, binding = {binding}) {restrict}buffer B{binding} "
                    f"{{ {gtype} data[]; }} {name};"
                )
                self.storage[param] = Storage(f"{name}.data", element, is_bool)
                arg_types.append("handle")
            else:
                seen_scalar = True
                dtype = str(ty.dtype)
                if dtype not in SCALAR_ARG_TYPES:
                    raise Unsupported(f"scalar argument {param.name} of type {dtype}")
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
    printer = _KernelPrinter(max_push_constant_bytes=max_push_constant_bytes)
    try:
        arg_types, declarations = printer.arguments(func)
        printer.stmt(func.body)
    except Unsupported as exc:
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
