"""Alias groups (in-place outputs, concat slices): coalesced, planned, expanded, validated."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_memplan.planning import Buffer, InvalidPlanError, Problem, coalesce, plan_aliased, validate_offsets


def concat_problem() -> Problem:
    # a and b are written into their slices of ``out``; x lives beside them the whole time.
    return Problem(
        [Buffer("a", 64, 0, 3), Buffer("b", 64, 1, 3), Buffer("out", 128, 2, 5), Buffer("x", 64, 0, 5)],
        aliases={0: (2, 0), 1: (2, 64)},
    )


def test_concat_group_is_planned_as_one_block():
    problem = concat_problem()
    assert problem.lower_bound() == 192  # out's 128 bytes (holding a and b) + x
    plan, coalesced = plan_aliased(problem)
    assert len(coalesced.buffers) == 2
    assert plan.arena_bytes == 192
    assert plan.offsets[0] == plan.offsets[2] and plan.offsets[1] == plan.offsets[2] + 64


def test_validator_rejects_a_broken_alias_and_accepts_the_sharing_it_declares():
    problem = concat_problem()
    plan, _ = plan_aliased(problem)
    validate_offsets(problem, plan.offsets)  # a, b and out overlap while alive: by design
    broken = list(plan.offsets)
    broken[1] += 64
    with pytest.raises(InvalidPlanError, match="should alias"):
        validate_offsets(problem, broken)


def test_inplace_chain_shares_one_buffer():
    # y overwrites x when x dies at y's producer; z overwrites y likewise.
    problem = Problem(
        [Buffer("x", 256, 0, 3), Buffer("y", 256, 2, 5), Buffer("z", 256, 4, 7)],
        aliases={1: (0, 0), 2: (1, 0)},
    )
    plan, coalesced = plan_aliased(problem)
    assert len(coalesced.buffers) == 1 and plan.arena_bytes == 256 == problem.lower_bound()


def test_aliases_must_be_aligned_and_acyclic():
    with pytest.raises(ValueError, match="multiple of 64"):
        Problem([Buffer("a", 64, 0, 1), Buffer("b", 128, 0, 1)], aliases={0: (1, 32)})
    cyclic = Problem([Buffer("a", 64, 0, 1), Buffer("b", 64, 0, 1)], aliases={0: (1, 0), 1: (0, 0)})
    with pytest.raises(ValueError, match="cycle"):
        coalesce(cyclic)


@st.composite
def aliased_problems(draw):
    n = draw(st.integers(2, 14))
    buffers = []
    for i in range(n):
        start = draw(st.integers(0, 20))
        buffers.append(Buffer(i, 64 * draw(st.integers(1, 8)), start, start + draw(st.integers(1, 8))))
    aliases = {}
    for i in range(1, n):
        if draw(st.booleans()):
            target = draw(st.integers(0, i - 1))
            room = buffers[target].size - buffers[i].size
            if room >= 0 and target not in aliases:
                aliases[i] = (target, 64 * draw(st.integers(0, room // 64)))
    return Problem(buffers, aliases=aliases)


@settings(max_examples=60, deadline=None)
@given(aliased_problems())
def test_every_aliased_plan_validates_and_respects_the_bound(problem):
    plan, _ = plan_aliased(problem, time_budget=0.5)
    assert validate_offsets(problem, plan.offsets) <= plan.arena_bytes
    assert plan.arena_bytes >= problem.lower_bound()
    for i in problem.aliases:
        root, root_delta = problem.alias_root(i)
        assert plan.offsets[i] == plan.offsets[root] + root_delta
