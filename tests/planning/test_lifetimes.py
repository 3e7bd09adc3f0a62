"""Lifetimes from an operator DAG and an execution order, with views aliasing their base."""

import pytest

from tvm_memplan.planning import Operator, problem_from_graph, tensor_lifetimes
from tvm_memplan.planning.lifetimes import resolve_alias

CHAIN = [
    Operator("conv", ("x",), ("a",)),
    Operator("relu", ("a",), ("b",)),
    Operator("add", ("b", "a"), ("c",)),
    Operator("pool", ("c",), ("y",)),
]


def test_lifetimes_span_first_to_last_use_half_open():
    assert tensor_lifetimes(CHAIN) == {"x": (0, 1), "a": (0, 3), "b": (1, 3), "c": (2, 4), "y": (3, 4)}


def test_order_renumbers_steps():
    ops = [Operator("p", ("x",), ("a",)), Operator("q", ("x",), ("b",)), Operator("r", ("a", "b"), ("y",))]
    lifetimes = tensor_lifetimes(ops, order=[1, 0, 2])
    assert lifetimes["b"] == (0, 3) and lifetimes["a"] == (1, 3) and lifetimes["x"] == (0, 2)


def test_a_view_extends_its_base_and_has_no_lifetime_of_its_own():
    ops = [
        Operator("conv", ("x",), ("a",)),
        Operator("reshape", ("a",), ("view",)),
        Operator("relu", ("x",), ("b",)),
        Operator("use", ("view", "b"), ("y",)),
    ]
    plain = tensor_lifetimes(ops)
    assert plain["a"] == (0, 2)
    aliased = tensor_lifetimes(ops, aliases={"view": "a"})
    assert "view" not in aliased
    assert aliased["a"] == (0, 4)  # the view's last use, at step 3, keeps a's bytes alive


def test_view_of_a_view_resolves_to_the_owner_and_cycles_are_errors():
    assert resolve_alias("v2", {"v2": "v1", "v1": "a"}) == "a"
    assert resolve_alias("a", {"v1": "a"}) == "a"
    ops = [Operator("f", ("x",), ("a",)), Operator("g", ("v2",), ("y",))]
    assert tensor_lifetimes(ops, aliases={"v2": "v1", "v1": "a"})["a"] == (0, 2)
    with pytest.raises(ValueError, match="alias cycle"):
        resolve_alias("u", {"u": "v", "v": "u"})


def test_problem_from_graph_keeps_sized_planned_tensors():
    sizes = {"a": 100, "b": 200, "c": 300, "y": 10}
    problem = problem_from_graph(CHAIN, sizes, is_planned=lambda t: t != "y", alignment=1)
    assert sorted(b.name for b in problem.buffers) == ["a", "b", "c"]  # x has no size, y is not planned
    assert problem.lower_bound() == 600  # a, b and c all alive at step 2
