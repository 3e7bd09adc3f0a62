"""The whole planned model as standalone C with one static arena (``build --emit-c DIR``).

The planned Relax ``main`` is a straight line of destination-passing kernel calls on tensors that
sit at fixed offsets of the arena (``R.memory.alloc_tensor(arena, offset, ...)``), on the inputs,
on constants and on the outputs. This module walks that line and writes it out as C: one
``static uint8_t memplan_arena[N]`` of exactly the planned size, every weight a ``const`` array
(int8 weights of a QDQ model as ``const int8_t``, their biases ``int32_t``), and a ``<name>_run``
function that calls TVM's C kernels in the planned order with pointers ``arena + offset``.
In-place kernels and eliminated concatenations need nothing special: they are already offsets in
the plan. Nothing is allocated at run time, and nothing of TVM beyond its header-only
tvm-ffi/dlpack headers is needed.

The firmware API follows what TensorFlow Lite Micro's users know: ``<name>_init(void* arena,
size_t size)`` binds caller memory (checked for alignment and size, an error code otherwise) that
holds the tensors and the kernels' scratch; without it the static arena is used, which
``MEMPLAN_ARENA_SECTION`` places in a linker section (DTCM, say). Every global symbol carries the
model's name, so two models link into one firmware and can take turns on one arena.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import tvm
from onnx import numpy_helper
from tvm import relax

from ..errors import UserError
from ..planner import ModelPlan
from ..relax.ir_utils import static_shape
from . import mcu_files

C_TYPES = {
    "float32": ("float", 2),
    "int32": ("int32_t", 0),
    "int64": ("int64_t", 0),
    "uint8": ("uint8_t", 1),
    "int8": ("int8_t", 0),
}
"""numpy dtype -> (C type, DLDataTypeCode)."""
_ALIGN = 64
_ARENA_ALIGNMENT = 8
"""What ``<name>_init`` requires of caller memory: the widest scalar a kernel loads (int64, double)."""
_WORKSPACE = re.compile(r"TVMBackendAllocWorkspace\(\s*\d+\s*,\s*\w+\s*,\s*\(uint64_t\)\s*(\d+)(?:ULL)?\s*,")
_ANY_WORKSPACE = re.compile(r"TVMBackendAllocWorkspace\(")
_DEFINITION = re.compile(
    r"^TVM_DLL int32_t __tvm_ffi_(\w+)\(void\* self_handle, void\* args, int32_t num_args, void\* result\) \{", re.M
)
MANIFEST = "memplan_c.json"
"""What ``measure DIR`` reads: the model, the plan's figures, inputs and outputs."""


@dataclass
class Storage:
    """Where a tensor's bytes live: an arena, a model input or output, a weight, or unplaced."""

    kind: str
    c_name: str = ""


@dataclass
class TensorRef:
    storage: Storage
    offset: int
    shape: tuple[int, ...]
    dtype: str
    name: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def pointer(self) -> str:
        return self.storage.c_name if not self.offset else f"{self.storage.c_name} + {self.offset}"


@dataclass
class KernelCall:
    kernel: str
    args: list[TensorRef]


@dataclass
class CProgram:
    """The planned ``main`` as C sees it."""

    inputs: list[TensorRef]
    outputs: list[TensorRef]
    arenas: list[tuple[str, int]]
    weights: list[tuple[str, np.ndarray]]
    steps: list[KernelCall]
    copies: list[tuple[TensorRef, TensorRef]] = field(default_factory=list)
    """(output, source) for outputs the plan did not compute in their own buffer."""


def c_identifier(name: str) -> str:
    """A C identifier from a model name (``mobilenet_v2?width=0.35`` -> ``mobilenet_v2``)."""
    ident = re.sub(r"\W+", "_", name.split("?")[0]).strip("_") or "model"
    return ident if not ident[0].isdigit() else f"m_{ident}"


def _int(value: Any) -> int:
    return int(value.value if hasattr(value, "value") else value)


def _shape(expr: relax.Expr) -> tuple[int, ...]:
    shape = static_shape(expr)
    if shape is None:
        raise UserError(f"shape {expr} is not static: the standalone C needs static shapes")
    return shape


def _tensor_type(var: relax.Var, what: str) -> tuple[tuple[int, ...], str]:
    ty = var.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        raise UserError(f"{what} {var.name} is not a tensor of static shape: the standalone C cannot express it")
    dtype = str(ty.dtype)
    if dtype not in C_TYPES:
        raise UserError(f"{what} {var.name} has dtype {dtype}; the standalone C supports {', '.join(C_TYPES)}")
    return _shape(ty.shape), dtype


def extract_program(func: relax.Function, prefix: str = "memplan") -> CProgram:
    """Follow the planned ``main`` binding by binding; anything else than kernel calls on placed
    tensors (a VM builtin, a library call, a symbolic shape) is a one-line UserError. Weights are
    named ``<prefix>_weight<i>``."""
    env: dict[relax.Var, TensorRef] = {}
    inputs = []
    for index, param in enumerate(func.params):
        shape, dtype = _tensor_type(param, "input")
        ref = TensorRef(Storage("input", f"in{index}"), 0, shape, dtype, param.name)
        env[param] = ref
        inputs.append(ref)
    arenas: dict[relax.Var, Storage] = {}
    arena_sizes: list[tuple[str, int]] = []
    weights: dict[tuple, tuple[str, np.ndarray, TensorRef]] = {}
    steps: list[KernelCall] = []
    tuples: dict[relax.Var, list[relax.Expr]] = {}

    def operand(expr: relax.Expr) -> TensorRef:
        if isinstance(expr, relax.Var) and expr in env:
            return env[expr]
        value = getattr(expr, "value", None)
        if isinstance(value, tvm.runtime.Tensor):
            key = (value.data_ptr(), tuple(value.shape), str(value.dtype))  # the same constant used twice
            if key not in weights:
                array = value.numpy()
                if str(array.dtype) not in C_TYPES:
                    raise UserError(f"a constant of dtype {array.dtype} is not supported by the standalone C")
                c_name = f"{prefix}_weight{len(weights)}"
                weights[key] = (
                    c_name,
                    array,
                    TensorRef(Storage("weight", c_name), 0, array.shape, str(array.dtype), c_name),
                )
            return weights[key][2]
        raise UserError(f"kernel argument {expr} is neither a placed tensor nor a constant")

    for block in func.body.blocks:
        for binding in block.bindings:
            var, value = binding.var, binding.value
            if isinstance(value, relax.Var) and value in tuples:
                tuples[var] = tuples[value]
                continue
            if isinstance(value, relax.Var):
                env[var] = env[value] if value in env else operand(value)
                continue
            if isinstance(value, relax.Tuple):
                tuples[var] = list(value.fields)
                continue
            if isinstance(value, relax.TupleGetItem) and value.tuple_value in tuples:
                env[var] = operand(tuples[value.tuple_value][value.index])
                continue
            if not isinstance(value, relax.Call):
                raise UserError(f"the standalone C cannot express binding {var.name} = {type(value).__name__}")
            op = value.op
            if isinstance(op, tvm.ir.GlobalVar):
                steps.append(KernelCall(op.name_hint, [operand(arg) for arg in value.args]))
                continue
            name = getattr(op, "name", str(op))
            if name == "relax.memory.alloc_storage":
                arenas[var] = Storage("arena", f"arena{len(arena_sizes)}")
                arena_sizes.append((f"memplan_arena{len(arena_sizes) or ''}", _shape(value.args[0])[0]))
            elif name == "relax.memory.alloc_tensor":
                storage = arenas.get(value.args[0])
                if storage is None:
                    raise UserError(f"{var.name} is placed in storage that is not a planned arena")
                shape, dtype = _tensor_type(var, "tensor")
                env[var] = TensorRef(storage, _int(value.args[1]), shape, dtype, var.name)
            elif name == "relax.memory.ensure_zero_offset":
                env[var] = operand(value.args[0])
            elif name == "relax.builtin.alloc_tensor":
                shape, dtype = _tensor_type(var, "tensor")
                env[var] = TensorRef(Storage("unplanned"), 0, shape, dtype, var.name)
            elif name == "relax.reshape":
                source = operand(value.args[0])
                shape, dtype = _tensor_type(var, "tensor")
                env[var] = TensorRef(source.storage, source.offset, shape, dtype, var.name)
            else:
                raise UserError(
                    f"the standalone C cannot express {name} (binding {var.name}); only kernel calls, "
                    "arena tensors and reshapes are supported"
                )

    result = func.body.body
    if isinstance(result, relax.Tuple):
        returned = list(result.fields)
    else:
        returned = tuples.get(result, [result]) if isinstance(result, relax.Var) else [result]
    outputs, copies = [], []
    for index, expr in enumerate(returned):
        source = operand(expr)
        c_name = f"out{index}"
        if source.storage.kind == "unplanned":
            source.storage.c_name, source.storage.kind = c_name, "output"
            outputs.append(TensorRef(source.storage, 0, source.shape, source.dtype, f"output{index}"))
        else:  # an output that is an input, a weight, an arena tensor or another output's buffer
            output = TensorRef(Storage("output", c_name), 0, source.shape, source.dtype, f"output{index}")
            outputs.append(output)
            copies.append((output, source))
    for step in steps:
        for arg in step.args:
            if arg.storage.kind == "unplanned":
                raise UserError(
                    f"kernel {step.kernel} uses {arg.name}, which the plan did not place (a symbolic shape?)"
                )
    return CProgram(inputs, outputs, arena_sizes, [(n, a) for n, a, _ in weights.values()], steps, copies)


def workspace_bytes(source: str, kernels: set[str]) -> int:
    """The static kernel-scratch pool: the largest sum of one kernel's workspaces, 64-byte rounded."""
    bodies = {}
    matches = list(_DEFINITION.finditer(source))
    for match, following in pairwise([*matches, None]):
        bodies[match.group(1)] = source[match.end() : following.start() if following else len(source)]
    largest = 0
    for kernel in kernels:
        body = bodies.get(kernel, "")
        sizes = [int(s) for s in _WORKSPACE.findall(body)]
        if len(sizes) != len(_ANY_WORKSPACE.findall(body)):
            raise UserError(
                f"kernel {kernel} allocates scratch memory of a size known only at run time; "
                "the standalone C needs static sizes"
            )
        largest = max(largest, sum((s + _ALIGN - 1) // _ALIGN * _ALIGN for s in sizes))
    return largest


def _c_values(array: np.ndarray) -> str:
    flat = array.ravel()
    if flat.dtype.kind == "f":
        if not np.all(np.isfinite(flat)):
            raise UserError("a weight holds inf or NaN: the standalone C cannot write it as a literal")
        text = [f"{v:.9g}" for v in flat.tolist()]
    else:
        text = [str(v) for v in flat.tolist()]
    lines = [", ".join(text[i : i + 16]) for i in range(0, len(text), 16)]
    return ",\n  ".join(lines)


def _weights_c(model: str, program: CProgram) -> str:
    parts = [f"/* {model}: the weights, as const arrays (flash on a microcontroller). */\n#include <stdint.h>\n\n"]
    for c_name, array in program.weights:
        ctype = C_TYPES[str(array.dtype)][0]
        parts.append(
            f"/* {list(array.shape)} */\n"
            f"const {ctype} {c_name}[{max(array.size, 1)}] __attribute__((aligned(64))) = {{\n  "
            f"{_c_values(array) or '0'}\n}};\n\n"
        )
    return "".join(parts)


def _signature(name: str, program: CProgram) -> str:
    params = [f"const {C_TYPES[t.dtype][0]}* {t.storage.c_name}" for t in program.inputs]
    params += [f"{C_TYPES[t.dtype][0]}* {t.storage.c_name}" for t in program.outputs]
    return f"int {name}_run({', '.join(params)})"


@dataclass
class EdgeQuantization:
    """How a float model input is quantized where the network reads it, or a float output was
    dequantized: one scale and zero point (a QDQ model's QuantizeLinear/DequantizeLinear)."""

    scale: float
    zero_point: int
    dtype: str


def edge_quantization(model: onnx.ModelProto) -> tuple[list[EdgeQuantization | None], list[EdgeQuantization | None]]:
    """Per graph input: the per-tensor QuantizeLinear that reads it (the only reader, through
    Identity nodes); per graph output: the DequantizeLinear that writes it. None elsewhere."""
    constants = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    producers = {out: node for node in model.graph.node for out in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)

    def quantization(node: onnx.NodeProto | None, op_type: str) -> EdgeQuantization | None:
        if node is None or node.op_type != op_type or len(node.input) < 3:
            return None
        scale, zero_point = constants.get(node.input[1]), constants.get(node.input[2])
        if scale is None or zero_point is None or scale.size != 1 or zero_point.size != 1:
            return None
        return EdgeQuantization(float(scale.reshape(())), int(zero_point.reshape(())), str(zero_point.dtype))

    def only_reader(name: str) -> onnx.NodeProto | None:
        found = readers.get(name, [])
        while len(found) == 1 and found[0].op_type == "Identity":
            found = readers.get(found[0].output[0], [])
        return found[0] if len(found) == 1 else None

    def writer(name: str) -> onnx.NodeProto | None:
        node = producers.get(name)
        while node is not None and node.op_type == "Identity":
            node = producers.get(node.input[0])
        return node

    initializers = set(constants)
    inputs = [
        quantization(only_reader(v.name), "QuantizeLinear") for v in model.graph.input if v.name not in initializers
    ]
    outputs = [quantization(writer(v.name), "DequantizeLinear") for v in model.graph.output]
    return inputs, outputs


def kernel_symbol(name: str, kernel: str) -> str:
    """The C symbol of TVM's packed function ``__tvm_ffi_<kernel>`` in model ``name``'s C: prefixed
    by the model, so that two models' kernels link into one firmware."""
    return f"{name}_kernel_{kernel}"


def prefix_kernel_symbols(source: str, name: str) -> str:
    """TVM's C kernels with every ``__tvm_ffi_*`` symbol renamed by :func:`kernel_symbol`."""
    return re.sub(r"\b__tvm_ffi_(\w+)", lambda found: kernel_symbol(name, found.group(1)), source)


def _padded(items: list, length: int) -> list:
    return (list(items) + [None] * length)[:length]


def _round_up(size: int, align: int = _ALIGN) -> int:
    return (size + align - 1) // align * align


def arena_layout(program: CProgram, workspace: int) -> tuple[list[int], int, int]:
    """Where each planned arena and the kernel scratch sit in caller memory: (arena offsets,
    scratch offset, total bytes ``<name>_init`` needs); every part starts 64-byte aligned."""
    offsets, at = [], 0
    for _, size in program.arenas:
        offsets.append(at)
        at += _round_up(size)
    return offsets, at, at + _round_up(workspace)


def _c_float(value: float) -> str:
    return f"{value:.9g}f" if any(c in f"{value:.9g}" for c in ".e") else f"{value:.9g}.0f"


def _io_lines(upper: str, kind: str, index: int, ref: TensorRef, quantized: EdgeQuantization | None) -> list[str]:
    prefix = f"#define {upper}_{kind}{index}"
    lines = [
        f"{prefix}_SIZE {int(np.prod(ref.shape, dtype=np.int64))}\n",
        f"{prefix}_NDIM {len(ref.shape)}\n",
        f"{prefix}_SHAPE {{{', '.join(map(str, ref.shape))}}}\n",
        f'{prefix}_DTYPE "{ref.dtype}"\n',
    ]
    if quantized is not None:
        lines += [
            f'{prefix}_QUANT_DTYPE "{quantized.dtype}"\n',
            f"{prefix}_SCALE {_c_float(quantized.scale)}\n",
            f"{prefix}_ZERO_POINT {quantized.zero_point}\n",
        ]
    return lines


def _model_h(
    name: str,
    model: str,
    program: CProgram,
    workspace: int,
    edges: tuple[list[EdgeQuantization | None], list[EdgeQuantization | None]],
) -> str:
    guard = f"{name.upper()}_MODEL_H_"
    upper = name.upper()
    _, _, total = arena_layout(program, workspace)
    tensors = sum(size for _, size in program.arenas)
    lines = [
        f"/* {model} as standalone C (tvm-memplan build --emit-c): the whole network on one arena.\n *\n",
        f" * int {name}_init(void* arena, size_t size);\n",
        f" *   runs the model on caller memory from now on: {upper}_ARENA_BYTES bytes aligned to\n",
        f" *   {upper}_ARENA_ALIGNMENT (the tensors and the kernels' scratch). Returns 0, or\n",
        f" *   {upper}_ERROR_NO_ARENA (NULL), {upper}_ERROR_ALIGNMENT or {upper}_ERROR_ARENA_TOO_SMALL, and then\n",
        f" *   binds nothing ({name}_run returns {upper}_ERROR_NO_ARENA until an init succeeds).\n",
        " *   Without it the model runs on its static arena; compile with\n",
        f" *   -D{upper}_NO_STATIC_ARENA to leave that out, and with -DMEMPLAN_ARENA_SECTION='__attribute__((\n",
        ' *   section(".dtcm")))\' to place it in a linker section of your own. Models that take turns\n',
        " *   on one buffer call their init before their run: nothing persists in the arena between runs.\n",
        f" * {_signature(name, program)};\n",
        " *   runs every kernel in the planned order; returns 0, a negative error above, or the 1-based\n",
        " *   number of the kernel that failed (tvm_memplan_last_error() says why). Not reentrant.\n",
        " * Inputs and outputs are dense row-major arrays (a QDQ model quantizes its float inputs and\n",
        " * dequantizes its outputs itself, with the scales and zero points below):\n",
    ]
    for ref, quantized in zip(program.inputs, _padded(edges[0], len(program.inputs)), strict=True):
        extra = f", quantized to {quantized.dtype} inside" if quantized else ""
        lines.append(f" *   {ref.storage.c_name}: input {ref.name!r} {ref.dtype}{list(ref.shape)}{extra}\n")
    for ref, quantized in zip(program.outputs, _padded(edges[1], len(program.outputs)), strict=True):
        extra = f", dequantized from {quantized.dtype}" if quantized else ""
        lines.append(f" *   {ref.storage.c_name}: output {ref.dtype}{list(ref.shape)}{extra}\n")
    lines.append(" */\n")
    lines.append(
        f"#ifndef {guard}\n#define {guard}\n#include <stddef.h>\n#include <stdint.h>\n\n"
        '#ifdef __cplusplus\nextern "C" {\n#endif\n\n'
    )
    lines.append(f"#define {upper}_ARENA_BYTES {total}  /* what {name}_init needs: tensors and scratch */\n")
    lines.append(f"#define {upper}_ARENA_ALIGNMENT {_ARENA_ALIGNMENT}\n")
    lines.append(f"#define {upper}_TENSOR_BYTES {tensors}  /* the planned arena */\n")
    lines.append(f"#define {upper}_WORKSPACE_BYTES {workspace}  /* the kernels' scratch */\n")
    lines.append(
        f"#define {upper}_ERROR_NO_ARENA (-1)\n#define {upper}_ERROR_ALIGNMENT (-2)\n"
        f"#define {upper}_ERROR_ARENA_TOO_SMALL (-3)\n"
    )
    for kind, refs, quantizations in (("INPUT", program.inputs, edges[0]), ("OUTPUT", program.outputs, edges[1])):
        lines.append(f"#define {upper}_NUM_{kind}S {len(refs)}\n")
        for index, (ref, quantized) in enumerate(zip(refs, _padded(quantizations, len(refs)), strict=True)):
            lines += _io_lines(upper, kind, index, ref, quantized)
    lines.append(f"\nint {name}_init(void* arena, size_t size);\n")
    lines.append(f"{_signature(name, program)};\n")
    lines.append("const char* tvm_memplan_last_error(void);\n")
    lines.append("\n#ifdef __cplusplus\n}\n#endif\n#endif\n")
    return "".join(lines)


def _model_c(name: str, model: str, program: CProgram, plan: ModelPlan, workspace: int) -> str:
    shapes: dict[tuple[int, ...], str] = {}
    upper = name.upper()

    def shape_name(shape: tuple[int, ...]) -> str:
        return shapes.setdefault(tuple(shape), f"memplan_shape{len(shapes)}")

    body = []
    for number, step in enumerate(program.steps, 1):
        tensors = []
        for arg in step.args:
            _, code = C_TYPES[arg.dtype]
            bits = np.dtype(arg.dtype).itemsize * 8
            tensors.append(
                f"      MEMPLAN_TENSOR({arg.pointer()}, {len(arg.shape)}, {code}, {bits}, {shape_name(arg.shape)}),"
                f"  /* {arg.name} */\n"
            )
        body.append(
            f"  {{  /* {number}: {step.kernel} */\n    DLTensor t[{len(step.args)}] = {{\n{''.join(tensors)}    }};\n"
            f"    if (memplan_call({kernel_symbol(name, step.kernel)}, t, {len(step.args)}) != 0) return {number};\n"
            f"    MEMPLAN_AFTER_KERNEL({number});\n  }}\n"
        )
    for output, source in program.copies:
        body.append(f"  memcpy({output.pointer()}, {source.pointer()}, {source.nbytes});\n")
    max_args = max((len(s.args) for s in program.steps), default=1)
    offsets, scratch_at, total = arena_layout(program, workspace)
    parts = len(program.arenas) + 1
    static = "".join(
        f"static uint8_t {c_name}[{max(size, 1)}] MEMPLAN_ARENA_SECTION __attribute__((aligned(64)));\n"
        for c_name, size in program.arenas
    )
    static += (
        f"static uint8_t memplan_workspace[{max(workspace, 1)}] MEMPLAN_ARENA_SECTION __attribute__((aligned(64)));\n"
    )
    static_parts = ", ".join([c_name for c_name, _ in program.arenas] + ["memplan_workspace"])
    bind = "".join(f"  memplan_parts[{k}] = base + {offset};\n" for k, offset in enumerate(offsets))
    bind += f"  memplan_parts[{parts - 1}] = base + {scratch_at};\n"
    locals_ = "".join(f"  uint8_t* const arena{k} = memplan_parts[{k}];\n" for k in range(len(program.arenas)))
    externs = "".join(f"extern const {C_TYPES[str(a.dtype)][0]} {c}[{max(a.size, 1)}];\n" for c, a in program.weights)
    shape_lines = "".join(
        f"static const int64_t {n}[{max(len(s), 1)}] = {{{', '.join(map(str, s)) or '1'}}};\n"
        for s, n in shapes.items()
    )
    report = plan.main
    return (
        f"/* {model}: {len(program.steps)} kernel calls in the planned order (tvm-memplan, TVM {tvm.__version__} C "
        "kernels).\n"
        f" * Arena: {report.arena_bytes} bytes planned (naive sum {report.naive_bytes}, TVM's default plan "
        f"{plan.tvm_default_bytes}, lower bound {report.lower_bound_bytes}), "
        f"then {workspace} bytes of kernel scratch.\n"
        f" * In-place kernels and eliminated concatenations are offsets of the plan: tensors that share bytes\n"
        f" * get the same pointers. */\n"
        f'#include <stddef.h>\n#include <stdint.h>\n#include <string.h>\n#include "kernels.h"\n#include "model.h"\n\n'
        "#ifndef MEMPLAN_ARENA_SECTION\n#define MEMPLAN_ARENA_SECTION\n#endif\n"
        "#ifdef MEMPLAN_PROFILE  /* a hook after every kernel: the harness reads its cycle counter there */\n"
        "void memplan_after_kernel(int number);\n#define MEMPLAN_AFTER_KERNEL(number) memplan_after_kernel(number)\n"
        "#else\n#define MEMPLAN_AFTER_KERNEL(number) ((void)0)\n#endif\n\n"
        "void tvm_memplan_set_workspace(void* base, uint32_t size);\n\n"
        f"/* Every intermediate tensor lives in an arena, at the offset the planner chose; the kernels'\n"
        f" * scratch follows it. Caller memory ({name}_init) holds both: arena parts at {offsets}, scratch at\n"
        f" * {scratch_at}, {total} bytes. */\n"
        f"#ifndef {upper}_NO_STATIC_ARENA\n{static}static uint8_t* memplan_parts[{parts}] = {{{static_parts}}};\n"
        f"#else\nstatic uint8_t* memplan_parts[{parts}];\n#endif\n\n"
        f"int {name}_init(void* arena, size_t size) {{\n"
        f"  for (int i = 0; i < {parts}; ++i) memplan_parts[i] = NULL;\n"
        f"  if (arena == NULL) return {upper}_ERROR_NO_ARENA;\n"
        f"  if ((uintptr_t)arena % {upper}_ARENA_ALIGNMENT != 0) return {upper}_ERROR_ALIGNMENT;\n"
        f"  if (size < {upper}_ARENA_BYTES) return {upper}_ERROR_ARENA_TOO_SMALL;\n"
        f"  uint8_t* base = (uint8_t*)arena;\n{bind}  return 0;\n}}\n\n"
        f"{externs}\n{shape_lines}\n"
        "#define MEMPLAN_TENSOR(ptr, ndim, code, bits, shape) \\\n"
        "  {(void*)(ptr), {kDLCPU, 0}, ndim, {code, bits, 1}, (int64_t*)(shape), NULL, 0}\n\n"
        "/* Packs the tensors as TVM FFI arguments and calls a kernel (see kernels.h). */\n"
        "static int32_t memplan_call(int32_t (*kernel)(void*, void*, int32_t, void*), DLTensor* tensors, int32_t n) {\n"
        f"  TVMFFIAny packed[{max_args}];\n"
        "  for (int32_t i = 0; i < n; ++i) {\n"
        "    packed[i].type_index = kTVMFFIDLTensorPtr;\n    packed[i].zero_padding = 0;\n"
        "    packed[i].v_int64 = 0;\n    packed[i].v_ptr = &tensors[i];\n  }\n"
        "  return kernel(NULL, packed, n, NULL);\n}\n\n"
        f"{_signature(name, program)} {{\n"
        f"  if (memplan_parts[{parts - 1}] == NULL) return {upper}_ERROR_NO_ARENA;\n{locals_}"
        f"  tvm_memplan_set_workspace(memplan_parts[{parts - 1}], {workspace}u);\n"
        f"{''.join(body)}  return 0;\n}}\n"
    )


def _union_bytes(ranges: list[tuple[int, int]]) -> int:
    total, end = 0, -1
    for start, stop in sorted(ranges):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def step_table(program: CProgram, functions: dict[str, tvm.tirx.PrimFunc]) -> list[dict[str, Any]]:
    """Per kernel call, what X-CUBE-AI's report gives per layer: TVM's FLOP estimate of the kernel (a
    multiply-add counts 2), the weight bytes it reads, and the arena bytes live while it runs (the
    union of the byte ranges of the arena tensors used at or before it and at or after it: views and
    in-place outputs count once), with the arena tensors it touches."""
    from tvm.s_tir.analysis import estimate_tir_flops

    first: dict[str, int] = {}
    last: dict[str, int] = {}
    ranges: dict[str, tuple[str, int, int]] = {}
    for number, step in enumerate(program.steps, 1):
        for arg in step.args:
            if arg.storage.kind == "arena":
                first.setdefault(arg.name, number)
                last[arg.name] = number
                ranges[arg.name] = (arg.storage.c_name, arg.offset, arg.offset + arg.nbytes)
    flops: dict[str, float] = {}
    rows = []
    for number, step in enumerate(program.steps, 1):
        if step.kernel not in flops:
            func = functions.get(step.kernel)
            flops[step.kernel] = float(estimate_tir_flops(tvm.IRModule({"main": func}))) if func is not None else 0.0
        live = [name for name in ranges if first[name] <= number <= last[name]]
        by_arena: dict[str, list[tuple[int, int]]] = {}
        for name in live:
            arena, start, stop = ranges[name]
            by_arena.setdefault(arena, []).append((start, stop))
        weights = {arg.storage.c_name: arg.nbytes for arg in step.args if arg.storage.kind == "weight"}
        rows.append(
            {
                "step": number,
                "kernel": step.kernel,
                "flops": int(flops[step.kernel]),
                "weight_bytes": sum(weights.values()),
                "live_arena_bytes": sum(_union_bytes(r) for r in by_arena.values()),
                "tensors": [arg.name for arg in step.args if arg.storage.kind == "arena"],
            }
        )
    return rows


def _harness(name: str, program: CProgram) -> str:
    buffers, reads, writes, call = [], [], [], []
    for index, ref in enumerate(program.inputs):
        ctype = C_TYPES[ref.dtype][0]
        size = int(np.prod(ref.shape, dtype=np.int64))
        buffers.append(f"static {ctype} input{index}[{size}] __attribute__((aligned(64)));\n")
        reads.append(f'  if (platform_read("input{index}.bin", input{index}, sizeof(input{index})) != 0) return 100;\n')
        call.append(f"input{index}")
    for index, ref in enumerate(program.outputs):
        ctype = C_TYPES[ref.dtype][0]
        size = int(np.prod(ref.shape, dtype=np.int64))
        buffers.append(f"static {ctype} output{index}[{size}] __attribute__((aligned(64)));\n")
        writes.append(
            f'  if (platform_write("output{index}.bin", output{index}, sizeof(output{index})) != 0) return 101;\n'
        )
        call.append(f"output{index}")
    return mcu_files.HARNESS.format(
        name=name,
        buffers="".join(buffers),
        reads="".join(reads),
        writes="".join(writes),
        call_args=", ".join(call),
        calls=max(len(program.steps), 1),
    )


def _writers(func: relax.Function) -> dict[str, str]:
    """Tensor name -> the kernel that writes it (destination-passing: its last argument)."""
    writers = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar) and value.args:
                last = value.args[-1]
                if isinstance(last, relax.Var):
                    writers[last.name] = value.op.name_hint
    return writers


def peak_tensors(plan: ModelPlan, limit: int = 4) -> tuple[int, list[tuple[str, int]]]:
    """The bytes live at the plan's busiest step and the largest tensors live then, each named
    with the kernel that writes it and its shape."""
    best_bytes, best = 0, []
    for report in plan.reports:
        for arena in report.arenas:
            tensors = arena["tensors"]
            for step in sorted({t["start"] for t in tensors}):
                live = [t for t in tensors if t["start"] <= step < t["end"]]
                # an in-place output shares its input's bytes: count byte ranges, not tensors
                total = _union_bytes([(t["offset"], t["offset"] + t["bytes"]) for t in live])
                if total > best_bytes:
                    best_bytes, best = total, live
    writers = _writers(plan.planned["main"])
    best = sorted(best, key=lambda t: -t["bytes"])[:limit]
    return best_bytes, [
        (f"{t['name']} ({writers.get(t['name'], 'assembled in place')} {t['dtype']}{t['shape']})", t["bytes"])
        for t in best
    ]


@dataclass
class ModelC:
    """What ``emit_model_c`` wrote, and the figures ``measure`` compares against."""

    model: str
    name: str
    target: str
    arena_bytes: int
    naive_bytes: int
    tvm_default_bytes: int
    lower_bound_bytes: int
    workspace_bytes: int
    weight_bytes: int
    kernel_calls: int
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    peak_live_bytes: int
    peak_tensors: list[tuple[str, int]]
    split: bool = False
    """Whether the module was rewritten before planning (fine-grained splitting)."""
    kernel_names: list[str] = field(default_factory=list)
    """The kernel each call of ``<name>_run`` runs, in order."""
    steps: list[dict[str, Any]] = field(default_factory=list)
    """Per kernel call: :func:`step_table`."""

    def save(self, directory: Path) -> None:
        (directory / MANIFEST).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path) -> ModelC:
        path = Path(directory) / MANIFEST
        if not path.is_file():
            raise UserError(f"{directory} has no {MANIFEST}: write it with tvm-memplan build --emit-c DIR")
        try:
            return cls(**json.loads(path.read_text()))
        except (TypeError, json.JSONDecodeError) as exc:
            raise UserError(f"{path} is not a tvm-memplan C manifest: {exc}") from None


def emit_model_c(plan: ModelPlan, spec: str, source: str, directory: Path, target: Any, split: bool = False) -> ModelC:
    """Write ``model.h``, ``model.c``, ``model_weights.c``, the harness, the Cortex-M startup and
    linker script, the runtime and the Makefile into ``directory`` (``kernels.c`` is written by the
    caller from ``source`` through :func:`prefix_kernel_symbols`)."""
    name = c_identifier(plan.model.name)
    program = extract_program(plan.planned["main"], prefix=name)
    if sum(size for _, size in program.arenas) != plan.main.arena_bytes:
        raise UserError(
            f"{plan.model.name}: the program's arena ({program.arenas}) is not the planned "
            f"{plan.main.arena_bytes} bytes"
        )
    defined = set(_DEFINITION.findall(source))
    missing = sorted({s.kernel for s in program.steps} - defined)
    if missing:
        raise UserError(f"{plan.model.name}: kernels {', '.join(missing)} are missing from TVM's C output")
    workspace = workspace_bytes(source, {s.kernel for s in program.steps} | defined)
    edges = edge_quantization(plan.model.onnx_model)
    board = target.board
    files = {
        "model.h": _model_h(name, plan.model.name, program, workspace, edges),
        "model.c": _model_c(name, plan.model.name, program, plan, workspace),
        "model_weights.c": _weights_c(plan.model.name, program),
        "main.c": _harness(name, program),
        "platform.h": mcu_files.PLATFORM_H,
        "platform_host.c": mcu_files.PLATFORM_HOST,
        "platform_semihost.c": mcu_files.PLATFORM_SEMIHOST,
        "startup_cortexm.c": mcu_files.STARTUP,
        "cortex_m.ld": mcu_files.LINKER_SCRIPT.format(**asdict(board)),
        "tvm_memplan_runtime.c": mcu_files.RUNTIME,
        "Makefile": mcu_files.MAKEFILE.format(
            model=plan.model.name,
            cpu=board.cpu,
            board=board.board,
            cpu_flags=board.cpu_flags,
            machine=board.machine,
            stack_size=board.stack_size,
        ),
    }
    for file_name, text in files.items():
        (directory / file_name).write_text(text)
    peak_bytes, peak = peak_tensors(plan)
    emitted = ModelC(
        model=spec,
        name=name,
        target=target.name,
        arena_bytes=plan.main.arena_bytes,
        naive_bytes=plan.main.naive_bytes,
        tvm_default_bytes=int(plan.tvm_default_bytes),
        lower_bound_bytes=plan.main.lower_bound_bytes,
        workspace_bytes=workspace,
        weight_bytes=int(sum(a.nbytes for _, a in program.weights)),
        kernel_calls=len(program.steps),
        inputs=[
            {
                "name": r.name,
                "shape": list(r.shape),
                "dtype": r.dtype,
                "file": f"input{i}.bin",
                "quantization": asdict(q) if q else None,
            }
            for i, (r, q) in enumerate(zip(program.inputs, _padded(edges[0], len(program.inputs)), strict=True))
        ],
        outputs=[
            {
                "shape": list(r.shape),
                "dtype": r.dtype,
                "file": f"output{i}.bin",
                "quantization": asdict(q) if q else None,
            }
            for i, (r, q) in enumerate(zip(program.outputs, _padded(edges[1], len(program.outputs)), strict=True))
        ],
        peak_live_bytes=peak_bytes,
        peak_tensors=peak,
        split=split,
        kernel_names=[step.kernel for step in program.steps],
        steps=step_table(
            program, {gv.name_hint: f for gv, f in plan.planned.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
        ),
    )
    emitted.save(directory)
    return emitted


def check_limits(model_c: ModelC, sram_limit: int | None = None, flash_limit: int | None = None) -> None:
    """One-line UserError when the static SRAM (arena + kernel scratch) or the weights miss a limit.

    Code, stack and the caller's input/output buffers come on top: ``measure`` reports those.
    """
    problems = []
    sram = model_c.arena_bytes + model_c.workspace_bytes
    if sram_limit is not None and sram > sram_limit:
        peak = ", ".join(f"{name} {size:,}" for name, size in model_c.peak_tensors)
        problems.append(
            f"SRAM misses the {sram_limit:,}-byte limit by {sram - sram_limit:,} bytes (arena "
            f"{model_c.arena_bytes:,} + kernel scratch {model_c.workspace_bytes:,}; at the peak "
            f"{model_c.peak_live_bytes:,} bytes live: {peak})"
        )
    if flash_limit is not None and model_c.weight_bytes > flash_limit:
        problems.append(
            f"flash misses the {flash_limit:,}-byte limit by {model_c.weight_bytes - flash_limit:,} bytes "
            f"(weights alone: {model_c.weight_bytes:,} bytes)"
        )
    if problems:
        raise UserError(f"{model_c.model} does not fit: " + "; ".join(problems))
