"""The independent validator accepts exactly the placements that keep the rules."""

import pytest

from tvm_memplan.planning import Buffer, InvalidPlanError, Problem, validate_offsets

from .examples import pisarchyk_lee_problem

# A placement of the Pisarchyk & Lee example in 124 bytes (t5 and t0 at the bottom).
GOOD = [0, 32, 64, 100, 116, 0, 104, 64]


def test_accepts_a_valid_plan_and_returns_its_arena():
    problem = pisarchyk_lee_problem()
    assert validate_offsets(problem, GOOD) == 124
    assert validate_offsets(problem, GOOD, arena_bytes=124) == 124


def test_rejects_overlap_of_buffers_alive_together():
    broken = list(GOOD)
    broken[4] = 100  # t4 onto t3, both alive at operators 4 and 5
    with pytest.raises(InvalidPlanError, match="overlap while both are live"):
        validate_offsets(pisarchyk_lee_problem(), broken)


def test_rejects_misaligned_negative_and_out_of_arena_offsets():
    problem = Problem([Buffer("a", 64, 0, 2), Buffer("b", 64, 1, 3)])
    validate_offsets(problem, [0, 64], arena_bytes=128)
    with pytest.raises(InvalidPlanError, match="not 64-byte aligned"):
        validate_offsets(problem, [0, 96])
    with pytest.raises(InvalidPlanError, match="negative offset"):
        validate_offsets(problem, [-64, 64])
    with pytest.raises(InvalidPlanError, match="beyond the arena"):
        validate_offsets(problem, [0, 64], arena_bytes=64)
    with pytest.raises(InvalidPlanError, match="2 buffers"):
        validate_offsets(problem, [0])


def test_declared_conflicts_forbid_sharing_between_disjoint_lifetimes():
    buffers = [Buffer("a", 64, 0, 1), Buffer("b", 64, 1, 2)]
    validate_offsets(Problem(buffers), [0, 0])  # never alive together: may share
    with pytest.raises(InvalidPlanError, match="overlap"):
        validate_offsets(Problem(buffers, conflicts=frozenset({(0, 1)})), [0, 0])


def test_zero_size_buffers_occupy_no_bytes():
    problem = Problem([Buffer("a", 64, 0, 2), Buffer("empty", 0, 0, 2)])
    assert validate_offsets(problem, [0, 0]) == 64


def test_empty_problem_needs_no_arena():
    assert validate_offsets(Problem([]), []) == 0
