"""TVM-free planning core: problems, lifetimes, lower bounds, allocators, validation."""

from .aliasing import coalesce, plan_aliased
from .allocators import Allocator, GreedyBestFit, Plan, default_allocators, plan_memory
from .lifetimes import Operator, problem_from_graph, tensor_lifetimes
from .problem import (
    DEFAULT_ALIGNMENT,
    AliasGroup,
    Buffer,
    Problem,
    ProblemFormatError,
    align_up,
    read_minimalloc_csv,
    write_offsets_csv,
)
from .validate import InvalidPlanError, validate_offsets

__all__ = [
    "DEFAULT_ALIGNMENT",
    "AliasGroup",
    "Allocator",
    "Buffer",
    "GreedyBestFit",
    "InvalidPlanError",
    "Operator",
    "Plan",
    "Problem",
    "ProblemFormatError",
    "align_up",
    "coalesce",
    "plan_aliased",
    "default_allocators",
    "plan_memory",
    "problem_from_graph",
    "read_minimalloc_csv",
    "tensor_lifetimes",
    "validate_offsets",
    "write_offsets_csv",
]
