"""The planned Relax ``main`` as a C program model: kernel calls on tensors at arena offsets.

:func:`extract_program` walks the planned ``main`` (destination-passing kernel calls on tensors
placed by ``R.memory.alloc_tensor(arena, offset, ...)``) into a :class:`CProgram`; the rest reads
figures off it and off the plan: the kernels' static scratch, a QDQ model's edge quantization, the
per-kernel table X-CUBE-AI users know, and which tensors make the peak. The C itself is written by
:mod:`tvm_memplan.deploy.mcu_c`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any

import numpy as np
import onnx
import tvm
from onnx import numpy_helper
from tvm import relax

from ..errors import UserError
from ..planner import ModelPlan
from ..planning.problem import TensorBytes
from ..quant.mcu_kernels import layer_flops
from ..relax.ir_utils import static_shape

C_TYPES = {
    "float32": ("float", 2),
    "int32": ("int32_t", 0),
    "int64": ("int64_t", 0),
    "uint8": ("uint8_t", 1),
    "int8": ("int8_t", 0),
}
"""numpy dtype -> (C type, DLDataTypeCode)."""
ALIGN = 64
"""Every arena part and scratch block starts at a multiple of this many bytes."""
_WORKSPACE = re.compile(r"TVMBackendAllocWorkspace\(\s*\d+\s*,\s*\w+\s*,\s*\(uint64_t\)\s*(\d+)(?:ULL)?\s*,")
_ANY_WORKSPACE = re.compile(r"TVMBackendAllocWorkspace\(")
KERNEL_DEFINITION = re.compile(
    r"^TVM_DLL int32_t __tvm_ffi_(\w+)\(void\* self_handle, void\* args, int32_t num_args, void\* result\) \{", re.M
)


@dataclass
class Storage:
    """Where a tensor's bytes live: an arena, a model input or output, a weight, or unplaced."""

    kind: str
    c_name: str = ""


@dataclass
class TensorRef(TensorBytes):
    """A tensor of the C program: where its bytes are (``storage`` at ``offset``), its shape and type."""

    storage: Storage
    offset: int
    shape: tuple[int, ...]
    dtype: str
    name: str

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

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
    io_in_arena: bool = False
    """Inputs and outputs are tensors of the arena (:mod:`tvm_memplan.relax.io_tensors`): the caller
    writes and reads them there, through ``<name>_input(i)`` and ``<name>_output(i)``."""


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


def extract_program(func: relax.Function, prefix: str = "memplan", io_roles: dict[str, str] | None = None) -> CProgram:
    """Follow the planned ``main`` binding by binding; anything else than kernel calls on placed
    tensors (a VM builtin, a library call, a symbolic shape) is a one-line UserError. Weights are
    named ``<prefix>_weight<i>``, one array per distinct content. ``io_roles`` (kernel -> ``input<i>`` or
    ``output<i>``, :func:`~tvm_memplan.relax.io_tensors.io_copies`): those copies are left out, and the
    inputs and outputs are the arena tensors they copy to and from (:func:`check_io_lifetimes`)."""
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
    placed_io: dict[str, tuple[TensorRef, int]] = {}

    def operand(expr: relax.Expr) -> TensorRef:
        if isinstance(expr, relax.Var) and expr in env:
            return env[expr]
        value = getattr(expr, "value", None)
        if isinstance(value, tvm.runtime.Tensor):
            # by content: a constant used twice, or the copies each row tile of a split chain holds
            array = value.numpy()
            key = (array.shape, str(array.dtype), hashlib.sha256(array.tobytes()).digest())
            if key not in weights:
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
                call = KernelCall(op.name_hint, [operand(arg) for arg in value.args])
                role = (io_roles or {}).get(op.name_hint)
                if role is None:
                    steps.append(call)
                elif role.startswith("input"):
                    placed_io[role] = (call.args[-1], len(steps))
                else:
                    placed_io[role] = (call.args[0], len(steps))
                    env[var] = call.args[0]
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
    weight_list = [(n, a) for n, a, _ in weights.values()]
    if io_roles:
        inputs, outputs = check_io_lifetimes(placed_io, inputs, len(outputs), steps)
        return CProgram(inputs, outputs, arena_sizes, weight_list, steps, [], io_in_arena=True)
    return CProgram(inputs, outputs, arena_sizes, weight_list, steps, copies)


def _overlap(a: TensorRef, b: TensorRef) -> bool:
    return a.storage is b.storage and a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes


def check_io_lifetimes(
    placed: dict[str, tuple[TensorRef, int]], given: list[TensorRef], num_outputs: int, steps: list[KernelCall]
) -> tuple[list[TensorRef], list[TensorRef]]:
    """The arena tensors of the inputs and outputs, checked: the caller writes every input before the
    run and reads every output after it, so no kernel before an input's copy (none after an output's)
    may touch its bytes, and no two inputs (outputs) may share bytes. A UserError says which broke."""
    roles = [f"input{i}" for i in range(len(given))] + [f"output{i}" for i in range(num_outputs)]
    missing = [role for role in roles if role not in placed or placed[role][0].storage.kind != "arena"]
    if missing:
        raise UserError(f"the plan did not place {', '.join(missing)} in the arena")
    for role in roles:
        ref, at = placed[role]
        touched = steps[:at] if role.startswith("input") else steps[at:]
        clash = next((s.kernel for s in touched for arg in s.args if _overlap(arg, ref)), None)
        same_kind = [o for o in roles if o != role and o[:5] == role[:5]]
        clash = clash or next((o for o in same_kind if _overlap(placed[o][0], ref)), None)
        if clash:
            raise UserError(f"{role} cannot live in the arena: {clash} uses its bytes while the caller's data is there")
    inputs = [replace(placed[role][0], name=ref.name) for role, ref in zip(roles, given, strict=False)]
    return inputs, [replace(placed[role][0], name=role) for role in roles[len(given) :]]


def workspace_bytes(source: str, kernels: set[str]) -> int:
    """The static kernel-scratch pool: the largest sum of one kernel's workspaces, 64-byte rounded."""
    bodies = {}
    matches = list(KERNEL_DEFINITION.finditer(source))
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
        largest = max(largest, sum((s + ALIGN - 1) // ALIGN * ALIGN for s in sizes))
    return largest


@dataclass
class EdgeQuantization:
    """How a float model input is quantized where the network reads it, or a float output was
    dequantized: one scale and zero point (a QDQ model's QuantizeLinear/DequantizeLinear)."""

    scale: float
    zero_point: int
    dtype: str


def edge_quantization(model: onnx.ModelProto) -> tuple[list[EdgeQuantization | None], list[EdgeQuantization | None]]:
    """Per graph input: the per-tensor QuantizeLinear that reads it (the only reader, through
    Identity nodes), or the DequantizeLinear that reads an integer input (``--int8-io``); per graph
    output: the DequantizeLinear that writes it, or the QuantizeLinear that writes integer codes.
    None elsewhere."""
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

    def first_reader(name: str) -> onnx.NodeProto | None:
        return only_reader(name) or next(iter(readers.get(name, [])), None)

    inputs = [
        quantization(only_reader(v.name), "QuantizeLinear") or quantization(first_reader(v.name), "DequantizeLinear")
        for v in model.graph.input
        if v.name not in initializers
    ]
    outputs = [
        quantization(writer(v.name), "DequantizeLinear") or quantization(writer(v.name), "QuantizeLinear")
        for v in model.graph.output
    ]
    return inputs, outputs


def union_bytes(ranges: list[tuple[int, int]]) -> int:
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
            external = layer_flops(func) if func is not None else None  # a whole-layer C kernel's call
            estimate = estimate_tir_flops(tvm.IRModule({"main": func})) if func is not None and external is None else 0
            flops[step.kernel] = float(external if external is not None else estimate)
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
                "live_arena_bytes": sum(union_bytes(r) for r in by_arena.values()),
                "tensors": [arg.name for arg in step.args if arg.storage.kind == "arena"],
            }
        )
    return rows


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
                total = union_bytes([(t["offset"], t["offset"] + t["bytes"]) for t in live])
                if total > best_bytes:
                    best_bytes, best = total, live
    writers = _writers(plan.planned["main"])
    best = sorted(best, key=lambda t: -t["bytes"])[:limit]
    return best_bytes, [
        (f"{t['name']} ({writers.get(t['name'], 'assembled in place')} {t['dtype']}{t['shape']})", t["bytes"])
        for t in best
    ]
