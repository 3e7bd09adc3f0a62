from tvm_memplan.planning import plan_memory, validate_offsets
from tvm_memplan.relax import extract_plan_input

from .modules import chain_with_view, dynamic_batch, staged, two_functions


def test_view_extends_lifetime_of_its_storage(target):
    mod = staged(chain_with_view(), target)
    plan_input = extract_plan_input(mod["main"], mod)
    (arena,) = plan_input.arenas
    by_shape = {site.shape: buffer for site, buffer in zip(arena.sites, arena.problem.buffers, strict=True)}
    column = by_shape[(64, 1)]
    big = by_shape[(64, 64)]
    # The column is read through its reshape view after ``big`` exists: they must overlap in time.
    assert column.lives_with(big)
    assert column.end > big.start


def test_function_output_is_not_planned(target):
    mod = staged(chain_with_view(), target)
    plan_input = extract_plan_input(mod["main"], mod)
    assert any("function output" in reason for reason in plan_input.unplanned.values())
    assert (1, 64) not in {site.shape for site in plan_input.planned_sites}


def test_symbolic_shapes_are_left_and_the_rest_planned(target):
    mod = staged(dynamic_batch(), target)
    plan_input = extract_plan_input(mod["main"], mod)
    assert any("symbolic" in reason for reason in plan_input.unplanned.values())
    assert {site.shape for site in plan_input.planned_sites} >= {(16, 16)}
    for arena in plan_input.arenas:
        plan = plan_memory(arena.problem)
        validate_offsets(arena.problem, plan.offsets, plan.arena_bytes)


def test_each_function_is_extracted(target):
    mod = staged(two_functions(), target)
    for name in ("main", "second"):
        plan_input = extract_plan_input(mod[name], mod)
        assert len(plan_input.planned_sites) >= 2
