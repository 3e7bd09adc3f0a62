"""Layer grouping: maxdist layers, groups, the F-predicate in every allocator and the validator."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_memplan.planning import (
    Buffer,
    InvalidPlanError,
    Operator,
    Problem,
    plan_memory,
    problem_from_graph,
    validate_offsets,
)
from tvm_memplan.planning.allocators import CanonicalSearch, greedy_allocators
from tvm_memplan.planning.grouping import (
    SEQ,
    CostModel,
    cost_aware_groups,
    group_schedule,
    grouped_problem,
    maxdist_layers,
    parse_groups,
    split_layer,
)


def inception_block() -> tuple[list[Operator], dict]:
    """stem → four branches (1, 2, 2 and 1 operators deep) → concat, like GoogLeNet's blocks."""
    ops = [
        Operator("stem", ("x",), ("s",)),
        Operator("b1", ("s",), ("a1",)),
        Operator("b2a", ("s",), ("a2",)),
        Operator("b2b", ("a2",), ("b2",)),
        Operator("b3a", ("s",), ("a3",)),
        Operator("b3b", ("a3",), ("b3",)),
        Operator("b4", ("s",), ("a4",)),
        Operator("cat", ("a1", "b2", "b3", "a4"), ("y",)),
        Operator("head", ("y",), ("z",)),
    ]
    sizes = {"s": 4096, "a1": 1024, "a2": 2048, "b2": 1024, "a3": 512, "b3": 1024, "a4": 1024, "y": 4096, "z": 256}
    return ops, sizes


def random_dag(seed: int, count: int) -> tuple[list[Operator], dict]:
    """Operators in topological order reading one to three earlier tensors, mixed sizes."""
    rng = random.Random(seed)
    ops, sizes = [], {}
    for i in range(count):
        reads = tuple({f"t{rng.randrange(i)}" for _ in range(rng.randint(1, 3))}) if i else ("input",)
        ops.append(Operator(f"op{i}", reads, (f"t{i}",)))
        sizes[f"t{i}"] = rng.choice([64, 128, 512, 2048]) * rng.randint(1, 8)
    return ops, sizes


def used_together(ops: list[Operator], groups: list[list[int]], names: list) -> set[tuple[int, int]]:
    """The seed's F-predicate literally: index pairs of tensors some group uses both of."""
    index = {name: i for i, name in enumerate(names)}
    pairs = set()
    for group in groups:
        used = sorted({index[t] for op in group for t in (*ops[op].inputs, *ops[op].outputs) if t in index})
        pairs |= {(a, b) for k, a in enumerate(used) for b in used[k + 1 :]}
    return pairs


def test_maxdist_layers_follow_the_longest_path():
    ops, _ = inception_block()
    layering = maxdist_layers(ops)
    names = [[ops[i].name for i in layer] for layer in layering.layers]
    assert names == [["stem"], ["b1", "b2a", "b3a", "b4"], ["b2b", "b3b"], ["cat"], ["head"]]


def test_layers_from_the_outputs_run_short_branches_late():
    ops, _ = inception_block()
    layering = maxdist_layers(ops, from_outputs=True)
    names = [[ops[i].name for i in layer] for layer in layering.layers]
    assert names == [["stem"], ["b2a", "b3a"], ["b1", "b2b", "b3b", "b4"], ["cat"], ["head"]]


def test_views_add_no_depth_and_follow_their_producers_layer():
    ops = [
        Operator("a", ("x",), ("a",)),
        Operator("view", ("a",), ("v",)),
        Operator("b", ("v",), ("b",)),
        Operator("param_view", ("w",), ("w2",)),
    ]
    layering = maxdist_layers(ops, is_view=lambda i: "view" in ops[i].name)
    assert layering.layers == [[0], [2]]
    assert layering.views == {0: [1], -1: [3]}
    schedule = group_schedule(layering, 1)
    assert schedule.order == [3, 0, 1, 2]


def test_split_layer_makes_equal_groups_but_the_last():
    assert split_layer([1, 2, 3, 4, 5], 2) == [[1, 2, 3], [4, 5]]
    assert split_layer([1, 2, 3], 1) == [[1, 2, 3]]
    assert split_layer([1, 2, 3], 8) == [[1], [2], [3]]
    assert split_layer([1, 2], SEQ) == [[1], [2]]
    with pytest.raises(ValueError):
        split_layer([1], 0)


@pytest.mark.parametrize("text, expected", [("seq", "seq"), ("AUTO", "auto"), ("4", 4), (2, 2)])
def test_parse_groups_accepts(text, expected):
    assert parse_groups(text) == expected


@pytest.mark.parametrize("text", ["0", "-1", "x", "1.5", 0, ""])
def test_parse_groups_rejects(text):
    with pytest.raises(ValueError, match="positive integer"):
        parse_groups(text)


def test_one_group_forbids_reuse_inside_a_layer_and_costs_memory():
    ops, sizes = inception_block()
    layering = maxdist_layers(ops)
    sequential = grouped_problem(ops, sizes, group_schedule(layering, SEQ), alignment=1)
    grouped = grouped_problem(ops, sizes, group_schedule(layering, 1), alignment=1)
    assert not sequential.conflicts and grouped.conflicts
    # a2 dies at b2b and a3 is born at b3a's step in a different group order: with one group per
    # layer the layer's tensors are all live together, so the bound cannot drop below theirs
    second_layer = {"s", "a1", "a2", "a3", "a4"}
    assert grouped.lower_bound() >= sum(sizes[t] for t in second_layer)
    assert grouped.lower_bound() >= sequential.lower_bound()
    plan = plan_memory(grouped)
    assert validate_offsets(grouped, plan.offsets) <= plan.arena_bytes
    assert plan.arena_bytes >= grouped.lower_bound()


def test_validator_rejects_sharing_inside_a_concurrent_range_without_the_conflict_list():
    # a dies at step 0 and b is born at step 1: fine sequentially, not when steps 0-1 run together
    buffers = [Buffer("a", 64, 0, 1), Buffer("b", 64, 1, 2)]
    validate_offsets(Problem(buffers), [0, 0])
    grouped = Problem(buffers, concurrent=((0, 2),))
    assert grouped.conflicts == {(0, 1)}
    assert grouped.lower_bound() == 128
    stripped = Problem(buffers)
    object.__setattr__(stripped, "concurrent", ((0, 2),))  # the validator re-derives, not trusts
    with pytest.raises(InvalidPlanError, match="overlap"):
        validate_offsets(stripped, [0, 0])


def test_concurrent_ranges_must_be_disjoint():
    with pytest.raises(ValueError, match="disjoint"):
        Problem([Buffer("a", 1, 0, 3)], concurrent=((0, 2), (1, 3)))


def test_cost_model_groups_small_operators_and_keeps_big_ones_apart():
    model = CostModel(launch_seconds=10e-6, parallel_units=2)
    small = cost_aware_groups([0, 1, 2, 3], {i: 1e-6 for i in range(4)}, {i: 64 for i in range(4)}, model)
    assert small == [[0, 1, 2, 3]]
    # one unit: grouping saves only a launch, which the pinned megabyte outweighs
    serial = CostModel(launch_seconds=1e-6, parallel_units=1, seconds_per_byte=1e-11)
    assert sorted(cost_aware_groups([0, 1], {0: 1e-3, 1: 1e-3}, {0: 10**6, 1: 10**6}, serial)) == [[0], [1]]
    # two units halve the time: worth the same megabyte
    parallel = CostModel(launch_seconds=1e-6, parallel_units=2, seconds_per_byte=1e-11)
    assert cost_aware_groups([0, 1], {0: 1e-3, 1: 1e-3}, {0: 10**6, 1: 10**6}, parallel) == [[0, 1]]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    count=st.integers(2, 40),
    groups=st.sampled_from([SEQ, 1, 2, 3, 8]),
    from_outputs=st.booleans(),
)
def test_grouped_plans_keep_the_f_predicate(seed, count, groups, from_outputs):
    ops, sizes = random_dag(seed, count)
    layering = maxdist_layers(ops, from_outputs=from_outputs)
    for layer in layering.layers:  # operators of one layer are independent
        produced = {t for op in layer for t in ops[op].outputs}
        assert not any(t in produced for op in layer for t in ops[op].inputs)
    schedule = group_schedule(layering, groups)
    assert sorted(schedule.order) == list(range(count))
    assert sorted(op for group in schedule.groups for op in group) == list(range(count))
    position = {op: step for step, op in enumerate(schedule.order)}
    for op in range(count):  # the order is topological
        for t in ops[op].inputs:
            if t != "input":
                assert position[int(t[1:])] < position[op]
    problem = grouped_problem(ops, sizes, schedule, alignment=64)
    plain = problem_from_graph(ops, sizes, order=schedule.order, alignment=64)
    # every pair the seed's F names either lives together anyway or is a declared conflict
    names = [b.name for b in problem.buffers]
    for i, j in used_together(ops, schedule.groups, names):
        assert problem.must_not_overlap(i, j)
    assert problem.lower_bound() >= plain.lower_bound()
    for allocator in (*greedy_allocators(), CanonicalSearch()):
        plan = allocator.allocate(problem, deadline=None)
        validate_offsets(problem, plan.offsets, plan.arena_bytes)
        assert plan.arena_bytes >= problem.lower_bound()
