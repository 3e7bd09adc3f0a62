"""Heap algorithms behind one interface, and a driver that keeps the smallest plan."""

from .base import Allocator, Plan, arena_bytes
from .driver import default_allocators, greedy_allocators, plan_memory
from .greedy import GreedyBestFit, by_area, by_lifetime, by_size
from .search import CanonicalSearch

__all__ = [
    "Allocator",
    "CanonicalSearch",
    "GreedyBestFit",
    "Plan",
    "arena_bytes",
    "by_area",
    "by_lifetime",
    "by_size",
    "default_allocators",
    "greedy_allocators",
    "plan_memory",
]
