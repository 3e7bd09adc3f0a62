"""Write a model as standalone C for microcontroller projects (``build --emit-c DIR``).

TVM's C target emits each kernel as a packed function that needs only header-only tvm-ffi and
dlpack headers plus three runtime symbols (error reporting and workspace allocation). This module
writes those headers, the three symbols (a static workspace pool, no heap), a header that documents
the calling convention, an example ``main.c`` that runs one kernel on embedded inputs and checks it
against outputs computed here by TVM's LLVM build of the same kernel (an independent code
generator), and — through :mod:`tvm_memplan.deploy.mcu` — the whole model: ``model.c`` calling
every kernel on one static arena, with a Makefile for this machine and for Cortex-M.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import tvm

from ..errors import UserError
from ..frontend import LoadedModel, load_model
from ..quant.mcu_kernels import is_layer_call, is_row_band
from ..relax.io_tensors import with_io_tensors
from .build import compile_plan, plan_for
from .mcu import ModelC, emit_model_c
from .mcu_c import kernel_symbol, prefix_kernel_symbols
from .mcu_dsp import with_micro_kernels
from .mcu_mve import HELIUM_CPUS, with_mve_kernels
from .mcu_program import C_TYPES, c_identifier
from .targets import get_target

_DEFINITION = re.compile(
    r"^TVM_DLL int32_t __tvm_ffi_(\w+)\(void\* self_handle, void\* args, int32_t num_args, void\* result\) \{", re.M
)
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


@dataclass
class Param:
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class EmittedC:
    directory: Path
    kernels: list[str]
    example_kernel: str
    model: ModelC


def _include_roots() -> list[Path]:
    import tvm.libinfo
    import tvm_ffi.libinfo

    roots: list[Path] = []
    for found in (tvm_ffi.libinfo.find_include_path(), tvm.libinfo.find_include_path()):
        roots += [Path(p) for p in ([found] if isinstance(found, str) else found)]
    return roots


def _copy_headers(source: str, destination: Path) -> list[str]:
    """Copy every header ``source`` includes (transitively) from TVM's include dirs; return them."""
    roots = _include_roots()
    copied: list[str] = []
    pending = _INCLUDE.findall(source)
    while pending:
        name = pending.pop()
        found = next((root / name for root in roots if (root / name).is_file()), None)
        if found is None or name in copied:
            continue  # a system header (math.h, stdint.h, ...)
        copied.append(name)
        (destination / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(found, destination / name)
        pending += _INCLUDE.findall(found.read_text())
    return sorted(copied)


def _params(func: tvm.tirx.PrimFunc) -> list[Param] | None:
    """Static tensor parameters of a kernel, or None if one is symbolic or of an unsupported dtype."""
    params = []
    for var in func.params:  # in TVM 0.27 a tensor parameter is the buffer itself
        if not isinstance(var.ty, tvm.tirx.buffer.BufferType) or str(var.dtype) not in C_TYPES:
            return None
        if not all(isinstance(d, tvm.tirx.IntImm) for d in var.shape):
            return None
        params.append(Param(var.name, tuple(int(d) for d in var.shape), str(var.dtype)))
    return params


def _c_array(name: str, values: np.ndarray, ctype: str) -> str:
    body = ", ".join(f"{v:.9g}" if ctype == "float" else str(int(v)) for v in values.ravel())
    return f"static {ctype} {name}[{values.size}] __attribute__((aligned(64))) = {{{body}}};\n"


def _example_data(name: str, func: tvm.tirx.PrimFunc, params: list[Param]) -> str:
    """Inputs and TVM LLVM's outputs for ``name``: the last parameter is the output (TVM's
    destination-passing style after CallTIRRewrite)."""
    rng = np.random.default_rng(0)
    arrays = []
    for p in params:
        if p.dtype.startswith("float"):
            arrays.append(rng.standard_normal(p.shape).astype(p.dtype))
        else:
            arrays.append(rng.integers(0, 10, size=p.shape).astype(p.dtype))
    arrays[-1][...] = 0
    lib = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm")
    tensors = [tvm.runtime.tensor(a) for a in arrays]
    lib["main"](*tensors)
    expected = tensors[-1].numpy()

    text = [f"/* Example data for {name}: inputs from numpy (seed 0), expected output from TVM's LLVM build. */\n"]
    text.append("#include <stdint.h>\n")
    for index, (p, array) in enumerate(zip(params, arrays, strict=True)):
        ctype, code = C_TYPES[p.dtype]
        text.append(_c_array(f"arg{index}_data", array, ctype))
        dims = ", ".join(map(str, p.shape)) or "1"
        text.append(f"static int64_t arg{index}_shape[{max(len(p.shape), 1)}] = {{{dims}}};\n")
    ctype, _ = C_TYPES[params[-1].dtype]
    text.append(_c_array("expected_output", expected, ctype))
    text.append(f"#define EXAMPLE_NUM_ARGS {len(params)}\n#define EXAMPLE_OUTPUT_SIZE {expected.size}\n")
    text.append("static DLTensor example_args[EXAMPLE_NUM_ARGS] = {\n")
    for index, p in enumerate(params):
        ctype, code = C_TYPES[p.dtype]
        bits = np.dtype(p.dtype).itemsize * 8
        text.append(
            f"  {{arg{index}_data, {{kDLCPU, 0}}, {len(p.shape)}, {{{code}, {bits}, 1}}, "
            f"arg{index}_shape, NULL, 0}},  /* {p.name}: {p.dtype}{list(p.shape)} */\n"
        )
    text.append("};\n")
    return "".join(text)


_HEADER = """\
/* {model}: {count} kernels generated by TVM {version}'s C target (tvm-memplan build --emit-c).
 *
 * Calling convention (TVM FFI packed functions, no TVM runtime needed; TVM's __tvm_ffi_NAME symbols
 * carry the model's name here, {prefix}NAME, so that two models link into one firmware):
 *   int32_t {prefix}NAME(void* self, void* args, int32_t num_args, void* result);
 *   - self and result: pass NULL.
 *   - args: an array of num_args TVMFFIAny (tvm/ffi/c_api.h), one per tensor parameter, in the
 *     order listed below; each with type_index = kTVMFFIDLTensorPtr and v_ptr = a DLTensor*.
 *   - every DLTensor: device {{kDLCPU, 0}}, the exact ndim/shape/dtype below, strides NULL
 *     (compact row-major), byte_offset 0, data aligned to 64 bytes.
 *   - outputs are passed like inputs (destination-passing): the LAST parameter is written.
 *   - returns 0 on success; otherwise tvm_memplan_last_error() says why (a shape/type check).
 * Scratch memory some kernels need goes through TVMBackendAllocWorkspace/FreeWorkspace in
 * tvm_memplan_runtime.c, from the region last given to tvm_memplan_set_workspace (no heap).
 */
#ifndef TVM_MEMPLAN_KERNELS_H_
#define TVM_MEMPLAN_KERNELS_H_
#include <stdint.h>
#include "tvm/ffi/c_api.h"

#ifdef __cplusplus
extern "C" {{
#endif

/* Message of the last failed kernel call (set by the stub of TVMFFIErrorSetRaisedFromCStrParts). */
const char* tvm_memplan_last_error(void);
/* Where kernel scratch memory comes from (model.c hands over the end of its arena). */
void tvm_memplan_set_workspace(void* base, uint32_t size);

/* Call a kernel on num_args tensors: packs them as TVMFFIAny and returns the kernel's status. */
static inline int32_t tvm_memplan_call(int32_t (*kernel)(void*, void*, int32_t, void*),
                                       DLTensor* tensors, int32_t num_args) {{
  TVMFFIAny packed[64];
  if (num_args > 64) return -1;
  for (int32_t i = 0; i < num_args; ++i) {{
    packed[i].type_index = kTVMFFIDLTensorPtr;
    packed[i].zero_padding = 0;
    packed[i].v_int64 = 0;
    packed[i].v_ptr = &tensors[i];
  }}
  return kernel(NULL, packed, num_args, NULL);
}}

{declarations}
#ifdef __cplusplus
}}
#endif
#endif  /* TVM_MEMPLAN_KERNELS_H_ */
"""

_MAIN = """\
/* Runs {kernel} once on the inputs in example_data.h and checks the output TVM's LLVM build gave. */
#include <math.h>
#include <stdio.h>
#include "kernels.h"
#include "example_data.h"

static uint8_t scratch[{workspace}] __attribute__((aligned(64)));

int main(void) {{
  tvm_memplan_set_workspace(scratch, sizeof(scratch));
  if (tvm_memplan_call({symbol}, example_args, EXAMPLE_NUM_ARGS) != 0) {{
    printf("FAIL: {kernel}: %s\\n", tvm_memplan_last_error());
    return 1;
  }}
  const {ctype}* out = (const {ctype}*)example_args[EXAMPLE_NUM_ARGS - 1].data;
  double worst = 0;
  for (int i = 0; i < EXAMPLE_OUTPUT_SIZE; ++i) {{
    double diff = fabs((double)out[i] - (double)expected_output[i]);
    double scale = fabs((double)expected_output[i]) > 1 ? fabs((double)expected_output[i]) : 1;
    if (diff / scale > worst) worst = diff / scale;
  }}
  printf("%s {kernel}: %d outputs, max relative difference %.3g\\n", worst <= 1e-4 ? "PASS" : "FAIL",
         EXAMPLE_OUTPUT_SIZE, worst);
  return worst <= 1e-4 ? 0 : 1;
}}
"""

_README = """\
# {model}: the whole model as standalone C

Generated by `tvm-memplan build --target {target} --emit-c` from TVM {version}'s C target and the
tvm-memplan arena plan. Nothing here needs the TVM runtime or a heap: `include/` holds the
header-only tvm-ffi and dlpack headers the kernels use, and `tvm_memplan_runtime.c` defines the
three runtime symbols they call (kernel scratch memory is a static pool).

| file | what |
|---|---|
| `model.h`, `model.c` | `{name}_init(arena, size)`, `{name}_run(...)`: {kernel_calls} kernel calls on a \
{arena_bytes}-byte arena |
| `model_weights.c` | the weights as `const` arrays ({weight_bytes} bytes) |
| `kernels.c` | the {count} kernels (TVM's output, symbols renamed `{name}_kernel_<kernel>`) |
| `kernels.h` | calling convention, one prototype per kernel with its tensor parameters |
| `tvm_memplan_runtime.c` | error buffer and scratch allocator ({workspace_bytes} bytes after the tensors); weak |
| `main.c`, `platform_*.c` | a harness: reads `input0.bin`..., runs the model, writes `output0.bin`... |
| `startup_cortexm.c`, `cortex_m.ld` | Cortex-M startup (stack painting) and the linker script for the emulated board |
| `example_main.c`, `example_data.h` | runs `{example}` alone on fixed inputs and checks TVM's LLVM output |
| `Makefile` | `make` (this machine), `make cortex-m`, `make run-qemu` |
| `memplan_c.json` | what `tvm-memplan measure DIR --device ...` checks against |

Run it: `tvm-memplan measure DIR --device host` (this machine) or `--device qemu-cortex-m7`.
"""


def int8_io_spec(spec: str, directory: str | Path) -> str:
    """The model ``spec`` (QDQ) with int8 inputs and outputs (:mod:`tvm_memplan.quant.int8_io`), written
    to ``DIR/int8-io/<name>.onnx``: what ``build --int8-io`` searches splits of, builds and checks."""
    return _int8_io_model(load_model(spec), Path(directory))[0]


def _int8_io_model(model: LoadedModel, directory: Path) -> tuple[str, LoadedModel]:
    from ..quant.int8_io import with_int8_io
    from ..quant.reference import is_quantized

    if not is_quantized(model.onnx_model):
        raise UserError(f"--int8-io takes an int8 (QDQ) model; {model.name} is not quantized (tvm-memplan quantize)")
    directory.mkdir(parents=True, exist_ok=True)
    path = (directory / "int8-io" / f"{c_identifier(model.name)}.onnx").resolve()  # the model's name kept
    path.parent.mkdir(exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    onnx.save(with_int8_io(model.onnx_model), str(partial))
    partial.replace(path)
    return str(path), load_model(str(path))


def emit_c(
    spec: str,
    directory: str | Path,
    target_name: str = "c",
    io_in_arena: bool = False,
    int8_io: bool = False,
    kernel_checks: bool = True,
    requantize: str = "exact",
    **options: Any,
) -> EmittedC:
    """Write the model ``spec`` (TVM's C target, memplan pipeline) as a standalone C project.

    A target that is not C (``host``, ``llvm-aarch64``, ...) gets the C of the plain ``c`` target.
    ``io_in_arena``: the inputs and outputs are tensors of the arena (:mod:`tvm_memplan.relax.io_tensors`).
    ``int8_io``: a QDQ model takes and gives int8 codes (:mod:`tvm_memplan.quant.int8_io`); the model
    built, and checked by ``measure``, is that graph, written to ``DIR/int8-io/<name>.onnx``.
    ``kernel_checks=False``: TVM's kernels do not check their arguments (see below).
    ``requantize``: how the Cortex-M whole-layer kernels requantize (:data:`.mcu_dsp.REQUANTIZATIONS`).
    """
    directory = Path(directory)
    target = get_target(target_name)
    if not target.is_c:
        target = get_target("c")
    if target.board is None:
        target = dataclasses.replace(target, board=get_target("c-standalone").board)
    model = load_model(spec)
    if int8_io:
        spec, model = _int8_io_model(model, directory)
    split = options.get("prepare")
    if io_in_arena:
        options["prepare"] = (lambda mod: with_io_tensors(split(mod))) if split else with_io_tensors
    plan = plan_for(model, target, **options)
    # TVM's packed functions check every tensor argument (shape, type, alignment) with an error message of
    # its own; model.c passes what the plan fixed, so these can go, as TF_LITE_STRIP_ERROR_STRINGS drops TFLite
    # Micro's: less flash (the messages) and fewer instructions per kernel call
    checks = (
        contextlib.nullcontext() if kernel_checks else tvm.transform.PassContext(config={"tirx.disable_assert": True})
    )
    with checks:
        executable = compile_plan(plan, "memplan")
    c_modules = [m for m in executable.mod.imports if m.kind == "c"]
    if not c_modules:
        raise UserError(f"{model.name}: TVM's C target produced no C module")
    source = c_modules[0].inspect_source()
    kernels = _DEFINITION.findall(source)
    functions = {gv.name_hint: f for gv, f in plan.planned.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    signatures = {name: _params(functions[name]) if name in functions else None for name in kernels}
    # (not a whole-layer C kernel's call: TVM's LLVM, which computes the example's output, cannot run it)
    runnable = [
        n
        for n, p in signatures.items()
        if p and len(p) >= 2 and not is_layer_call(functions[n]) and not is_row_band(functions[n])
    ]
    if not runnable:
        raise UserError(f"{model.name}: no kernel with static tensor parameters to run in the example")
    # The smallest kernel that computes something from weights (3+ tensors), not a plain copy.
    example = min(
        runnable, key=lambda name: (len(signatures[name]) < 3, sum(int(np.prod(p.shape)) for p in signatures[name]))
    )

    directory.mkdir(parents=True, exist_ok=True)
    headers = _copy_headers(source, directory / "include")
    if not headers:
        raise UserError("TVM's C headers were not found next to the installed tvm and tvm_ffi packages")
    name = c_identifier(model.name)
    declarations = []
    for kernel in kernels:
        params = signatures[kernel]
        described = ", ".join(f"{p.name}: {p.dtype}{list(p.shape)}" for p in params) if params else "see kernels.c"
        declarations.append(
            f"/* {kernel}({described}) */\nint32_t {kernel_symbol(name, kernel)}(void* self, void* args, "
            "int32_t num_args, void* result);\n"
        )
    kernels_c = with_micro_kernels(source, requantize)
    if target.board.cpu in HELIUM_CPUS:  # (and, in the C, only where the compiler enables MVE)
        kernels_c = with_mve_kernels(kernels_c)
    (directory / "kernels.c").write_text(prefix_kernel_symbols(kernels_c, name))
    fields = {"model": model.name, "count": len(kernels), "version": tvm.__version__, "example": example}
    (directory / "kernels.h").write_text(
        _HEADER.format(declarations="\n".join(declarations), prefix=kernel_symbol(name, ""), **fields)
    )
    (directory / "example_data.h").write_text(_example_data(example, functions[example], signatures[example]))
    emitted = emit_model_c(plan, spec, source, directory, target, split=split is not None)
    ctype = C_TYPES[signatures[example][-1].dtype][0]
    (directory / "example_main.c").write_text(
        _MAIN.format(
            kernel=example, symbol=kernel_symbol(name, example), ctype=ctype, workspace=max(emitted.workspace_bytes, 1)
        )
    )
    (directory / "README.md").write_text(
        _README.format(
            target=target.name, name=emitted.name, arena_bytes=emitted.arena_bytes, **emitted.figures(), **fields
        )
    )
    return EmittedC(directory, kernels, example, emitted)
