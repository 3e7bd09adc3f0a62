"""The canonical search: exact on small problems, anytime on large ones, never invalid."""

import time

import pytest
from hypothesis import given, settings
from ortools.sat.python import cp_model

from tvm_memplan.planning import Buffer, Problem, plan_memory, read_minimalloc_csv, validate_offsets
from tvm_memplan.planning.allocators import CanonicalSearch, greedy_allocators
from tvm_memplan.planning.allocators.search import SearchStopped, SearchStructure, fits_within

from ..shared_inputs import MINIMALLOC_CHALLENGING as CHALLENGING
from .examples import cut_square, problems


def cp_sat_optimum(problem: Problem) -> int:
    """The smallest arena by an independent exact method (CP-SAT), for tiny problems."""
    model = cp_model.CpModel()
    sizes, unit = problem.padded_sizes(), problem.alignment
    horizon = problem.naive_bytes() // unit
    slots = [model.NewIntVar(0, horizon, f"y{i}") for i in range(len(sizes))]
    intervals = [
        model.NewFixedSizeIntervalVar(y, s // unit, f"i{i}") for i, (y, s) in enumerate(zip(slots, sizes, strict=True))
    ]
    top = model.NewIntVar(0, horizon, "top")
    for i in range(len(sizes)):
        model.Add(top >= slots[i] + sizes[i] // unit)
        for j in range(i + 1, len(sizes)):
            if sizes[i] and sizes[j] and problem.must_not_overlap(i, j):
                model.AddNoOverlap([intervals[i], intervals[j]])
    model.Minimize(top)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    assert solver.Solve(model) == cp_model.OPTIMAL
    return int(solver.Value(top)) * unit


@settings(max_examples=80, deadline=None)
@given(problems(max_buffers=8, max_time=6))
def test_search_proves_the_same_optimum_as_cp_sat(problem):
    plan = CanonicalSearch().allocate(problem, time.monotonic() + 5)
    validate_offsets(problem, plan.offsets, plan.arena_bytes)
    assert plan.optimal  # tiny problems: the binary search closes the gap by proof
    assert plan.arena_bytes == cp_sat_optimum(problem)


def test_decision_search_finds_a_tiling_and_proves_one_unit_less_impossible():
    problem = cut_square(30, seed=4)
    structure = SearchStructure.build(problem)
    rank = structure.rank("WAT")
    offsets = fits_within(structure, 64, rank, node_limit=10**6, deadline=time.monotonic() + 10)
    assert offsets is not None
    validate_offsets(problem, offsets, arena_bytes=64)
    assert fits_within(structure, 63, rank, node_limit=10**6, deadline=time.monotonic() + 10) is None


def test_decision_search_stops_at_its_node_limit():
    structure = SearchStructure.build(cut_square(150, seed=0))
    with pytest.raises(SearchStopped):
        fits_within(structure, 64, structure.rank("TWA"), node_limit=5, deadline=time.monotonic() + 10)


@pytest.mark.parametrize("pieces, seed", [(40, 1), (80, 0), (80, 1), (80, 2)])
def test_search_closes_the_greedy_gap_on_tilings(pieces, seed):
    problem = cut_square(pieces, seed)
    greedy = plan_memory(problem, allocators=greedy_allocators())
    assert greedy.arena_bytes > 64  # best fit leaves a gap ...
    plan = CanonicalSearch().allocate(problem, time.monotonic() + 10)
    assert plan.arena_bytes == 64 and plan.optimal  # ... the search closes it


def test_conflicts_between_disjoint_lifetimes_block_decomposition():
    # a and c never live together, but must not share; b sits between them in time.
    buffers = [Buffer("a", 64, 0, 2), Buffer("b", 128, 2, 4), Buffer("c", 64, 4, 6), Buffer("d", 64, 0, 6)]
    problem = Problem(buffers, conflicts=frozenset({(0, 2)}))
    plan = CanonicalSearch().allocate(problem, time.monotonic() + 5)
    validate_offsets(problem, plan.offsets, plan.arena_bytes)
    assert plan.offsets[0] != plan.offsets[2]
    assert plan.arena_bytes == 192 and plan.optimal


def test_expired_deadline_still_returns_the_greedy_plan():
    problem = cut_square(150, seed=1)
    plan = CanonicalSearch().allocate(problem, time.monotonic() - 1)
    validate_offsets(problem, plan.offsets, plan.arena_bytes)
    assert plan.arena_bytes == plan_memory(problem, allocators=greedy_allocators()).arena_bytes
    assert not plan.optimal


def test_driver_uses_the_search_within_its_budget():
    problem = cut_square(150, seed=2)
    started = time.monotonic()
    plan = plan_memory(problem, time_budget=1.0)
    assert time.monotonic() - started < 1.5
    assert plan.allocator == "search-minimalloc" and plan.arena_bytes < min(
        size for name, size in plan.tried.items() if name.startswith("greedy")
    )


@pytest.mark.skipif(not CHALLENGING.is_dir(), reason="MiniMalloc benchmarks not on this machine")
@pytest.mark.parametrize("instance", ["C", "F"])
def test_search_on_small_challenging_instances(instance):
    problem = read_minimalloc_csv(CHALLENGING / f"{instance}.1048576.csv")
    plan = plan_memory(problem, time_budget=10)
    validate_offsets(problem, plan.offsets, plan.arena_bytes)
    assert plan.arena_bytes <= 1.15 * 1048576
    assert plan.allocator == "search-minimalloc"
