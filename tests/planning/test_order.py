import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_memplan.planning import Operator, problem_from_graph
from tvm_memplan.planning.order import (
    OrderGraph,
    beam_search_order,
    branch_grouping_order,
    breadth_first_order,
    depth_first_order,
    exact_order,
    search_order,
)


def random_dag(seed: int, n: int, fan_in: int = 2):
    """Operators in topological numbering; op i writes tensor i and reads up to ``fan_in`` earlier tensors."""
    rng = random.Random(seed)
    operators, sizes = [], {}
    for i in range(n):
        reads = tuple(sorted(rng.sample(range(i), min(i, rng.randint(1, fan_in))))) if i else ("input",)
        operators.append(Operator(i, reads, (i,)))
        sizes[i] = rng.choice([64, 128, 256, 1024, 4096])
    return operators, sizes


def brute_force_peak(graph: OrderGraph) -> int:
    return min(graph.peak(p) for p in itertools.permutations(range(len(graph))) if graph.is_topological(p))


def test_peak_equals_lower_bound_of_the_planning_problem():
    operators, sizes = random_dag(1, 30)
    graph = OrderGraph.from_operators(operators, sizes)
    problem = problem_from_graph(operators, sizes, alignment=1)
    assert graph.peak(list(range(30))) == problem.lower_bound()


@pytest.mark.parametrize("seed", range(6))
def test_exact_search_matches_brute_force_on_tiny_graphs(seed):
    operators, sizes = random_dag(seed, 7)
    graph = OrderGraph.from_operators(operators, sizes)
    best = brute_force_peak(graph)
    order, proved = exact_order(graph, graph.peak(list(range(7))) + 1, deadline=float("inf"))
    assert proved and order is not None
    assert graph.is_topological(order) and graph.peak(order) == best


def test_search_never_worse_than_program_order_and_reports_optimality():
    operators, sizes = random_dag(3, 20, fan_in=3)
    graph = OrderGraph.from_operators(operators, sizes)
    result = search_order(graph, time_budget=5)
    assert graph.is_topological(result.order)
    assert result.peak == graph.peak(result.order) <= result.program_peak
    assert result.optimal  # 20 operators: the exact search finishes


def test_branch_order_matters_and_search_finds_it():
    # A branch node feeding a cheap branch and an expensive one whose big intermediate dies
    # inside the branch; running the branch that leaves less behind first lowers the peak.
    ops = [
        Operator("root", ("in",), ("r",)),
        Operator("a1", ("r",), ("a1",)),  # small branch: leaves a 1000-byte result
        Operator("b1", ("r",), ("b1",)),  # big branch: 5000-byte temporary, 10-byte result
        Operator("b2", ("b1",), ("b2",)),
        Operator("join", ("a1", "b2"), ("out",)),
    ]
    sizes = {"r": 100, "a1": 1000, "b1": 5000, "b2": 10, "out": 10}
    graph = OrderGraph.from_operators(ops, sizes)
    program = graph.peak([0, 1, 2, 3, 4])
    result = search_order(graph, time_budget=2)
    assert result.peak < program
    assert [graph.names[v] for v in result.order][:3] == ["root", "b1", "b2"]
    grouped = branch_grouping_order(graph, [0, 1, 2, 3, 4], deadline=float("inf"))
    assert graph.peak(grouped) == result.peak


def test_views_extend_the_owner():
    ops = [
        Operator("p", ("in",), ("t",)),
        Operator("view", ("t",), ("v",)),
        Operator("big", ("in",), ("b",)),
        Operator("use", ("v", "b"), ("o",)),
    ]
    graph = OrderGraph.from_operators(ops, {"t": 100, "b": 1000}, aliases={"v": "t"})
    assert graph.peak([0, 1, 2, 3]) == 1100


def test_large_graph_within_budget():
    operators, sizes = random_dag(7, 600, fan_in=2)
    graph = OrderGraph.from_operators(operators, sizes)
    result = search_order(graph, time_budget=10)
    assert result.seconds < 15
    assert graph.is_topological(result.order) and result.peak <= result.program_peak
    assert not result.optimal or len(graph) <= 48


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 25))
def test_every_strategy_returns_a_topological_order(seed, n):
    operators, sizes = random_dag(seed, n, fan_in=3)
    graph = OrderGraph.from_operators(operators, sizes)
    for order in (depth_first_order(graph), breadth_first_order(graph), beam_search_order(graph, 4, float("inf"))):
        assert graph.is_topological(order)
    result = search_order(graph, time_budget=1)
    assert graph.is_topological(result.order) and result.peak <= result.program_peak
