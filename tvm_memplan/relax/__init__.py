"""Relax adapters (IR → problem, plan → IR), the planning pass, and the pipeline."""

from .extract import AllocSite, ArenaProblem, FunctionPlanInput, extract_plan_input
from .passes import PASS_NAME, ArenaPlanBlockMemory, PlanReport, plan_function
from .pipeline import pipeline, resolve_target, stage_passes

__all__ = [
    "PASS_NAME",
    "AllocSite",
    "ArenaPlanBlockMemory",
    "ArenaProblem",
    "FunctionPlanInput",
    "PlanReport",
    "extract_plan_input",
    "pipeline",
    "plan_function",
    "resolve_target",
    "stage_passes",
]
