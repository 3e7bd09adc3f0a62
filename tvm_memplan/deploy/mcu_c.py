"""The C text of a planned model: ``model.h``, ``model.c``, ``model_weights.c`` and the harness.

``model.c`` calls TVM's C kernels in the planned order with pointers ``arena + offset`` (see
:mod:`tvm_memplan.deploy.mcu` for the whole picture and the firmware API); the weights are
``const`` arrays written as integers where the model is int8, so they go to flash.
"""

from __future__ import annotations

import re

import numpy as np
import tvm

from ..errors import UserError
from ..planner import ModelPlan
from . import mcu_files
from .mcu_program import ALIGN, C_TYPES, CProgram, EdgeQuantization, TensorRef

ARENA_ALIGNMENT = 8
"""What ``<name>_init`` requires of caller memory: the widest scalar a kernel loads (int64, double)."""


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


def weights_source(model: str, program: CProgram) -> str:
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
    if program.io_in_arena:
        return f"int {name}_run(void)"
    params = [f"const {C_TYPES[t.dtype][0]}* {t.storage.c_name}" for t in program.inputs]
    params += [f"{C_TYPES[t.dtype][0]}* {t.storage.c_name}" for t in program.outputs]
    return f"int {name}_run({', '.join(params)})"


def kernel_symbol(name: str, kernel: str) -> str:
    """The C symbol of TVM's packed function ``__tvm_ffi_<kernel>`` in model ``name``'s C: prefixed
    by the model, so that two models' kernels link into one firmware."""
    return f"{name}_kernel_{kernel}"


def prefix_kernel_symbols(source: str, name: str) -> str:
    """TVM's C kernels with every ``__tvm_ffi_*`` symbol renamed by :func:`kernel_symbol`."""
    return re.sub(r"\b__tvm_ffi_(\w+)", lambda found: kernel_symbol(name, found.group(1)), source)


def padded(items: list, length: int) -> list:
    return (list(items) + [None] * length)[:length]


def _round_up(size: int, align: int = ALIGN) -> int:
    return (size + align - 1) // align * align


def arena_layout(program: CProgram, workspace: int) -> tuple[list[int], int, int]:
    """Where each planned arena and the kernel scratch sit in caller memory: (arena offsets,
    scratch offset, total bytes ``<name>_init`` needs); every part starts 64-byte aligned."""
    offsets, at = [], 0
    for _, size in program.arenas:
        offsets.append(at)
        at += _round_up(size)
    return offsets, at, at + _round_up(workspace)


_CODES = ": integer codes, real value = SCALE * (code - ZERO_POINT)"


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


def model_header(
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
    if program.io_in_arena:
        lines += [
            f" * void* {name}_input(int index);  void* {name}_output(int index);\n",
            " *   where input and output INDEX live: in the arena (TensorFlow Lite Micro's interpreter.input(i)),\n",
            f" *   valid once the arena is bound (the static one, or after {name}_init); NULL otherwise. Write\n",
            " *   the inputs before every run (their bytes are reused once read), read the outputs after it.\n",
        ]
    for index, (ref, quantized) in enumerate(zip(program.inputs, padded(edges[0], len(program.inputs)), strict=True)):
        extra = f", quantized to {quantized.dtype} inside" if quantized else ""
        extra = _CODES if quantized and ref.dtype == quantized.dtype else extra
        where = f"{name}_input({index})" if program.io_in_arena else ref.storage.c_name
        lines.append(f" *   {where}: input {ref.name!r} {ref.dtype}{list(ref.shape)}{extra}\n")
    for index, (ref, quantized) in enumerate(zip(program.outputs, padded(edges[1], len(program.outputs)), strict=True)):
        extra = f", dequantized from {quantized.dtype}" if quantized else ""
        extra = _CODES if quantized and ref.dtype == quantized.dtype else extra
        where = f"{name}_output({index})" if program.io_in_arena else ref.storage.c_name
        lines.append(f" *   {where}: output {ref.dtype}{list(ref.shape)}{extra}\n")
    lines.append(" */\n")
    lines.append(
        f"#ifndef {guard}\n#define {guard}\n#include <stddef.h>\n#include <stdint.h>\n\n"
        '#ifdef __cplusplus\nextern "C" {\n#endif\n\n'
    )
    lines.append(f"#define {upper}_ARENA_BYTES {total}  /* what {name}_init needs: tensors and scratch */\n")
    lines.append(f"#define {upper}_ARENA_ALIGNMENT {ARENA_ALIGNMENT}\n")
    lines.append(f"#define {upper}_TENSOR_BYTES {tensors}  /* the planned arena */\n")
    lines.append(f"#define {upper}_WORKSPACE_BYTES {workspace}  /* the kernels' scratch */\n")
    lines.append(
        f"#define {upper}_ERROR_NO_ARENA (-1)\n#define {upper}_ERROR_ALIGNMENT (-2)\n"
        f"#define {upper}_ERROR_ARENA_TOO_SMALL (-3)\n"
    )
    for kind, refs, quantizations in (("INPUT", program.inputs, edges[0]), ("OUTPUT", program.outputs, edges[1])):
        lines.append(f"#define {upper}_NUM_{kind}S {len(refs)}\n")
        for index, (ref, quantized) in enumerate(zip(refs, padded(quantizations, len(refs)), strict=True)):
            lines += _io_lines(upper, kind, index, ref, quantized)
    lines.append(f"\nint {name}_init(void* arena, size_t size);\n")
    lines.append(f"{_signature(name, program)};\n")
    if program.io_in_arena:
        lines.append(f"void* {name}_input(int index);\nvoid* {name}_output(int index);\n")
    lines.append("const char* tvm_memplan_last_error(void);\n")
    lines.append("\n#ifdef __cplusplus\n}\n#endif\n#endif\n")
    return "".join(lines)


def model_source(name: str, model: str, program: CProgram, plan: ModelPlan, workspace: int) -> str:
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
        f"{''.join(body)}  return 0;\n}}\n" + (_io_accessors(name, program) if program.io_in_arena else "")
    )


def _io_accessors(name: str, program: CProgram) -> str:
    """``<name>_input(i)`` and ``<name>_output(i)``: pointers into the bound arena."""
    text = []
    for kind, refs in (("input", program.inputs), ("output", program.outputs)):
        cases = "".join(
            f"    case {i}: return memplan_parts[{ref.storage.c_name.removeprefix('arena')}] + {ref.offset};\n"
            for i, ref in enumerate(refs)
        )
        text.append(
            f"\nvoid* {name}_{kind}(int index) {{\n  if (memplan_parts[{len(program.arenas)}] == NULL) return NULL;\n"
            f"  switch (index) {{\n{cases}    default: return NULL;\n  }}\n}}\n"
        )
    return "".join(text)


def harness_source(name: str, program: CProgram) -> str:
    if program.io_in_arena:
        return _arena_io_harness(name, program)
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


def _arena_io_harness(name: str, program: CProgram) -> str:
    """The harness of a model whose inputs and outputs live in its arena: no buffers of its own."""
    reads = "".join(
        f'  if ({name}_input({i}) == NULL || platform_read("input{i}.bin", {name}_input({i}), {ref.nbytes}) != 0) '
        "return 100;\n"
        for i, ref in enumerate(program.inputs)
    )
    writes = "".join(
        f'  if (platform_write("output{i}.bin", {name}_output({i}), {ref.nbytes}) != 0) return 101;\n'
        for i, ref in enumerate(program.outputs)
    )
    return mcu_files.HARNESS.format(
        name=name, buffers="", reads=reads, writes=writes, call_args="", calls=max(len(program.steps), 1)
    )
