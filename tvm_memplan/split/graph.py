"""The TVM-free model the splitter works on: kernels made of loop nests with affine accesses.

A :class:`Kernel` is one fused operator (one ``call_tir`` after legalization and fusion); it holds
:class:`Block` s in execution order, each a loop nest whose loop axes are spatial or reduction
(the splitting patent's temporal axes) and whose tensor accesses are affine in the loop axes where they can
be (``None`` where they cannot: gathers, data-dependent indices). Everything the analyser,
simulator and optimizer need follows from this: which loop axes index which tensor axes, the
sliding windows (a spatial axis indexed together with a reduction axis, or with a stride), and
which rows of every input a range of output rows needs (:meth:`Kernel.regions`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from ..planning.problem import TensorBytes

Interval = tuple[int, int]
"""Half-open ``[lo, hi)``; empty when ``hi <= lo``."""
Box = tuple[Interval, ...]


class AxisKind(str, Enum):
    SPATIAL = "spatial"
    REDUCTION = "reduction"


class TensorRole(str, Enum):
    INPUT = "input"
    """A function parameter: provided by the caller, never planned."""
    CONSTANT = "constant"
    """Weights and other constants: in flash on a microcontroller, never planned."""
    INTERMEDIATE = "intermediate"
    OUTPUT = "output"
    """Returned to the caller: allocated by the VM outside the arena."""


@dataclass(frozen=True)
class LoopAxis:
    name: str
    kind: AxisKind
    extent: int


@dataclass(frozen=True)
class Affine:
    """``const + sum(coeff * axis) + sum(coeff * (axis // divisor))`` over loop axes.

    The quotient terms are the group of a grouped convolution: its input channel is
    ``(out_channel // out_per_group) * in_per_group + r``, which joins the output channel axis to the
    input's through the group (as MAGIS's dimension graph joins axes through a split dimension).
    """

    terms: tuple[tuple[str, int], ...]
    const: int = 0
    quotients: tuple[tuple[str, int, int], ...] = ()
    """``(axis, divisor, coeff)``: ``coeff * (axis // divisor)`` (floor division, ``divisor > 0``)."""

    @classmethod
    def of(cls, const: int = 0, **terms: int) -> Affine:
        return cls(tuple((k, v) for k, v in terms.items() if v), const)

    @property
    def axes(self) -> tuple[str, ...]:
        """Every loop axis the expression depends on (quotient terms included)."""
        return tuple(name for name, _ in self.terms) + tuple(name for name, _, _ in self.quotients)

    def interval(self, domain: Mapping[str, Interval]) -> Interval:
        """The values the expression takes when every axis ranges over ``domain`` (half-open)."""
        lo = hi = self.const
        for name, coeff, divisor in (*((n, c, 1) for n, c in self.terms), *((n, c, d) for n, d, c in self.quotients)):
            a, b = domain[name]
            if b <= a:
                return (0, 0)
            ends = (coeff * (a // divisor), coeff * ((b - 1) // divisor))
            lo += min(ends)
            hi += max(ends)
        return (lo, hi + 1)

    def single_axis(self) -> str | None:
        """The axis when the expression is ``axis + const``, else None."""
        if len(self.terms) == 1 and self.terms[0][1] == 1 and not self.quotients:
            return self.terms[0][0]
        return None


@dataclass(frozen=True)
class Access:
    """``tensor[index...]``: one affine expression (or None: not affine) per tensor axis."""

    tensor: str
    index: tuple[Affine | None, ...]


@dataclass(frozen=True)
class Window:
    """A sliding window along a spatial axis: ``stride * out + dilation * k`` for ``k < kernel``."""

    kernel: int
    stride: int
    dilation: int

    @property
    def halo(self) -> int:
        """Extra input rows a tile needs beyond ``stride`` per output row."""
        return self.dilation * (self.kernel - 1)


@dataclass(frozen=True)
class Block:
    """One loop nest writing one buffer (a TIR block after legalization)."""

    name: str
    axes: tuple[LoopAxis, ...]
    write: Access
    reads: tuple[Access, ...]

    def axis(self, name: str) -> LoopAxis:
        for axis in self.axes:
            if axis.name == name:
                return axis
        raise KeyError(name)

    def windows(self) -> dict[str, Window]:
        """Spatial axes that index some tensor axis with a stride or next to a reduction axis."""
        kinds = {a.name: a for a in self.axes}
        found: dict[str, Window] = {}
        for access in self.reads:
            for idx in access.index:
                if idx is None:
                    continue
                spatial = [(n, c) for n, c in idx.terms if kinds[n].kind is AxisKind.SPATIAL and kinds[n].extent > 1]
                reduce = [(n, c) for n, c in idx.terms if kinds[n].kind is AxisKind.REDUCTION and kinds[n].extent > 1]
                if len(spatial) != 1:
                    continue
                name, stride = spatial[0]
                if len(reduce) > 1:
                    continue
                kernel, dilation = (kinds[reduce[0][0]].extent, abs(reduce[0][1])) if reduce else (1, 1)
                if kernel > 1 or abs(stride) > 1:
                    found[name] = Window(kernel, abs(stride), dilation)
        return found


@dataclass(frozen=True)
class Tensor(TensorBytes):
    """A tensor of the graph: a kernel's argument or result."""

    name: str
    shape: tuple[int, ...]
    itemsize: int
    role: TensorRole


@dataclass
class KernelRegions:
    """What a kernel touches to produce one box of its output."""

    domains: dict[str, dict[str, Interval]]
    """Block name → the iteration range of every loop axis (absent: the block is not needed)."""
    needed: dict[str, Box]
    """Local buffer (parameters and internal buffers) → the box of it that is read or written."""


@dataclass
class Kernel:
    """One fused operator: a PrimFunc called once, its parameters bound to graph tensors."""

    name: str
    """Unique in the graph (the Relax binding's variable)."""
    func: str
    """The PrimFunc's name: identical kernels share it."""
    params: tuple[str, ...]
    """Local buffer names of the PrimFunc's parameters, the output last."""
    args: tuple[str, ...]
    """Graph tensor bound to each parameter."""
    buffers: dict[str, tuple[int, ...]]
    """Shape of every local buffer (parameters and internal)."""
    blocks: tuple[Block, ...]

    @property
    def output(self) -> str:
        return self.args[-1]

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.args[:-1]

    def full_box(self, buffer: str) -> Box:
        return tuple((0, d) for d in self.buffers[buffer])

    def regions(self, out_box: Box) -> KernelRegions:
        """Backward region inference: the iteration ranges and buffer boxes for ``out_box``.

        Blocks are visited from last to first; a block's spatial axes that write a buffer axis
        directly (``buf[..., axis + c, ...]``) are restricted to the rows that later blocks need,
        every other axis runs fully; reads are bounded by interval arithmetic and clipped to the
        buffer (padding blocks guard their out-of-range reads).
        """
        needed: dict[str, Box] = {self.params[-1]: out_box}
        domains: dict[str, dict[str, Interval]] = {}
        for block in reversed(self.blocks):
            wbox = needed.get(block.write.tensor)
            if wbox is None or is_empty(wbox):
                continue
            domain = {a.name: (0, a.extent) for a in block.axes}
            for (lo, hi), idx in zip(wbox, block.write.index, strict=True):
                axis = idx.single_axis() if idx is not None else None
                if axis is None:
                    continue
                a, b = domain[axis]
                domain[axis] = (max(a, lo - idx.const), min(b, hi - idx.const))
            domains[block.name] = domain
            for access in block.reads:
                box = clip(self._read_box(access, domain), self.buffers[access.tensor])
                needed[access.tensor] = hull(needed.get(access.tensor), box)
        return KernelRegions(domains, needed)

    def _read_box(self, access: Access, domain: Mapping[str, Interval]) -> Box:
        shape = self.buffers[access.tensor]
        return tuple((0, shape[d]) if idx is None else idx.interval(domain) for d, idx in enumerate(access.index))

    def input_boxes(self, out_box: Box) -> dict[int, Box]:
        """Argument position → box of that input needed for ``out_box`` (absent: not read)."""
        needed = self.regions(out_box).needed
        return {i: needed[p] for i, p in enumerate(self.params[:-1]) if p in needed}


@dataclass
class View:
    """A zero-copy view (``R.reshape``): ``name`` shares the bytes of ``source``."""

    name: str
    source: str
    axis_map: tuple[tuple[int, int], ...] = ()
    """(source axis, view axis) pairs that are the same axis (same extent, same position in the
    row-major order): the axis connection graph joins them."""


@dataclass
class Graph:
    """Tensors, kernels in program order, and views."""

    tensors: dict[str, Tensor]
    kernels: list[Kernel]
    views: list[View] = field(default_factory=list)

    def kernel(self, name: str) -> Kernel:
        for kernel in self.kernels:
            if kernel.name == name:
                return kernel
        raise KeyError(name)


def volume(box: Iterable[Interval]) -> int:
    total = 1
    for lo, hi in box:
        total *= max(hi - lo, 0)
    return total


def is_empty(box: Box) -> bool:
    return any(hi <= lo for lo, hi in box)


def clip(box: Box, shape: tuple[int, ...]) -> Box:
    return tuple((max(lo, 0), min(hi, d)) for (lo, hi), d in zip(box, shape, strict=True))


def hull(a: Box | None, b: Box) -> Box:
    """Smallest box holding both (an empty box adds nothing)."""
    if a is None or is_empty(a):
        return b
    if is_empty(b):
        return a
    return tuple((min(x0, y0), max(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b, strict=True))
