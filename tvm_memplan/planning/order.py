"""Execution-order search: topological orders of an operator DAG that lower the peak.

The memory model is the one the arena planner sees: an operator's outputs are alive while it
runs, together with everything produced earlier that still has a consumer to come. The peak
of an order is therefore the lower bound of the planning problem built from it.

Strategies, all under one time budget, the best kept (program order is always a candidate,
so the result is never worse than it):
- exact dynamic programming over sets of executed operators (Serenity, MLSys 2020) for small
  graphs, with memoisation and pruning by the best known peak; it says when it proved optimality;
- beam search over partial orders for large graphs (a memory-aware list scheduler at width 1),
  then the exact search on a window of operators around the peak, repeated while it improves;
- branch grouping (the execution strategy patent, docs/design.md): at each branch node, run whole branch groups
  one after another in the best permutation, top-down then bottom-up.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .lifetimes import Operator, resolve_alias


@dataclass
class OrderGraph:
    """Operators as integers with the tensors they produce and consume (views resolved to owners)."""

    names: list[Hashable]
    outputs: list[tuple[int, ...]]
    inputs: list[tuple[int, ...]]
    sizes: list[int]
    consumers: list[int]
    """Per tensor: bit mask of the operators that read it."""
    predecessors: list[int]
    """Per operator: bit mask of the operators it depends on."""
    successors: list[tuple[int, ...]]
    inplace: list[tuple[int, ...]] = field(default_factory=list)
    """Per operator: tensors its output may overwrite when they die there (in-place kernels)."""

    @classmethod
    def from_operators(
        cls,
        operators: Sequence[Operator],
        sizes: Mapping[Hashable, int],
        aliases: Mapping[Hashable, Hashable | tuple] | None = None,
        inplace: Mapping[int, Sequence[Hashable]] | None = None,
    ) -> OrderGraph:
        """Build from operators; tensors without a size (inputs, constants, outputs) cost nothing.

        ``aliases`` maps a view to the tensor it views, or to a tuple of tensors (an eliminated
        concat viewing all its inputs). ``inplace`` maps an operator's index to the tensors its
        output may overwrite.
        """
        aliases = dict(aliases or {})
        multi = {view: owners for view, owners in aliases.items() if isinstance(owners, tuple)}
        for view in multi:
            del aliases[view]
        tensor_ids: dict[Hashable, int] = {}
        tensor_sizes: list[int] = []
        producer: dict[int, int] = {}

        def tensor_id(tensor: Hashable) -> int:
            owner = resolve_alias(tensor, aliases)
            if owner not in tensor_ids:
                tensor_ids[owner] = len(tensor_sizes)
                tensor_sizes.append(int(sizes.get(owner, 0)))
            return tensor_ids[owner]

        outputs, inputs = [], []
        definer: dict[Hashable, int] = {}  # a tensor (view or not) → the operator that defines it
        for index, op in enumerate(operators):
            for x in op.outputs:
                definer.setdefault(x, index)
            # A view "produces" its owner again: only the first producer allocates it.
            produced = tuple(
                t for t in dict.fromkeys(tensor_id(x) for x in op.outputs) if producer.setdefault(t, index) == index
            )
            outputs.append(produced)

        def read_ids(tensor: Hashable) -> list[int]:
            if tensor in multi:
                return [i for owner in multi[tensor] for i in read_ids(owner)]
            return [tensor_id(tensor)]

        for index, op in enumerate(operators):
            ids = [i for x in op.inputs for i in read_ids(x)]
            inputs.append(tuple(dict.fromkeys(t for t in ids if producer.get(t) != index)))
        consumers = [0] * len(tensor_sizes)
        predecessors = [0] * len(operators)
        successor_sets: list[set[int]] = [set() for _ in operators]
        for index, (op, read) in enumerate(zip(operators, inputs, strict=True)):
            for t in read:
                consumers[t] |= 1 << index
            # Dependencies follow the tensors as named (a view's reader waits for the view).
            for x in op.inputs:
                source = definer.get(x)
                if source is not None and source != index:
                    predecessors[index] |= 1 << source
                    successor_sets[source].add(index)
        return cls(
            names=[op.name for op in operators],
            outputs=outputs,
            inputs=inputs,
            sizes=tensor_sizes,
            consumers=consumers,
            predecessors=predecessors,
            successors=[tuple(sorted(s)) for s in successor_sets],
            inplace=[tuple(tensor_id(t) for t in (inplace or {}).get(i, ())) for i in range(len(operators))],
        )

    def __len__(self) -> int:
        return len(self.names)

    def step(self, executed: int, live: int, op: int) -> tuple[int, int, int]:
        """Run ``op`` after the set ``executed``: (new executed set, bytes live after, peak while running)."""
        out_bytes = sum(self.sizes[t] for t in self.outputs[op])
        done = executed | (1 << op)
        peak = live + out_bytes
        for t in self.inplace[op] if self.inplace else ():
            if self.sizes[t] == out_bytes and self.consumers[t] & ~done == 0:
                peak -= out_bytes  # the output takes over the bytes of an input that dies here
                break
        freed = 0
        for t in self.inputs[op]:
            if self.consumers[t] & ~done == 0:
                freed += self.sizes[t]
        for t in self.outputs[op]:
            if self.consumers[t] & ~done == 0:
                freed += self.sizes[t]
        return done, live + out_bytes - freed, peak

    def peak(self, order: Sequence[int]) -> int:
        """Peak live bytes of a complete order (raises if it is not topological)."""
        executed = live = peak = 0
        for op in order:
            if self.predecessors[op] & ~executed:
                raise ValueError(f"operator {self.names[op]!r} runs before one of its inputs is produced")
            executed, live, op_peak = self.step(executed, live, op)
            peak = max(peak, op_peak)
        return peak

    def is_topological(self, order: Sequence[int]) -> bool:
        executed = 0
        for op in order:
            if self.predecessors[op] & ~executed:
                return False
            executed |= 1 << op
        return len(order) == len(self) and executed == (1 << len(self)) - 1


@dataclass
class OrderResult:
    """The best order found and how it compares."""

    order: list[int]
    peak: int
    program_peak: int
    strategy: str
    optimal: bool
    """True when the exact search finished: no topological order has a lower peak."""
    seconds: float
    tried: dict[str, int] = field(default_factory=dict)


def _ready(graph: OrderGraph, executed: int, candidates: Iterable[int]) -> list[int]:
    return [v for v in candidates if not (executed >> v) & 1 and graph.predecessors[v] & ~executed == 0]


def depth_first_order(graph: OrderGraph) -> list[int]:
    """Depth-first from the inputs: after an operator, its first ready successor (like TVM's TopologicalSort)."""
    executed, order = 0, []
    stack = [v for v in reversed(range(len(graph))) if graph.predecessors[v] == 0]
    while stack:
        v = stack.pop()
        if (executed >> v) & 1 or graph.predecessors[v] & ~executed:
            continue
        executed |= 1 << v
        order.append(v)
        stack.extend(reversed(_ready(graph, executed, graph.successors[v])))
    return order


def breadth_first_order(graph: OrderGraph) -> list[int]:
    """Breadth-first from the inputs: operators in order of readiness."""
    executed, order = 0, []
    queue = [v for v in range(len(graph)) if graph.predecessors[v] == 0]
    queued = set(queue)
    head = 0
    while head < len(queue):
        v = queue[head]
        head += 1
        executed |= 1 << v
        order.append(v)
        for u in _ready(graph, executed, [u for u in graph.successors[v] if u not in queued]):
            queue.append(u)
            queued.add(u)
    return order


def beam_search_order(graph: OrderGraph, width: int, deadline: float) -> list[int] | None:
    """Keep the ``width`` best partial orders at each depth, by (peak so far, bytes live)."""
    # State: (peak, live, executed, order, ready)
    start_ready = tuple(v for v in range(len(graph)) if graph.predecessors[v] == 0)
    beam = [(0, 0, 0, (), start_ready)]
    for _ in range(len(graph)):
        if time.monotonic() > deadline:
            return None
        children: dict[int, tuple] = {}
        for peak, live, executed, order, ready in beam:
            for v in ready:
                done, new_live, op_peak = graph.step(executed, live, v)
                new_peak = max(peak, op_peak)
                previous = children.get(done)
                if previous is not None and previous[0] <= new_peak:
                    continue
                rest = tuple(u for u in ready if u != v)
                new_ready = rest + tuple(_ready(graph, done, (u for u in graph.successors[v] if u not in rest)))
                children[done] = (new_peak, new_live, done, order + (v,), new_ready)
        beam = sorted(children.values(), key=lambda s: (s[0], s[1]))[:width]
    return list(beam[0][3])


def exact_order(
    graph: OrderGraph,
    upper_bound: int,
    deadline: float,
    max_states: int = 2_000_000,
    window: Sequence[int] | None = None,
    start: tuple[int, int] = (0, 0),
) -> tuple[list[int] | None, bool]:
    """Minimum-peak order by dynamic programming over executed sets (Serenity).

    The bytes live after a set of operators do not depend on their order, so the best peak to
    reach each set is all that needs keeping. States whose peak reaches ``upper_bound`` are
    pruned. With ``window``, only those operators are ordered, starting from ``start`` =
    (executed set, bytes live) in which all their outside predecessors have run.
    Returns (order or None if nothing beat the bound, proved optimal).
    """
    ops = list(range(len(graph))) if window is None else list(window)
    universe = 0
    for v in ops:
        universe |= 1 << v
    begin, begin_live = start
    target = begin | universe
    start_ready = tuple(v for v in ops if graph.predecessors[v] & ~begin == 0)
    frontier: dict[int, tuple[int, int, tuple[int, ...]]] = {begin: (0, begin_live, start_ready)}
    parents: dict[int, tuple[int, int]] = {}
    states = 0
    for _ in range(len(ops)):
        next_frontier: dict[int, tuple[int, int, tuple[int, ...]]] = {}
        for executed, (peak, live, ready) in frontier.items():
            for v in ready:
                done, new_live, op_peak = graph.step(executed, live, v)
                new_peak = max(peak, op_peak)
                if new_peak >= upper_bound:
                    continue
                previous = next_frontier.get(done)
                if previous is not None and previous[0] <= new_peak:
                    continue
                rest = tuple(u for u in ready if u != v)
                fresh = (u for u in graph.successors[v] if (universe >> u) & 1 and u not in rest)
                next_frontier[done] = (new_peak, new_live, rest + tuple(_ready(graph, done, fresh)))
                parents[done] = (executed, v)
            states += 1
            if states > max_states or (states & 1023 == 0 and time.monotonic() > deadline):
                return None, False
        frontier = next_frontier
        if not frontier:
            return None, True  # every order reaches the upper bound: the bound's order is optimal
    if target not in frontier:
        return None, True
    order = []
    executed = target
    while executed != begin:
        executed, v = parents[executed]
        order.append(v)
    return order[::-1], True


def windowed_exact_order(graph: OrderGraph, order: list[int], deadline: float, width: int = 22) -> list[int]:
    """Re-solve exactly the ``width`` operators around the peak, and repeat while it improves.

    Large graphs are out of reach of the exact search, but their peak is local: a window
    around it, with everything before it run and everything after it not, is small enough.
    """
    best = list(order)
    tried_windows: set[tuple[int, int]] = set()
    while time.monotonic() < deadline:
        executed = live = 0
        states = []  # (executed, live) before each position
        peaks = []
        for v in best:
            states.append((executed, live))
            executed, live, op_peak = graph.step(executed, live, v)
            peaks.append(op_peak)
        peak = max(peaks)
        improved = False
        for at in [i for i, p in enumerate(peaks) if p == peak]:
            lo = max(0, at - width // 2)
            hi = min(len(best), lo + width)
            if (lo, hi) in tried_windows:
                continue
            tried_windows.add((lo, hi))
            window_peak = max(peaks[lo:hi])
            sub, _ = exact_order(graph, window_peak, deadline, max_states=200_000, window=best[lo:hi], start=states[lo])
            if sub is not None:
                candidate = best[:lo] + sub + best[hi:]
                if graph.peak(candidate) < peak:
                    best, improved = candidate, True
                    break
            if time.monotonic() > deadline:
                break
        if not improved:
            return best
    return best


def _branch_groups(graph: OrderGraph, branch: int, reach: list[int]) -> list[int]:
    """Bit masks of the operators reachable from exactly one successor of ``branch``."""
    succs = graph.successors[branch]
    masks = [reach[s] for s in succs]
    groups = []
    for i, mask in enumerate(masks):
        others = 0
        for j, other in enumerate(masks):
            if j != i:
                others |= other
        exclusive = mask & ~others
        if exclusive:
            groups.append(exclusive)
    return groups


def _reachability(graph: OrderGraph) -> list[int]:
    """Per operator: bit mask of itself and everything downstream (numbering is topological)."""
    reach = [0] * len(graph)
    for v in reversed(range(len(graph))):
        mask = 1 << v
        for u in graph.successors[v]:
            mask |= reach[u]
        reach[v] = mask
    return reach


def branch_grouping_order(
    graph: OrderGraph, order: list[int], deadline: float, max_permutations: int = 120
) -> list[int]:
    """Branch grouping: at each branch node run its branch groups contiguously in the best permutation.

    Branch nodes are visited top-down, then bottom-up; an improvement is kept at once.
    """
    reach = _reachability(graph)
    best, best_peak = list(order), graph.peak(order)
    branches = [v for v in order if len(graph.successors[v]) >= 2]
    for sweep in (branches, branches[::-1]):
        for branch in sweep:
            if time.monotonic() > deadline:
                return best
            groups = _branch_groups(graph, branch, reach)
            if len(groups) < 2:
                continue
            members = 0
            for g in groups:
                members |= g
            positions = [i for i, v in enumerate(best) if (members >> v) & 1]
            sequences = [[v for v in best if (g >> v) & 1] for g in groups]
            k = len(groups)
            if k <= 5:
                permutations: Iterable[tuple[int, ...]] = itertools.permutations(range(k))
            else:  # too many to enumerate: move each group to the front, then to the back
                identity = list(range(k))
                permutations = [tuple([g] + [h for h in identity if h != g]) for g in identity]
                permutations += [tuple([h for h in identity if h != g] + [g]) for g in identity]
            for perm in itertools.islice(permutations, max_permutations):
                placed = [v for index in perm for v in sequences[index]]
                candidate = list(best)
                for position, v in zip(positions, placed, strict=True):
                    candidate[position] = v
                if candidate == best or not graph.is_topological(candidate):
                    continue
                peak = graph.peak(candidate)
                if peak < best_peak:
                    best, best_peak = candidate, peak
    return best


def search_order(
    graph: OrderGraph,
    time_budget: float = 10.0,
    exact_limit: int = 48,
    beam_width: int = 32,
) -> OrderResult:
    """Search topological orders for the lowest peak within ``time_budget`` seconds.

    The operators' given numbering is the program order and always a candidate.
    """
    started = time.monotonic()
    deadline = started + time_budget
    program = list(range(len(graph)))
    if not graph.is_topological(program):
        raise ValueError("the operators' numbering must be a topological order")
    candidates: dict[str, list[int]] = {"program": program}
    candidates["dfs"] = depth_first_order(graph)
    candidates["bfs"] = breadth_first_order(graph)
    tried = {name: graph.peak(order) for name, order in candidates.items()}

    def best_so_far() -> tuple[str, list[int], int]:
        name = min(tried, key=lambda k: (tried[k], k != "program"))
        return name, candidates[name], tried[name]

    optimal = False
    for width in (1, beam_width):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        order = beam_search_order(graph, width, time.monotonic() + remaining / 2)
        if order is not None:
            name = f"beam{width}"
            candidates[name], tried[name] = order, graph.peak(order)
    if time.monotonic() < deadline:
        _, order, _ = best_so_far()
        grouped = branch_grouping_order(graph, order, deadline)
        candidates["branch-groups"], tried["branch-groups"] = grouped, graph.peak(grouped)
    if len(graph) > exact_limit and time.monotonic() < deadline:
        _, order, _ = best_so_far()
        refined = windowed_exact_order(graph, order, deadline)
        candidates["window-exact"], tried["window-exact"] = refined, graph.peak(refined)
    if len(graph) <= exact_limit and time.monotonic() < deadline:
        _, _, upper = best_so_far()
        order, proved = exact_order(graph, upper, deadline)
        if order is not None:
            candidates["exact"], tried["exact"] = order, graph.peak(order)
        optimal = proved
    name, order, peak = best_so_far()
    return OrderResult(
        order=order,
        peak=peak,
        program_peak=tried["program"],
        strategy=name,
        optimal=optimal,
        seconds=time.monotonic() - started,
        tried=tried,
    )
