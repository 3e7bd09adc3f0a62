"""TVM's default Relax pipeline with the memplan passes in place of StaticPlanBlockMemory."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tvm

from ..backends.schedules import with_gpu_schedules
from ..backends.vulkan.glsl import scalar_slots
from ..errors import UserError
from ..options import MemplanOptions, current_options
from ..quant.lower import LowerQDQ
from ..quant.mcu_kernels import legalize_row_slice
from ..schedule import DefaultCPUSchedule
from ..schedule.cpu.spec import cpu_spec
from .fold import FoldDataMovementConstants
from .fusion import FuseGroupKernels
from .grouping import LayerOrder
from .layout import BlockedLayout, layout_block
from .offsets import BakeKernelOffsets, KernelOffsetParams, kernels_take_offsets
from .passes import ArenaPlanBlockMemory, PlanReport
from .reorder import OrderReport, ReorderForMemory
from .tile_kernels import MergeTileKernels
from .tile_writes import PlaceRowsByCopies, WriteTilesInPlace
from .vector_math import VECTOR_MATH_LEGALIZE

_SPBM = "StaticPlanBlockMemory"
_RESHAPE = "RewriteDataflowReshape"
FUSED_KINDS = ("vulkan", "opencl", "cuda", "rocm", "metal")
"""GPU targets: with layer grouping, each group's kernels run as one fused launch."""


def resolve_target(target: Any) -> tvm.target.Target:
    """A ``tvm.target.Target`` from a Target, a dict, a kind name, or None (this machine's CPU)."""
    if target is None or target == "host":
        return tvm.target.Target.from_device("cpu")
    if isinstance(target, tvm.target.Target):
        return target
    try:
        return tvm.target.Target(target)
    except Exception as exc:  # TVM raises several types for a bad target
        raise UserError(f"invalid target {target!r}: {str(exc).splitlines()[0]}") from None


def _backend_module(target: tvm.target.Target):
    """The ``relax.backend`` pipeline module TVM's ``get_default_pipeline`` would use."""
    kind = target.kind.name
    if kind in ("llvm", "c"):
        name = "cpu_generic"
    elif kind in ("cuda", "rocm"):
        name = kind
    elif kind == "opencl" and "adreno" in target.keys:
        name = "adreno"
    elif kind in ("metal", "vulkan", "opencl", "webgpu"):
        name = "gpu_generic"
        if kind == "vulkan":
            from ..backends.vulkan import register

            register()  # the wheel has no target.build.vulkan: tvm_memplan's GLSL generator stands in
    else:
        raise UserError(f"target kind {kind!r} has no Relax pipeline in TVM 0.27")
    return importlib.import_module(f"tvm.relax.backend.{name}.pipeline")


@dataclass
class Stages:
    """TVM's default passes for a target, cut where tvm_memplan inserts its own."""

    dataflow: list
    """Up to ``RewriteDataflowReshape``: fused kernels in dataflow blocks, reshapes are views; then
    split row tiles written into their rows (:func:`~tvm_memplan.relax.tile_writes.WriteTilesInPlace`)."""
    lowering: list
    """The rest before memory planning (``ToNonDataflow`` ... ``CallTIRRewrite``)."""
    finalize: list
    """``StaticPlanBlockMemory`` and everything after it."""


def stage_passes(target: tvm.target.Target, schedule: str = "default", layout: str = "auto") -> Stages:
    """TVM's passes for ``target`` split at the insertion points of reordering and arena planning.
    GPU kernels are scheduled in the first stage: ``schedule="none"`` leaves them to TVM's rules.
    The frontend's constant-only reshapes and selects are folded in numpy first (``FoldConstant``
    would build each one with LLVM). On CPU targets the QDQ groups of an int8 model become integer
    kernels first (:func:`~tvm_memplan.quant.lower.LowerQDQ`). Unless ``layout="nchw"``, on an ``llvm``
    target whose vectors hold a channel block (:func:`~.layout.channel_block`), convolutions run in
    blocked channel layouts (:func:`~.layout.BlockedLayout`).
    On ``llvm`` targets float32 ``exp``, ``sigmoid``, SiLU and ``erf`` are legalized as arithmetic that vectorizes
    (:mod:`.vector_math`); on a Cortex-M with the DSP extension, int8 row slices and a line buffer's placed
    rows as whole-row copies (:func:`~tvm_memplan.quant.mcu_kernels.legalize_row_slice`,
    :func:`~.tile_writes.PlaceRowsByCopies`)."""
    backend = _backend_module(target)
    legalize = with_gpu_schedules(list(backend.legalize_passes(target)), backend.__name__.split(".")[-2], schedule)
    own_legalizations = {}
    if target.kind.name == "llvm":
        own_legalizations.update(VECTOR_MATH_LEGALIZE)
    row_copies = target.kind.name == "c" and cpu_spec(target).int8_dot == "dsp-smlad"
    if row_copies:  # split row tiles' input rows
        own_legalizations["relax.strided_slice"] = legalize_row_slice
    if own_legalizations:
        legalize = [
            tvm.relax.transform.LegalizeOps(own_legalizations) if p.info.name == "LegalizeOps" else p for p in legalize
        ]
    quantized = [LowerQDQ(target=target)] if target.kind.name in ("llvm", "c") else []
    quantized += [PlaceRowsByCopies()] if row_copies else []  # an int8 line buffer's kept rows
    block = layout_block(target, layout)
    blocked = [BlockedLayout(block, cpu_spec(target))] if block else []
    before = (
        quantized
        + [FoldDataMovementConstants()]
        + blocked
        + backend.library_dispatch_passes(target)
        + legalize
        + backend.dataflow_lower_passes(target)
    )
    finalize = list(backend.finalize_passes(target))
    names = [p.info.name for p in finalize]
    if _SPBM not in names:
        raise UserError(f"TVM's pipeline for {target.kind.name} has no {_SPBM} to replace")
    at = names.index(_SPBM)
    before += finalize[:at]
    before_names = [p.info.name for p in before]
    cut = before_names.index(_RESHAPE) + 1 if _RESHAPE in before_names else len(before)
    return Stages(before[:cut] + [WriteTilesInPlace(), MergeTileKernels(target, schedule)], before[cut:], finalize[at:])


def order_passes(options: MemplanOptions, on_order_report: Callable[[OrderReport], None] | None = None) -> list:
    """Layer-wise order when grouping (every group consecutive), else the memory-driven order."""
    if options.groups is not None:
        return [LayerOrder(options.groups, options.inplace)]
    return [ReorderForMemory(options.order, options.order_seconds, options.inplace, on_order_report)]


def schedule_passes(target: tvm.target.Target, options: MemplanOptions) -> list:
    """The kernel passes after planning: tvm_memplan's default CPU schedules for ``llvm``/``c``
    targets unless ``schedule="none"`` (GPU kernels are scheduled before planning, in
    :func:`stage_passes`); on OpenCL and Vulkan, kernels that read their buffers at an offset; on GPU
    targets with layer grouping, one fused launch per group; on Vulkan, no kernel with more scalars
    than its push constants hold."""
    passes = []
    if options.schedule != "none" and target.kind.name in ("llvm", "c"):
        passes.append(DefaultCPUSchedule(target))
    if kernels_take_offsets(target):
        passes.append(KernelOffsetParams())
    if options.groups is not None and target.kind.name in FUSED_KINDS:
        passes.append(FuseGroupKernels())
    if target.kind.name == "vulkan":
        passes.append(BakeKernelOffsets(scalar_slots(target)))
    return passes


def pipeline(
    target: Any = None,
    on_report: Callable[[PlanReport], None] | None = None,
    on_order_report: Callable[[OrderReport], None] | None = None,
    **options: Any,
) -> tvm.transform.Pass:
    """A Pass equal to TVM's default pipeline for ``target`` with the memplan passes inserted.

    Dataflow bindings are reordered for memory after ``RewriteDataflowReshape``; the arena
    planner runs before SPBM, which stays only for what the planner leaves (tensors with
    symbolic shapes); on CPU targets every kernel then gets a default schedule (after the
    planner, whose in-place analysis reads the unscheduled kernels). ``options`` are
    :class:`~tvm_memplan.options.MemplanOptions` fields; unset ones come from :func:`tvm_memplan.config` when the
    pipeline runs.
    """
    resolved_target = resolve_target(target)
    stage_passes(resolved_target)  # reject a target without a Relax pipeline now, not at compile time
    MemplanOptions().updated(**options)  # likewise unknown options

    @tvm.transform.module_pass(opt_level=0, name="tvm_memplan.pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        run_options = current_options().updated(**options)
        stages = stage_passes(resolved_target, run_options.schedule, run_options.layout)
        with resolved_target:
            seq = tvm.transform.Sequential(
                stages.dataflow
                + order_passes(run_options, on_order_report)
                + stages.lowering
                + [ArenaPlanBlockMemory(run_options, on_report)]
                + schedule_passes(resolved_target, run_options)
                + stages.finalize
            )
            return seq(mod)

    return _pipeline
