"""Planning a model for a deploy target (shared by building, tuning, grouping and the C writer)."""

from __future__ import annotations

from typing import Any

from ..frontend import LoadedModel
from ..planner import ModelPlan, plan_model
from .targets import DeployTarget


def plan_for_target(model: LoadedModel, target: DeployTarget, **options: Any) -> ModelPlan:
    """Plan ``model`` for ``target`` with its default kernels."""
    target.check_codegen()
    tvm_target = target.tvm_target()
    with tvm_target:  # some backends (Adreno) read the current target while composing passes
        return plan_model(model, tvm_target, **options)
