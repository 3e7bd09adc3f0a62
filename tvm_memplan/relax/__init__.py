"""Relax adapters (IR → problem, plan → IR), the planning pass, and the pipeline.

The names below are imported on first use (PEP 562 ``__getattr__``): the pipeline imports the quant,
schedule and backend packages, and those use helpers of this package (``ir_utils``), so importing this
package must not import the pipeline. The pipeline function itself is ``tvm_memplan.pipeline`` (or
``tvm_memplan.relax.pipeline.pipeline``); ``tvm_memplan.relax.pipeline`` is its module.
"""

from __future__ import annotations

import importlib
from typing import Any

_SOURCES = {
    "ARENA_PASS_NAME": "passes",
    "ArenaPlanBlockMemory": "passes",
    "PlanReport": "passes",
    "plan_function": "passes",
    "ArenaProblem": "extract",
    "FunctionPlanInput": "extract",
    "extract_plan_input": "extract",
    "LAYER_ORDER_PASS_NAME": "grouping",
    "LayerOrder": "grouping",
    "REORDER_PASS_NAME": "reorder",
    "OrderReport": "reorder",
    "ReorderForMemory": "reorder",
    "Stages": "pipeline",
    "resolve_target": "pipeline",
    "stage_passes": "pipeline",
    "AllocSite": "sites",
}

__all__ = sorted(_SOURCES)


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_SOURCES[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_SOURCES})
