"""The axis connection graph (ACG) of fine-grained splitting, built MAGIS-style with union-find.

Every loop axis of every block is a node; every axis of every activation tensor (graph tensors
and the internal buffers of fused kernels, not constants) is a hub. A loop axis that appears in
the index of a tensor axis is joined with that axis's hub, so a producer's axis and a consumer's
axis that index the same tensor axis end up in one connected component. For ``C = A @ B`` this
gives A.s1→C.s1, A.s2→C.t1, B.s1→C.t1, B.s2→C.s2. A grouped convolution reads input channel
``(f // per_group) * in_per_group + r``: its output channel axis ``f`` joins the input's channel axis
through the quotient (tiles of whole groups keep it exact). Loop axes of extent 1 join nothing
(they cannot be split). A component that spans at least two kernels is a split candidate.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from .graph import AxisKind, Graph, TensorRole


@dataclass(frozen=True)
class AxisNode:
    kernel: str
    block: str
    axis: str
    kind: str
    """``spatial``, ``reduction`` ("temporal" in the splitting patent) or ``sliding`` (a spatial axis read through a
    window: convolutions and pools along H and W)."""


@dataclass
class Component:
    id: int
    nodes: list[AxisNode]
    tensor_axes: list[tuple[str, int]]
    """Graph tensor axes in the component (internal buffers of kernels left out)."""
    kernels: list[str] = field(default_factory=list)
    """Kernels with a loop axis in the component, in program order."""

    def kinds(self, kernel: str) -> set[str]:
        return {n.kind for n in self.nodes if n.kernel == kernel}

    def output_axis(self, graph: Graph, kernel: str) -> int | None:
        """Axis of ``kernel``'s output tensor in this component (None: it only reduces over it)."""
        out = graph.kernel(kernel).output
        for name, axis in self.tensor_axes:
            if name == out:
                return axis
        return None

    def describe(self, graph: Graph) -> str:
        parts = []
        for kernel in self.kernels:
            axis = self.output_axis(graph, kernel)
            where = f"out[{axis}]" if axis is not None else "reduced"
            parts.append(f"{kernel}:{'/'.join(sorted(self.kinds(kernel)))}:{where}")
        return " -> ".join(parts)


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[Hashable, Hashable] = {}

    def find(self, x: Hashable) -> Hashable:
        self.parent.setdefault(x, x)
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a: Hashable, b: Hashable) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


@dataclass
class AxisConnectionGraph:
    components: list[Component]

    def candidates(self) -> list[Component]:
        """Components spanning at least two kernels: where a split can cut several operators."""
        return [c for c in self.components if len(c.kernels) >= 2]

    def component_of(self, tensor: str, axis: int) -> Component | None:
        for component in self.components:
            if (tensor, axis) in component.tensor_axes:
                return component
        return None


def build_acg(graph: Graph) -> AxisConnectionGraph:
    """Connect loop axes through the tensor axes they index (see the module docstring)."""
    uf = _UnionFind()
    nodes: list[tuple[AxisNode, tuple]] = []
    hubs: set[tuple] = set()

    def hub(kernel, buffer: str, axis: int) -> tuple | None:
        if buffer in kernel.params:
            tensor = graph.tensors[kernel.args[kernel.params.index(buffer)]]
            if tensor.role is TensorRole.CONSTANT:
                return None
            return ("tensor", tensor.name, axis)
        return ("local", kernel.name, buffer, axis)

    for kernel in graph.kernels:
        for block in kernel.blocks:
            windows = block.windows()
            axes = {a.name: a for a in block.axes}
            for a in block.axes:
                if a.extent <= 1:
                    continue
                kind = "reduction" if a.kind is AxisKind.REDUCTION else ("sliding" if a.name in windows else "spatial")
                key = ("loop", kernel.name, block.name, a.name)
                nodes.append((AxisNode(kernel.name, block.name, a.name, kind), key))
                uf.find(key)
            for access in (block.write, *block.reads):
                for d, idx in enumerate(access.index):
                    h = hub(kernel, access.tensor, d) if idx is not None else None
                    if h is None:
                        continue
                    hubs.add(h)
                    for name in idx.axes:  # quotient terms too: a grouped convolution's group
                        if axes[name].extent > 1:
                            uf.union(("loop", kernel.name, block.name, name), h)
    for view in graph.views:
        for src_axis, view_axis in view.axis_map:
            a, b = ("tensor", view.source, src_axis), ("tensor", view.name, view_axis)
            hubs.update((a, b))
            uf.union(a, b)

    order = {k.name: i for i, k in enumerate(graph.kernels)}
    by_root: dict[Hashable, Component] = {}
    for node, key in nodes:
        root = uf.find(key)
        if root not in by_root:
            by_root[root] = Component(len(by_root), [], [])
        by_root[root].nodes.append(node)
    for h in sorted(hubs, key=str):
        if h[0] == "tensor" and uf.find(h) in by_root:
            by_root[uf.find(h)].tensor_axes.append((h[1], h[2]))
    for component in by_root.values():
        component.kernels = sorted({n.kernel for n in component.nodes}, key=order.__getitem__)
    return AxisConnectionGraph(list(by_root.values()))
