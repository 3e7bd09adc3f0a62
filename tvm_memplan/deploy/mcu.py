"""The whole planned model as standalone C with one static arena (``build --emit-c DIR``).

The planned Relax ``main`` is a straight line of destination-passing kernel calls on tensors that
sit at fixed offsets of the arena (``R.memory.alloc_tensor(arena, offset, ...)``), on the inputs,
on constants and on the outputs. This module walks that line and writes it out as C: one
``static uint8_t arena[N]`` of exactly the planned size, every weight a ``const`` array, and a
``<name>_run`` function that calls TVM's C kernels in the planned order with pointers
``arena + offset``. In-place kernels and eliminated concatenations need nothing special: they are
already offsets in the plan. Nothing is allocated at run time (kernel scratch comes from a static
pool sized here), and nothing of TVM beyond its header-only tvm-ffi/dlpack headers is needed.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..errors import UserError
from ..planner import ModelPlan
from ..relax.ir_utils import static_shape
from . import mcu_files

_DTYPES = {"float32": ("float", 2), "int32": ("int32_t", 0), "int64": ("int64_t", 0), "uint8": ("uint8_t", 1),
           "int8": ("int8_t", 0)}
"""numpy dtype -> (C type, DLDataTypeCode)."""
_ALIGN = 64
_WORKSPACE = re.compile(r"TVMBackendAllocWorkspace\(\s*\d+\s*,\s*\w+\s*,\s*\(uint64_t\)\s*(\d+)(?:ULL)?\s*,")
_ANY_WORKSPACE = re.compile(r"TVMBackendAllocWorkspace\(")
_DEFINITION = re.compile(
    r"^TVM_DLL int32_t __tvm_ffi_(\w+)\(void\* self_handle, void\* args, int32_t num_args, void\* result\) \{", re.M)
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
    if dtype not in _DTYPES:
        raise UserError(f"{what} {var.name} has dtype {dtype}; the standalone C supports {', '.join(_DTYPES)}")
    return _shape(ty.shape), dtype


def extract_program(func: relax.Function) -> CProgram:
    """Follow the planned ``main`` binding by binding; anything else than kernel calls on placed
    tensors (a VM builtin, a library call, a symbolic shape) is a one-line UserError."""
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
                if str(array.dtype) not in _DTYPES:
                    raise UserError(f"a constant of dtype {array.dtype} is not supported by the standalone C")
                c_name = f"memplan_weight{len(weights)}"
                ref = TensorRef(Storage("weight", c_name), 0, array.shape, str(array.dtype), c_name)
                weights[key] = (c_name, array, ref)
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
                c_name = f"memplan_arena{len(arena_sizes) or ''}"
                arenas[var] = Storage("arena", c_name)
                arena_sizes.append((c_name, _shape(value.args[0])[0]))
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
                raise UserError(f"the standalone C cannot express {name} (binding {var.name}); only kernel calls, "
                                "arena tensors and reshapes are supported")

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
                raise UserError(f"kernel {step.kernel} uses {arg.name}, which the plan did not place "
                                "(a symbolic shape?)")
    return CProgram(inputs, outputs, arena_sizes, [(n, a) for n, a, _ in weights.values()], steps, copies)


def workspace_bytes(source: str, kernels: set[str]) -> int:
    """The static kernel-scratch pool: the largest sum of one kernel's workspaces, 64-byte rounded."""
    bodies = {}
    matches = list(_DEFINITION.finditer(source))
    for match, following in pairwise([*matches, None]):
        bodies[match.group(1)] = source[match.end(): following.start() if following else len(source)]
    largest = 0
    for kernel in kernels:
        body = bodies.get(kernel, "")
        sizes = [int(s) for s in _WORKSPACE.findall(body)]
        if len(sizes) != len(_ANY_WORKSPACE.findall(body)):
            raise UserError(f"kernel {kernel} allocates scratch memory of a size known only at run time; "
                            "the standalone C needs static sizes")
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
    lines = [", ".join(text[i:i + 16]) for i in range(0, len(text), 16)]
    return ",\n  ".join(lines)


def _weights_c(model: str, program: CProgram) -> str:
    parts = [f"/* {model}: the weights, as const arrays (flash on a microcontroller). */\n#include <stdint.h>\n\n"]
    for c_name, array in program.weights:
        ctype = _DTYPES[str(array.dtype)][0]
        parts.append(f"/* {list(array.shape)} */\n"
                     f"const {ctype} {c_name}[{max(array.size, 1)}] __attribute__((aligned(64))) = {{\n  "
                     f"{_c_values(array) or '0'}\n}};\n\n")
    return "".join(parts)


def _signature(name: str, program: CProgram) -> str:
    params = [f"const {_DTYPES[t.dtype][0]}* {t.storage.c_name}" for t in program.inputs]
    params += [f"{_DTYPES[t.dtype][0]}* {t.storage.c_name}" for t in program.outputs]
    return f"int {name}_run({', '.join(params)})"


def _model_h(name: str, model: str, program: CProgram, workspace: int) -> str:
    guard = f"{name.upper()}_MODEL_H_"
    lines = [f"/* {model} as standalone C (tvm-memplan build --emit-c): the whole network, one static arena.\n *\n",
             f" * {_signature(name, program)};\n",
             " *   runs every kernel in the planned order; returns 0, or the 1-based number of the kernel that\n",
             " *   failed (tvm_memplan_last_error() says why). Not reentrant: the arena is one static buffer.\n",
             " * Inputs and outputs are dense row-major arrays:\n"]
    for ref in program.inputs:
        lines.append(f" *   {ref.storage.c_name}: input {ref.name!r} {ref.dtype}{list(ref.shape)}\n")
    for ref in program.outputs:
        lines.append(f" *   {ref.storage.c_name}: output {ref.dtype}{list(ref.shape)}\n")
    lines.append(" */\n")
    lines.append(f"#ifndef {guard}\n#define {guard}\n#include <stdint.h>\n\n"
                 "#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n")
    upper = name.upper()
    lines.append(f"#define {upper}_ARENA_BYTES {sum(size for _, size in program.arenas)}\n")
    lines.append(f"#define {upper}_WORKSPACE_BYTES {workspace}\n")
    for kind, refs in (("INPUT", program.inputs), ("OUTPUT", program.outputs)):
        lines.append(f"#define {upper}_NUM_{kind}S {len(refs)}\n")
        for index, ref in enumerate(refs):
            lines.append(f"#define {upper}_{kind}{index}_SIZE {int(np.prod(ref.shape, dtype=np.int64))}\n")
    lines.append(f"\n{_signature(name, program)};\n")
    lines.append("const char* tvm_memplan_last_error(void);\n")
    lines.append("\n#ifdef __cplusplus\n}\n#endif\n#endif\n")
    return "".join(lines)


def _model_c(name: str, model: str, program: CProgram, plan: ModelPlan) -> str:
    shapes: dict[tuple[int, ...], str] = {}

    def shape_name(shape: tuple[int, ...]) -> str:
        return shapes.setdefault(tuple(shape), f"memplan_shape{len(shapes)}")

    body = []
    for number, step in enumerate(program.steps, 1):
        tensors = []
        for arg in step.args:
            _, code = _DTYPES[arg.dtype]
            bits = np.dtype(arg.dtype).itemsize * 8
            tensors.append(f"      MEMPLAN_TENSOR({arg.pointer()}, {len(arg.shape)}, {code}, {bits}, "
                           f"{shape_name(arg.shape)}),  /* {arg.name} */\n")
        body.append(f"  {{  /* {number}: {step.kernel} */\n"
                    f"    DLTensor t[{len(step.args)}] = {{\n{''.join(tensors)}    }};\n"
                    f"    if (memplan_call(__tvm_ffi_{step.kernel}, t, {len(step.args)}) != 0) return {number};\n  "
                    "}\n")
    for output, source in program.copies:
        body.append(f"  memcpy({output.pointer()}, {source.pointer()}, {source.nbytes});\n")
    max_args = max((len(s.args) for s in program.steps), default=1)
    arena_lines = "".join(
        f"static uint8_t {c_name}[{size}] __attribute__((aligned(64)));\n" for c_name, size in program.arenas
    )
    externs = "".join(f"extern const {_DTYPES[str(a.dtype)][0]} {c}[{max(a.size, 1)}];\n" for c, a in program.weights)
    shape_lines = "".join(
        f"static const int64_t {n}[{max(len(s), 1)}] = {{{', '.join(map(str, s)) or '1'}}};\n"
        for s, n in shapes.items()
    )
    report = plan.main
    return (
        f"/* {model}: {len(program.steps)} kernel calls in the planned order (tvm-memplan, TVM {tvm.__version__} C "
        "kernels).\n"
        f" * Arena: {report.arena_bytes} bytes planned (naive sum {report.naive_bytes}, TVM's default plan "
        f"{plan.tvm_default_bytes}, lower bound {report.lower_bound_bytes}).\n"
        f" * In-place kernels and eliminated concatenations are offsets of the plan: tensors that share bytes\n"
        f" * get the same pointers. */\n"
        f"#include <stdint.h>\n#include <string.h>\n#include \"kernels.h\"\n#include \"model.h\"\n\n"
        f"/* Every intermediate tensor lives here, at the offset the planner chose. */\n{arena_lines}\n"
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
        f"{_signature(name, program)} {{\n{''.join(body)}  return 0;\n}}\n"
    )


def _harness(name: str, program: CProgram) -> str:
    buffers, reads, writes, call = [], [], [], []
    for index, ref in enumerate(program.inputs):
        ctype = _DTYPES[ref.dtype][0]
        size = int(np.prod(ref.shape, dtype=np.int64))
        buffers.append(f"static {ctype} input{index}[{size}] __attribute__((aligned(64)));\n")
        reads.append(f"  if (platform_read(\"input{index}.bin\", input{index}, sizeof(input{index})) != 0) "
                     "return 100;\n")
        call.append(f"input{index}")
    for index, ref in enumerate(program.outputs):
        ctype = _DTYPES[ref.dtype][0]
        size = int(np.prod(ref.shape, dtype=np.int64))
        buffers.append(f"static {ctype} output{index}[{size}] __attribute__((aligned(64)));\n")
        writes.append(f"  if (platform_write(\"output{index}.bin\", output{index}, sizeof(output{index})) != 0) "
                      "return 101;\n")
        call.append(f"output{index}")
    return mcu_files.HARNESS.format(name=name, buffers="".join(buffers), reads="".join(reads),
                                    writes="".join(writes), call_args=", ".join(call))


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
                total = sum(t["bytes"] for t in live if t["alias_of"] is None)
                if total > best_bytes:
                    best_bytes, best = total, live
    writers = _writers(plan.planned["main"])
    best = sorted(best, key=lambda t: -t["bytes"])[:limit]
    return best_bytes, [
        (f"{t['name']} ({writers.get(t['name'], 'assembled in place')} {t['dtype']}{t['shape']})", t["bytes"])
        for t in best]


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
    linker script, the runtime and the Makefile into ``directory`` (the kernels are already there)."""
    name = c_identifier(plan.model.name)
    program = extract_program(plan.planned["main"])
    if sum(size for _, size in program.arenas) != plan.main.arena_bytes:
        raise UserError(f"{plan.model.name}: the program's arena ({program.arenas}) is not the planned "
                        f"{plan.main.arena_bytes} bytes")
    defined = set(_DEFINITION.findall(source))
    missing = sorted({s.kernel for s in program.steps} - defined)
    if missing:
        raise UserError(f"{plan.model.name}: kernels {', '.join(missing)} are missing from TVM's C output")
    workspace = workspace_bytes(source, {s.kernel for s in program.steps} | defined)
    board = target.board
    files = {
        "model.h": _model_h(name, plan.model.name, program, workspace),
        "model.c": _model_c(name, plan.model.name, program, plan),
        "model_weights.c": _weights_c(plan.model.name, program),
        "main.c": _harness(name, program),
        "platform.h": mcu_files.PLATFORM_H,
        "platform_host.c": mcu_files.PLATFORM_HOST,
        "platform_semihost.c": mcu_files.PLATFORM_SEMIHOST,
        "startup_cortexm.c": mcu_files.STARTUP,
        "cortex_m.ld": mcu_files.LINKER_SCRIPT.format(**asdict(board)),
        "tvm_memplan_runtime.c": mcu_files.RUNTIME.format(workspace_bytes=workspace),
        "Makefile": mcu_files.MAKEFILE.format(model=plan.model.name, cpu=board.cpu, board=board.board,
                                              cpu_flags=board.cpu_flags, machine=board.machine,
                                              stack_size=board.stack_size),
    }
    for file_name, text in files.items():
        (directory / file_name).write_text(text)
    peak_bytes, peak = peak_tensors(plan)
    emitted = ModelC(
        model=spec, name=name, target=target.name,
        arena_bytes=plan.main.arena_bytes, naive_bytes=plan.main.naive_bytes,
        tvm_default_bytes=int(plan.tvm_default_bytes), lower_bound_bytes=plan.main.lower_bound_bytes,
        workspace_bytes=workspace,
        weight_bytes=int(sum(a.nbytes for _, a in program.weights)),
        kernel_calls=len(program.steps),
        inputs=[{"name": r.name, "shape": list(r.shape), "dtype": r.dtype, "file": f"input{i}.bin"}
                for i, r in enumerate(program.inputs)],
        outputs=[{"shape": list(r.shape), "dtype": r.dtype, "file": f"output{i}.bin"}
                 for i, r in enumerate(program.outputs)],
        peak_live_bytes=peak_bytes, peak_tensors=peak, split=split,
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
        problems.append(f"SRAM misses the {sram_limit:,}-byte limit by {sram - sram_limit:,} bytes (arena "
                        f"{model_c.arena_bytes:,} + kernel scratch {model_c.workspace_bytes:,}; at the peak "
                        f"{model_c.peak_live_bytes:,} bytes live: {peak})")
    if flash_limit is not None and model_c.weight_bytes > flash_limit:
        problems.append(f"flash misses the {flash_limit:,}-byte limit by {model_c.weight_bytes - flash_limit:,} bytes "
                        f"(weights alone: {model_c.weight_bytes:,} bytes)")
    if problems:
        raise UserError(f"{model_c.model} does not fit: " + "; ".join(problems))
