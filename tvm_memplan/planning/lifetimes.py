"""Tensor lifetimes from an operator DAG and an execution order.

Pisarchyk & Lee 2020; docs/design.md, "Offset arena".
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .problem import DEFAULT_ALIGNMENT, Buffer, Problem


@dataclass(frozen=True)
class Operator:
    """One node of the graph: the tensors it reads and the tensors it writes."""

    name: Hashable
    inputs: tuple[Hashable, ...]
    outputs: tuple[Hashable, ...]


class TensorUse(Protocol):
    """What lifetimes are computed from: an :class:`Operator`, or the splitter's simulated kernel
    (:class:`~tvm_memplan.split.simulate.Step`), so both count a tensor live the same way."""

    @property
    def inputs(self) -> tuple[Hashable, ...]: ...

    @property
    def outputs(self) -> tuple[Hashable, ...]: ...


def resolve_alias(tensor: Hashable, aliases: Mapping[Hashable, Hashable]) -> Hashable:
    """Follow view-of-view chains to the tensor that owns the bytes."""
    seen = set()
    while tensor in aliases:
        if tensor in seen:
            raise ValueError(f"alias cycle through {tensor!r}")
        seen.add(tensor)
        tensor = aliases[tensor]
    return tensor


def tensor_lifetimes(
    operators: Sequence[TensorUse],
    order: Sequence[int] | None = None,
    aliases: Mapping[Hashable, Hashable] | None = None,
) -> dict[Hashable, tuple[int, int]]:
    """Half-open lifetime ``[first step, last step + 1)`` of every tensor an operator touches.

    ``order`` lists operator indices in execution order (default: as given). A tensor in
    ``aliases`` is a view: its uses count as uses of the tensor it views, and it gets no
    lifetime of its own.
    """
    aliases = aliases or {}
    order = range(len(operators)) if order is None else order
    first: dict[Hashable, int] = {}
    last: dict[Hashable, int] = {}
    for step, op_index in enumerate(order):
        op = operators[op_index]
        for tensor in (*op.inputs, *op.outputs):
            owner = resolve_alias(tensor, aliases) if aliases else tensor
            first.setdefault(owner, step)
            last[owner] = step
    return {t: (first[t], last[t] + 1) for t in first}


def problem_from_graph(
    operators: Sequence[Operator],
    sizes: Mapping[Hashable, int],
    order: Sequence[int] | None = None,
    aliases: Mapping[Hashable, Hashable] | None = None,
    is_planned: Callable[[Hashable], bool] | None = None,
    alignment: int = DEFAULT_ALIGNMENT,
) -> Problem:
    """The planning problem for the tensors that ``is_planned`` accepts (default: all sized ones)."""
    lifetimes = tensor_lifetimes(operators, order, aliases)
    buffers = []
    for tensor, (start, end) in lifetimes.items():
        if tensor not in sizes or (is_planned is not None and not is_planned(tensor)):
            continue
        buffers.append(Buffer(tensor, sizes[tensor], start, end))
    return Problem(buffers, alignment=alignment)
