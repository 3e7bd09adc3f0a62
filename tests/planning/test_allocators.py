"""Every allocator yields plans the validator accepts; the driver keeps the best and stops early."""

import time

import pytest
from hypothesis import HealthCheck, given, settings

from tvm_memplan.planning import Buffer, GreedyBestFit, Problem, default_allocators, plan_memory, validate_offsets
from tvm_memplan.planning.allocators import CanonicalSearch, by_area, by_lifetime, by_size, greedy_allocators
from tvm_memplan.planning.allocators.greedy import best_fit_offset, conflict_lists

from .examples import nn_like_problem, pisarchyk_lee_problem, problems


def all_allocators():
    return [*greedy_allocators(), CanonicalSearch()]


def test_greedy_by_size_reaches_the_bound_on_the_paper_example():
    problem = pisarchyk_lee_problem()
    plan = GreedyBestFit(by_size).allocate(problem)
    assert plan.arena_bytes == 124 == problem.lower_bound()
    assert plan.optimal
    validate_offsets(problem, plan.offsets, plan.arena_bytes)


def test_driver_stops_at_the_lower_bound():
    plan = plan_memory(pisarchyk_lee_problem())
    assert plan.arena_bytes == 124 and plan.optimal
    assert plan.tried == {"greedy-size": 124}  # nothing after a plan that meets the bound


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_every_allocator_gives_a_valid_plan_within_the_bounds(problem):
    bound, naive = problem.lower_bound(), problem.naive_bytes()
    for allocator in all_allocators():
        plan = allocator.allocate(problem, time.monotonic() + 0.2)
        assert validate_offsets(problem, plan.offsets) <= plan.arena_bytes
        assert all(offset % problem.alignment == 0 for offset in plan.offsets)
        assert bound <= plan.arena_bytes <= naive
        assert plan.arena_bytes % problem.alignment == 0
        for i, j in problem.conflicts:
            if problem.buffers[i].size and problem.buffers[j].size:
                lo, hi = sorted((i, j), key=lambda k: plan.offsets[k])
                assert plan.offsets[lo] + problem.buffers[lo].size <= plan.offsets[hi]
        if plan.optimal and plan.arena_bytes > bound:
            assert isinstance(allocator, CanonicalSearch)  # only a search proves more than the bound


@settings(max_examples=60, deadline=None)
@given(problems(max_buffers=14))
def test_driver_picks_the_smallest_validated_plan(problem):
    plan = plan_memory(problem, time_budget=0.2)
    validate_offsets(problem, plan.offsets, plan.arena_bytes)
    assert plan.arena_bytes == min(plan.tried.values())
    assert plan.allocator in plan.tried


def test_conflict_lists_cover_lifetimes_and_declared_pairs():
    buffers = [Buffer("a", 8, 0, 2), Buffer("b", 8, 1, 3), Buffer("c", 8, 3, 4), Buffer("d", 8, 0, 4)]
    problem = Problem(buffers, conflicts=frozenset({(0, 2), (1, 3)}), alignment=1)
    neighbours = [sorted(nb) for nb in conflict_lists(problem)]
    assert neighbours == [[1, 2, 3], [0, 3], [0, 3], [0, 1, 2]]


def test_best_fit_picks_the_smallest_gap_that_fits():
    placed = [(0, 10), (30, 40), (45, 60), (100, 120)]  # gaps 10-30, 40-45, 60-100
    assert best_fit_offset(5, list(placed), 1) == 40
    assert best_fit_offset(15, list(placed), 1) == 10
    assert best_fit_offset(25, list(placed), 1) == 60
    assert best_fit_offset(50, list(placed), 1) == 120
    assert best_fit_offset(5, [(0, 3)], 4) == 4  # tops round up to the alignment


# Planning time on 600 tensors is measured by scripts/bench_memory.py, not asserted here.
@pytest.mark.parametrize("key", [by_size, by_area, by_lifetime])
def test_greedy_plans_a_600_tensor_graph(key):
    problem = nn_like_problem(600)
    plan = GreedyBestFit(key).allocate(problem)
    validate_offsets(problem, plan.offsets, plan.arena_bytes)


def test_driver_greedy_path_on_600_tensors():
    problem = nn_like_problem(600)
    plan = plan_memory(problem, allocators=greedy_allocators())
    validate_offsets(problem, plan.offsets, plan.arena_bytes)
    assert plan.arena_bytes >= problem.lower_bound()


def test_driver_honours_the_time_budget_and_refuses_aliases():
    problem = nn_like_problem(300, seed=3)
    started = time.monotonic()
    plan = plan_memory(problem, time_budget=1.0)
    assert time.monotonic() - started < 2.0
    validate_offsets(problem, plan.offsets, plan.arena_bytes)
    aliased = Problem([Buffer("a", 64, 0, 2), Buffer("b", 64, 1, 3)], aliases={1: (0, 0)})
    with pytest.raises(ValueError, match="plan_aliased"):
        plan_memory(aliased)


def test_default_allocators_end_with_the_search():
    names = [allocator.name for allocator in default_allocators()]
    assert names == ["greedy-size", "greedy-area", "greedy-lifetime", "search-minimalloc"]
