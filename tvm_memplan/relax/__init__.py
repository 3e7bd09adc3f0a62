"""Relax adapters (IR → problem, plan → IR), the planning pass, and the pipeline."""

from .extract import ArenaProblem, FunctionPlanInput, extract_plan_input
from .grouping import LAYER_ORDER_PASS_NAME, LayerOrder
from .passes import ARENA_PASS_NAME, ArenaPlanBlockMemory, PlanReport, plan_function
from .pipeline import Stages, pipeline, resolve_target, stage_passes
from .reorder import REORDER_PASS_NAME, OrderReport, ReorderForMemory
from .sites import AllocSite

__all__ = [
    "ARENA_PASS_NAME",
    "LAYER_ORDER_PASS_NAME",
    "REORDER_PASS_NAME",
    "AllocSite",
    "ArenaPlanBlockMemory",
    "ArenaProblem",
    "FunctionPlanInput",
    "LayerOrder",
    "OrderReport",
    "PlanReport",
    "ReorderForMemory",
    "Stages",
    "extract_plan_input",
    "pipeline",
    "plan_function",
    "resolve_target",
    "stage_passes",
]
