"""The whole planned model as standalone C with one static arena (``build --emit-c DIR``).

The planned Relax ``main`` is a straight line of destination-passing kernel calls on tensors that
sit at fixed offsets of the arena (``R.memory.alloc_tensor(arena, offset, ...)``), on the inputs,
on constants and on the outputs. :mod:`.mcu_program` walks that line, :mod:`.mcu_c` writes it out as C: one
``static uint8_t memplan_arena[N]`` of exactly the planned size, every weight a ``const`` array
(int8 weights of a QDQ model as ``const int8_t``, their biases ``int32_t``), and a ``<name>_run``
function that calls TVM's C kernels in the planned order with pointers ``arena + offset``. On a core
with the DSP extension, an int8 model's depthwise, 1x1 and stem convolutions are calls of whole-layer
C kernels written for SMLAD (:mod:`.mcu_layers_c`), which TVM's kernels call as external functions;
on a core with Helium (the M55) the 1x1, dense and depthwise ones run MVE definitions (:mod:`.mcu_mve`).
In-place kernels and eliminated concatenations need nothing special: they are already offsets in
the plan. Nothing is allocated at run time, and nothing of TVM beyond its header-only
tvm-ffi/dlpack headers is needed.

The firmware API follows what TensorFlow Lite Micro's users know: ``<name>_init(void* arena,
size_t size)`` binds caller memory (checked for alignment and size, an error code otherwise) that
holds the tensors and the kernels' scratch; without it the static arena is used, which
``MEMPLAN_ARENA_SECTION`` places in a linker section (DTCM, say). Every global symbol carries the
model's name, so two models link into one firmware and can take turns on one arena.

This module writes the project and its manifest (what ``measure DIR`` reads) and checks the limits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import tvm

from ..errors import UserError
from ..planner import ModelPlan
from ..relax.io_tensors import io_copies
from . import mcu_files
from .manifest import load_manifest, save_manifest
from .mcu_c import harness_source, model_header, model_source, padded, weights_source
from .mcu_program import (
    KERNEL_DEFINITION,
    c_identifier,
    edge_quantization,
    extract_program,
    peak_tensors,
    step_table,
    workspace_bytes,
)

MANIFEST = "memplan_c.json"

PLAN_FIGURES = ("workspace_bytes", "weight_bytes", "tvm_default_bytes", "naive_bytes", "kernel_calls")
"""The figures of a :class:`ModelC` that build's summary, its README and a measurement report under these names."""
"""What ``measure DIR`` reads: the model, the plan's figures, inputs and outputs."""


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
    io_in_arena: bool = False
    """Whether the inputs and outputs live in the arena (``<name>_input(i)``), not in the caller's buffers."""

    def figures(self, names: tuple[str, ...] = PLAN_FIGURES) -> dict[str, Any]:
        """The fields ``names`` (:data:`PLAN_FIGURES` by default) by name."""
        return {name: getattr(self, name) for name in names}

    def save(self, directory: Path) -> None:
        save_manifest(self, directory / MANIFEST)

    @classmethod
    def load(cls, directory: Path) -> ModelC:
        missing = f"{directory} has no {MANIFEST}: write it with tvm-memplan build --emit-c DIR"
        return load_manifest(cls, Path(directory) / MANIFEST, missing, "tvm-memplan C manifest")


def emit_model_c(plan: ModelPlan, spec: str, source: str, directory: Path, target: Any, split: bool = False) -> ModelC:
    """Write ``model.h``, ``model.c``, ``model_weights.c``, the harness, the Cortex-M startup and
    linker script, the runtime and the Makefile into ``directory`` (``kernels.c`` is written by the
    caller from ``source`` through :func:`prefix_kernel_symbols`)."""
    name = c_identifier(plan.model.name)
    program = extract_program(plan.planned["main"], prefix=name, io_roles=io_copies(plan.planned))
    if sum(size for _, size in program.arenas) != plan.main.arena_bytes:
        raise UserError(
            f"{plan.model.name}: the program's arena ({program.arenas}) is not the planned "
            f"{plan.main.arena_bytes} bytes"
        )
    defined = set(KERNEL_DEFINITION.findall(source))
    missing = sorted({s.kernel for s in program.steps} - defined)
    if missing:
        raise UserError(f"{plan.model.name}: kernels {', '.join(missing)} are missing from TVM's C output")
    workspace = workspace_bytes(source, {s.kernel for s in program.steps} | defined)
    edges = edge_quantization(plan.model.onnx_model)
    board = target.board
    files = {
        "model.h": model_header(name, plan.model.name, program, workspace, edges),
        "model.c": model_source(name, plan.model.name, program, plan, workspace),
        "model_weights.c": weights_source(plan.model.name, program),
        "main.c": harness_source(name, program),
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
            for i, (r, q) in enumerate(zip(program.inputs, padded(edges[0], len(program.inputs)), strict=True))
        ],
        outputs=[
            {
                "shape": list(r.shape),
                "dtype": r.dtype,
                "file": f"output{i}.bin",
                "quantization": asdict(q) if q else None,
            }
            for i, (r, q) in enumerate(zip(program.outputs, padded(edges[1], len(program.outputs)), strict=True))
        ],
        peak_live_bytes=peak_bytes,
        peak_tensors=peak,
        split=split,
        io_in_arena=program.io_in_arena,
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
