"""Layer grouping (Oplachko's thesis, §3.2 and algorithm 2; docs/design.md): maxdist layers, groups, the F-predicate.

Operators at the same longest-path depth are independent, so a layer may run without barriers
between its members. Each layer is cut into groups that run together; tensors used by one
group may not share memory (the F-predicate), which :class:`Problem`'s ``concurrent`` ranges
express once a group's operators are consecutive in the execution order built here.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

from .lifetimes import Operator, problem_from_graph
from .problem import DEFAULT_ALIGNMENT, Problem

SEQ = "seq"
"""One operator per group: layer-wise order, no extra constraints (the thesis's "layer-wise" row)."""
AUTO = "auto"
"""Groups chosen per layer by :func:`cost_aware_groups`."""
GroupSetting = int | str


def parse_groups(text: str | int) -> GroupSetting:
    """``seq``, ``auto`` or a positive group count; ValueError with a one-line message otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        word = str(text).strip().lower()
        if word in (SEQ, AUTO):
            return word
        try:
            value = int(word)
        except ValueError:
            raise ValueError(f"groups must be 'seq', 'auto' or a positive integer, got {text!r}") from None
    if value < 1:
        raise ValueError(f"groups must be 'seq', 'auto' or a positive integer, got {text!r}")
    return value


@dataclass
class Layering:
    """Operators by longest-path depth; views sit after the layer of their deepest producer."""

    layers: list[list[int]]
    """Kernel operator indices per depth, each layer in program order."""
    views: dict[int, list[int]]
    """Depth → view operators placed right after that layer (depth -1: before everything)."""

    def max_width(self) -> int:
        return max((len(layer) for layer in self.layers), default=0)


def maxdist_layers(
    operators: Sequence[Operator], is_view: Callable[[int], bool] | None = None, from_outputs: bool = False
) -> Layering:
    """Layers by longest-path depth: ``maxdist(v)`` = 0 without predecessors, else 1 + the deepest predecessor's.

    A tensor's producer is the operator that lists it in ``outputs``. Views (``is_view``) launch
    nothing, so they add no depth: their consumers count from the views' producers, and a view
    sits right after its deepest producer's layer. Operators must be in a topological order.
    ``from_outputs`` measures the longest path to the outputs instead (as late as possible, same
    number of layers): a branch that only feeds a join, such as a projection shortcut, then runs
    next to the join rather than at the top, holding its output for less time.
    """
    producer: dict[Hashable, int] = {}
    kernel_preds: list[set[int]] = []  # per operator: the kernels it depends on through views
    views = {i for i in range(len(operators)) if is_view is not None and is_view(i)}
    for index, op in enumerate(operators):
        preds: set[int] = set()
        for t in op.inputs:
            if t in producer:
                p = producer[t]
                preds |= kernel_preds[p] if p in views else {p}
        kernel_preds.append(preds)
        for t in op.outputs:
            producer.setdefault(t, index)
    kernels = [i for i in range(len(operators)) if i not in views]
    depth: dict[int, int] = {}
    for i in kernels:
        depth[i] = 1 + max((depth[p] for p in kernel_preds[i]), default=-1)
    if from_outputs:
        last = max(depth.values(), default=0)
        succs: dict[int, list[int]] = {i: [] for i in kernels}
        for i in kernels:
            for p in kernel_preds[i]:
                succs[p].append(i)
        height: dict[int, int] = {}
        for i in reversed(kernels):
            height[i] = 1 + max((height[s] for s in succs[i]), default=-1)
        depth = {i: last - height[i] for i in kernels}
    layers: list[list[int]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for i in kernels:
        layers[depth[i]].append(i)
    placed: dict[int, list[int]] = {}
    for i in sorted(views):
        placed.setdefault(max((depth[p] for p in kernel_preds[i]), default=-1), []).append(i)
    return Layering(layers, placed)


def split_layer(layer: Sequence[int], groups: GroupSetting) -> list[list[int]]:
    """The seed's split: ``groups`` parts of equal size ``ceil(n / groups)``, the last maybe smaller."""
    if groups == SEQ:
        return [[op] for op in layer]
    if not isinstance(groups, int) or groups < 1:
        raise ValueError(f"split_layer needs 'seq' or a positive count, got {groups!r}")
    size = -(-len(layer) // groups)
    return [list(layer[i : i + size]) for i in range(0, len(layer), size)]


@dataclass(frozen=True)
class CostModel:
    """What running operators together buys and costs (IOS, MLSys 2021, with a memory price).

    A group costs one launch plus its critical path: ``max(longest member, total / units)``;
    sequential members pay a launch each. The F-predicate keeps every member's output from
    reusing another's bytes, priced at ``seconds_per_byte`` for all but the largest output.
    """

    launch_seconds: float = 5e-6
    parallel_units: int = 2
    seconds_per_byte: float = 0.0

    def group_seconds(self, seconds: Sequence[float], out_bytes: Sequence[int]) -> float:
        critical = max(max(seconds), sum(seconds) / self.parallel_units)
        pinned = sum(out_bytes) - max(out_bytes)
        return self.launch_seconds + critical + self.seconds_per_byte * pinned


def cost_aware_groups(
    layer: Sequence[int],
    seconds: Mapping[int, float],
    out_bytes: Mapping[int, int],
    model: CostModel = CostModel(),
) -> list[list[int]]:
    """Cut one layer into groups that minimise ``model``'s cost (a DP, as in IOS's stage search).

    Members are sorted by estimated time so that similar operators can share a group; the DP
    then picks the best partition of that sequence into consecutive runs, O(n²) per layer
    instead of IOS's search over subsets.
    """
    ops = sorted(layer, key=lambda op: (-seconds[op], op))
    best = [0.0] + [float("inf")] * len(ops)
    cut = [0] * (len(ops) + 1)
    for end in range(1, len(ops) + 1):
        for begin in range(end):
            members = ops[begin:end]
            cost = best[begin] + model.group_seconds([seconds[m] for m in members], [out_bytes[m] for m in members])
            if cost < best[end]:
                best[end], cut[end] = cost, begin
    groups, end = [], len(ops)
    while end:
        groups.append(sorted(ops[cut[end] : end]))
        end = cut[end]
    return groups[::-1]


@dataclass
class GroupedSchedule:
    """An execution order in which every group's operators are consecutive."""

    order: list[int]
    """Operator indices in execution order (layer by layer, group by group, views after their layer)."""
    groups: list[list[int]]
    """Kernel operators of each group, in execution order."""
    layers: int

    def concurrent_steps(self) -> tuple[tuple[int, int], ...]:
        """Step ranges ``[lo, hi)`` (positions in ``order``) of the groups with two or more members."""
        position = {op: step for step, op in enumerate(self.order)}
        ranges = []
        for group in self.groups:
            if len(group) > 1:
                steps = [position[op] for op in group]
                ranges.append((min(steps), max(steps) + 1))
        return tuple(ranges)


def group_schedule(
    layering: Layering,
    groups: GroupSetting,
    split: Callable[[list[int]], list[list[int]]] | None = None,
) -> GroupedSchedule:
    """Cut every layer with :func:`split_layer` (or ``split``, e.g. a cost-aware one) and order them."""
    order = list(layering.views.get(-1, []))
    all_groups: list[list[int]] = []
    for depth, layer in enumerate(layering.layers):
        parts = split(layer) if split is not None else split_layer(layer, groups)
        for part in parts:
            order.extend(part)
            all_groups.append(list(part))
        order.extend(layering.views.get(depth, []))
    return GroupedSchedule(order, all_groups, len(layering.layers))


def grouped_problem(
    operators: Sequence[Operator],
    sizes: Mapping[Hashable, int],
    schedule: GroupedSchedule,
    aliases: Mapping[Hashable, Hashable] | None = None,
    alignment: int = DEFAULT_ALIGNMENT,
) -> Problem:
    """The planning problem of ``operators`` run in ``schedule``'s order, with its F-predicate."""
    plain = problem_from_graph(operators, sizes, order=schedule.order, aliases=aliases, alignment=alignment)
    return Problem(plain.buffers, alignment=alignment, concurrent=schedule.concurrent_steps())
