"""Build deployable artifacts: a shared library for the Relax VM plus a JSON manifest beside it.

The manifest (``OUT.so.json``) says what the library is (model, target, pipeline, input shapes) and
what the plan expects the VM to request, so ``measure OUT.so`` can run it on a remote device and
check it against a local reference without the user repeating any of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import tvm

from ..errors import UserError
from ..frontend import LoadedModel, fold_constants, load_model
from ..planner import ModelPlan
from . import error_line
from .artifact import constant_bytes, library_constants
from .manifest import load_manifest, save_manifest
from .plans import plan_for_target
from .targets import DeployTarget, get_target
from .tune import apply_tuning

PIPELINES = ("stock", "memplan")
"""What ``measure --compare`` sets side by side: TVM's planner and memplan over the same kernels."""
TVM_STOCK = "tvm"
"""TVM's pipeline as it ships: its own kernels (no default schedules) and its own planner."""


@dataclass
class Manifest:
    """What an artifact is and what its VM should request."""

    model: str
    """How to load the model again: ``zoo:...`` or an absolute ONNX path."""
    target: str
    pipeline: str
    tvm_target: str
    storage_bytes: int
    """Storage the planner allocates: memplan's arenas, or StaticPlanBlockMemory's blocks (stock)."""
    output_bytes: int
    """Function outputs, which no planner places: the VM allocates them on every call."""
    inputs: list[dict[str, Any]]
    options: dict[str, Any] = field(default_factory=dict)
    tuning_dir: str | None = None
    cross_compiler: str | None = None
    """The linker named with ``--cross-compiler`` instead of the target's own."""
    tvm_version: str = tvm.__version__
    constant_bytes: int | None = None
    """Bytes of the tensors the library holds: the weights as shipped (:mod:`.artifact`); None in
    manifests written before it was recorded."""

    @property
    def planned_bytes(self) -> int:
        """What the VM should request in total when the plan is what runs."""
        return self.storage_bytes + self.output_bytes

    def save(self, artifact: Path) -> None:
        save_manifest(self, manifest_path(artifact))

    @classmethod
    def load(cls, artifact: Path) -> Manifest:
        path = manifest_path(artifact)
        missing = f"{artifact} has no manifest {path.name}: build it with tvm-memplan build"
        return load_manifest(cls, path, missing, "tvm-memplan manifest")


def manifest_path(artifact: Path) -> Path:
    return Path(str(artifact) + ".json")


def model_reference(spec: str) -> str:
    """A spec that loads the same model from any directory."""
    return spec if spec.startswith("zoo:") else str(Path(spec).resolve())


def output_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the graph outputs (static shapes; a dynamic output cannot be measured anyway). An exporter that
    left an output's shape symbolic although the inputs are static (the TorchScript exporter's Swin) has it
    from onnxruntime's constant folding, as :func:`~tvm_memplan.frontend.to_relax` imports such graphs."""
    if not all(d.dim_value for value in model.graph.output for d in value.type.tensor_type.shape.dim):
        with contextlib.suppress(UserError):
            model = fold_constants(model)
    total = 0
    for value in model.graph.output:
        tensor_type = value.type.tensor_type
        dims = [d.dim_value for d in tensor_type.shape.dim]
        if not all(dims):
            raise UserError(
                f"output {value.name!r} has a dynamic shape: bind the inputs' dynamic dimensions with "
                "--input-shapes NAME:1x3x224x224 (or export the model with static shapes)"
            )
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)).itemsize
        total += int(np.prod(dims)) * itemsize
    return total


def plan_for(model: LoadedModel, target: DeployTarget, tuning_dir: str | None = None, **options: Any) -> ModelPlan:
    """Plan ``model`` for ``target``, with kernels from a MetaSchedule database when given one."""
    plan = plan_for_target(model, target, **options)
    return apply_tuning(plan, tuning_dir) if tuning_dir else plan


def compile_plan(plan: ModelPlan, pipeline: str) -> tvm.runtime.Executable:
    if pipeline not in (*PIPELINES, TVM_STOCK):
        raise UserError(f"unknown pipeline {pipeline!r}; known: {', '.join((*PIPELINES, TVM_STOCK))}")
    try:
        if pipeline == TVM_STOCK:
            return plan.build_stock(schedule="none")
        return plan.build() if pipeline == "memplan" else plan.build_stock()
    except (RuntimeError, ValueError) as exc:
        raise UserError(
            f"{plan.model.name}: TVM could not compile for {plan.target.kind.name}: {error_line(exc)}"
        ) from None


def manifest_for(
    plan: ModelPlan, spec: str, target: DeployTarget, pipeline: str, tuning_dir: str | None, cross_compiler: str | None
) -> Manifest:
    storage = plan.total("arena_bytes") if pipeline == "memplan" else plan.tvm_default_bytes
    return Manifest(
        model=model_reference(spec),
        target=target.name,
        pipeline=pipeline,
        tvm_target=str(plan.target),
        storage_bytes=int(storage),
        output_bytes=output_bytes(plan.model.onnx_model),
        inputs=[{"name": n, "shape": list(s), "dtype": str(d)} for n, s, d in plan.model.input_specs()],
        options=dataclasses.asdict(plan.options),
        tuning_dir=str(Path(tuning_dir).resolve()) if tuning_dir else None,
        cross_compiler=cross_compiler,
    )


def export(executable: tvm.runtime.Executable, target: DeployTarget, manifest: Manifest, output: Path) -> Path:
    """Write the library and its manifest; the library goes to a temporary name first."""
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(f".{output.name}.partial.so")
    try:
        target.export(executable, str(partial))
    except RuntimeError as exc:
        partial.unlink(missing_ok=True)
        raise UserError(f"linking {output.name} for {target.name} failed: {error_line(exc)}") from None
    partial.replace(output)
    manifest.constant_bytes = constant_bytes(library_constants(output)).total
    manifest.save(output)
    return output


def build_artifacts(
    spec: str,
    target_name: str,
    outputs: dict[str, Path],
    tuning_dir: str | None = None,
    cross_compiler: str | None = None,
    **options: Any,
) -> dict[str, Path]:
    """Plan once and build one artifact per pipeline (``{pipeline: path}``): the kernels are identical,
    except ``tvm``'s on GPU targets (TVM's own schedules)."""
    target = get_target(target_name, cross_compiler)
    model = load_model(spec)
    plan = plan_for(model, target, tuning_dir, **options)
    for pipeline, path in outputs.items():
        chosen = plan
        if pipeline == TVM_STOCK and plan.target.kind.name not in ("llvm", "c"):
            # GPU kernels are scheduled before planning: TVM's own (dlight alone) need a plan of their own
            chosen = plan_for(model, target, tuning_dir, **{**options, "schedule": "none"})
        manifest = manifest_for(chosen, spec, target, pipeline, tuning_dir, cross_compiler)
        export(compile_plan(chosen, pipeline), target, manifest, Path(path))
    return outputs


def build(
    spec: str,
    target_name: str,
    output: str | Path,
    pipeline: str = "memplan",
    tuning_dir: str | None = None,
    cross_compiler: str | None = None,
    **options: Any,
) -> Path:
    """Build one artifact at ``output``."""
    output = Path(output)
    if output.suffix != ".so":
        raise UserError(f"the artifact must be a .so file, got {output}")
    if get_target(target_name).is_mcu:
        raise UserError(f"target {target_name} has no VM library: drop -o and write the C with --emit-c DIR")
    build_artifacts(spec, target_name, {pipeline: output}, tuning_dir, cross_compiler, **options)
    return output
