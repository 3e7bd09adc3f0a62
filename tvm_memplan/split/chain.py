"""The sub-graphs fine-grained splitting cuts into tiles, TVM-free (docs/design.md, "Fine-grained splitting").

A chain is one of three kinds, each with its own tile arithmetic:

- :class:`ChannelChain`: tiles along the channel axis of NCHW tensors, from a head whose output
  channels are independent, ending in a convolution that reduces them (partial sums) or in a
  tensor written tile by tile into its regions;
- :class:`RowChain`: tiles along the sequence axis of ``(1, sequence, features)`` tensors (a
  transformer's feed-forward block or an attention's queries);
- :class:`SpatialChain`: tiles along the rows (H axis) of NCHW tensors, halos recomputed.

``Chain(branches, concat, post, tail, tile_bytes, rows=..., spatial=..., gathered=..., anchor=...)``
still builds the matching kind from the flat fields of the older single class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .spatial import RollingRows, RowOp, Rows, rolling_rows, tile_rows

SPATIAL_PARTS = 16
"""Most row tiles a spatial chain is cut into: thinner tiles mostly recompute halos."""
LINE_BUFFER_PARTS = 64
"""Row tiles of a spatial chain whose tiles keep a line buffer, on a microcontroller (a kernel call costs a
few instructions there, and a line buffer recomputes no halo: what more tiles pay is their kept rows' copies)."""


def tile_ranges(parts: int, units: int, extent: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` of each of ``parts`` tiles along an axis of ``extent`` made of ``units`` equal
    units, every tile whole units."""
    per_unit = extent // units
    return [((t * units // parts) * per_unit, ((t + 1) * units // parts) * per_unit) for t in range(parts)]


@dataclass(frozen=True)
class Branch:
    """A head whose output units are independent and the operators after it that keep them apart."""

    head: str
    mids: tuple[str, ...]
    units: int
    """Tiles are made of whole units (channels, groups of a grouped convolution, or rows)."""
    channels: int
    """Channels of the branch's last tensor (its share of a concat)."""
    pool: str | None = None
    """A pool that feeds the head from a tensor other operators keep whole (an inception
    module's pool branch): each tile of the head sums ``parts`` partial convolutions, each of
    a pool over a slice of that tensor's channels, so the pooled tensor never exists whole."""

    def tile_ranges(self, parts: int, extent: int) -> list[tuple[int, int]]:
        """The tiles of an axis of ``extent`` made of this branch's units (channels of any of its
        tensors, or rows)."""
        return tile_ranges(parts, self.units, extent)

    def tile_fraction(self, parts: int, t: int) -> float:
        """The share of the branch's tensors that tile ``t`` holds."""
        return ((t + 1) * self.units // parts - t * self.units // parts) / self.units


class _LegacyConstructor(type):
    """``Chain(...)`` with the flat fields of the older class builds the matching kind."""

    def __call__(cls, *args, **kwargs):
        if cls is Chain:
            return _chain_of_fields(*args, **kwargs)
        return super().__call__(*args, **kwargs)


class Chain(metaclass=_LegacyConstructor):
    """What every kind of chain answers: its bindings in program order, by name."""

    branches: tuple[Branch, ...]
    tile_bytes: int
    """Bytes of the tensors that become tiles."""
    anchor: str | None = None
    """The binding after which the tiles run, when an operand from outside the chain is computed
    after its head (an attention's keys and values, after its query projection); None: where the
    head ran."""
    kind: str
    """``temporal`` (channel tiles reduced by partial sums), ``concat`` (channel tiles written into
    their regions), ``rows`` (of a transformer's sequence) or ``spatial`` (row tiles of NCHW tensors)."""
    max_parts: int = 64

    # Views for callers that asked the older class for its flags.
    rows = False
    spatial: tuple[RowOp, ...] = ()
    gathered = False

    @property
    def head(self) -> str:
        return self.branches[0].head

    @property
    def units(self) -> int:
        return min(b.units for b in self.branches)

    @property
    def bindings(self) -> tuple[str, ...]:
        (branch,) = self.branches
        return (branch.head, *branch.mids)

    @property
    def final(self) -> str:
        """The binding whose tensor the chain produces."""
        return self.bindings[-1]

    @property
    def tiled(self) -> tuple[str, ...]:
        """Bindings whose tensors exist tile by tile once the chain is split."""
        return self.bindings

    @property
    def name(self) -> str:
        return f"{self.head}..{self.final}"

    @property
    def fusable(self) -> bool:
        """Whether its tiles may run as one kernel (``SplitChoice.fused``) for the memory of the
        per-kernel tiles: its last tensor is written tile by tile where it ends up, or accumulated in
        place (a tile kernel holds its output for the whole chain; tiles gathered at the end would
        need room for both)."""
        return False

    def parts_ladder(self, limit: int = 64) -> list[int]:
        """Numbers of parts worth trying: powers of two up to the number of units."""
        ladder, parts = [], 2
        while parts <= min(self.units, limit, self.max_parts):
            ladder.append(parts)
            parts *= 2
        return ladder


@dataclass(frozen=True)
class ChannelChain(Chain):
    """Channel tiles: one branch, or several joined by a channel ``concat`` (the branches of an
    inception or fire module), then per-channel operators on the joined tensor (``post``: a pool),
    then the tail."""

    branches: tuple[Branch, ...]
    concat: str | None
    post: tuple[str, ...]
    tail: str | None
    """The convolution that reduces over the chain's channels (partial sums), or None: the last
    tensor is produced tile by tile into its regions (concat elimination)."""
    tile_bytes: int

    @property
    def kind(self) -> str:
        return "temporal" if self.tail else "concat"

    @property
    def name(self) -> str:
        last = self.tail or (self.post[-1] if self.post else self.concat) or (self.branches[0].mids or (self.head,))[-1]
        return f"{self.head}..{last}" + (f" ({len(self.branches)} branches)" if len(self.branches) > 1 else "")

    @property
    def bindings(self) -> tuple[str, ...]:
        names = [n for b in self.branches for n in ((b.pool,) if b.pool else ()) + (b.head, *b.mids)]
        names += [self.concat] if self.concat else []
        return tuple(names) + self.post + ((self.tail,) if self.tail else ())

    @property
    def tiled(self) -> tuple[str, ...]:
        return tuple(b for b in self.bindings if b != self.tail)

    @property
    def fusable(self) -> bool:
        """With a tail (its tiles accumulate into the tail's output in place); a branching chain's
        branches then run one after another in its kernel, where its last head ran."""
        return self.tail is not None

    def channel_offset(self, index: int) -> int:
        """Where branch ``index``'s channels start in the joined tensor."""
        return sum(b.channels for b in self.branches[:index])


class _OneBranch(Chain):
    """A chain of one branch, with nothing joined after it and no reducing tail."""

    branch: Branch
    concat = None
    post: tuple[str, ...] = ()
    tail = None

    @property
    def branches(self) -> tuple[Branch, ...]:
        return (self.branch,)


@dataclass(frozen=True)
class RowChain(_OneBranch):
    """Row tiles of ``(1, sequence, features)`` tensors: every operator row-wise, the last tensor
    made tile by tile. ``branch.units`` is the sequence length."""

    branch: Branch
    tile_bytes: int
    anchor: str | None = None

    kind = "rows"
    rows = True

    def row_ranges(self, parts: int) -> list[Rows]:
        return self.branch.tile_ranges(parts, self.branch.units)


@dataclass(frozen=True)
class SpatialChain(_OneBranch):
    """Row tiles of NCHW tensors (:mod:`tvm_memplan.split.spatial`): operators cut along the H
    axis, halos recomputed, each tile of the last tensor written into its rows."""

    branch: Branch
    ops: tuple[RowOp, ...]
    tile_bytes: int
    gathered: bool = False
    """The last tiles are kept and concatenated once at the end: the last tensor grows tile by tile
    instead of existing whole from the first tile on (the middle tiles, where the chain's peak is,
    hold less), for its size again at the end and a concat kernel (offered where strides made that
    tensor small)."""
    line_buffer_parts: int = 0
    """Tiles it may be cut into beyond :attr:`max_parts` when they keep a rolling line buffer
    (:attr:`SplitChoice.rolling`: more tiles recompute no more rows, only copy the kept ones; offered on
    microcontrollers, :data:`LINE_BUFFER_PARTS`); 0: none."""

    kind = "spatial"
    max_parts = SPATIAL_PARTS

    def parts_ladder(self, limit: int = 64) -> list[int]:
        """Powers of two up to the rows, :attr:`max_parts` or, with a line buffer, :attr:`line_buffer_parts`;
        also a tile per row of the last tensor where its rows are fewer (MobileNetV2-1.0's chain from the stem
        to a 28-row tensor with a line buffer: 28 tiles, where 16 left the 96x112x112 expansion's tile 9 rows and
        32 do not fit; GoogLeNet's inception modules to a 14-row pool: 14)."""
        most = min(self.units, limit, max(self.max_parts, self.line_buffer_parts))
        ladder, parts = [], 2
        while parts <= most:
            ladder.append(parts)
            parts *= 2
        if self.units == most and ladder and ladder[-1] < most:
            ladder.append(most)
        return ladder

    @property
    def name(self) -> str:
        return f"{self.head}..{self.ops[-1].name} (rows{', gathered' if self.gathered else ''})"

    @property
    def fusable(self) -> bool:
        return not self.gathered

    def tile_rows(self, parts: int) -> list[dict[str, Rows]]:
        """Per tile, the output rows every operator computes (halos included)."""
        return tile_rows(self.ops, parts)

    def rolling_rows(self, parts: int, runs: int = 1) -> list[dict[str, RollingRows]]:
        """Per tile, the rows every operator holds and keeps from its previous tile (a line buffer;
        tiles in order within ``runs`` runs, :func:`~tvm_memplan.split.spatial.rolling_rows`)."""
        return rolling_rows(self.ops, parts, runs)

    def has_halo(self, parts: int, runs: int = 1) -> bool:
        """Whether neighbouring tiles of a run share rows (so a line buffer computes less than recomputing)."""
        return any(r.kept is not None for tile in self.rolling_rows(parts, runs) for r in tile.values())

    @property
    def spatial(self) -> tuple[RowOp, ...]:
        """The operators (the older class's ``spatial`` field)."""
        return self.ops


def _chain_of_fields(
    branches: tuple[Branch, ...],
    concat: str | None,
    post: tuple[str, ...],
    tail: str | None,
    tile_bytes: int,
    rows: bool = False,
    spatial: tuple[RowOp, ...] = (),
    gathered: bool = False,
    anchor: str | None = None,
) -> Chain:
    if spatial:
        (branch,) = branches
        return SpatialChain(branch, tuple(spatial), tile_bytes, gathered)
    if rows:
        (branch,) = branches
        return RowChain(branch, tile_bytes, anchor)
    return ChannelChain(tuple(branches), concat, tuple(post), tail, tile_bytes)


@dataclass(frozen=True)
class SplitChoice:
    chain: Chain
    parts: int
    fused: bool = False
    """The chain's tiles run as one kernel (every stage of a tile before the next tile), not one
    kernel per operator and tile."""
    workers: int = 1
    """Fused tiles of a spatial chain (independent tiles) run on this many threads at once, each
    worker with a scratch region of its own for its tile's buffers; 1: one tile at a time."""
    rolling: bool = False
    """The tiles of a spatial chain keep the halo rows their next tile reads in a rolling line buffer
    instead of recomputing them (:meth:`SpatialChain.rolling_rows`): the tiles (of each worker, when fused)
    run in order, the first of them computing its halo. Per kernel (not fused) on microcontrollers: one
    call per operator and tile, the kept rows copied to the top of the next tile's buffer."""

    def __post_init__(self) -> None:
        if self.rolling and not isinstance(self.chain, SpatialChain):
            raise ValueError("a rolling line buffer is for the tiles of a spatial chain")

    @property
    def concurrent_tiles(self) -> int:
        """Tiles whose buffers are live at once: the workers of fused independent tiles, else 1."""
        independent = self.fused and isinstance(self.chain, SpatialChain)
        return max(1, min(self.workers, self.parts)) if independent else 1

    @property
    def variant(self) -> str:
        """How the tiles run, for reports: ``per-kernel``, ``fused`` (halos recomputed) or ``fused, line buffer``."""
        return "fused, line buffer" if self.rolling else "fused" if self.fused else "per-kernel"


FUSED_TILES = ("off", "on", "auto")
"""Whether a split chain's tiles run as one kernel (:attr:`SplitChoice.fused`, where :attr:`Chain.fusable`):
never, always, or where that measured faster than the per-kernel tiles."""


def disjoint(chains: list[Chain]) -> bool:
    names = [n for c in chains for n in c.bindings]
    return len(names) == len(set(names))


def in_channel_blocks(chains: list[Chain], block: int) -> list[Chain]:
    """``chains`` as a blocked channel layout (NCHW[x]c, ``block`` channels a block) tiles them: a channel
    chain's tiles are whole blocks (each branch's units coarsened to the greatest number that divides both
    its units and its blocks), and a channel chain with a branch whose channels do not fill whole blocks,
    or that no longer has two units, is left out. Row and spatial chains cut rows, axis 2 in both layouts:
    unchanged."""
    kept: list[Chain] = []
    for chain in chains:
        if not isinstance(chain, ChannelChain):
            kept.append(chain)
            continue
        if any(b.channels % block for b in chain.branches):
            continue
        branches = tuple(replace(b, units=math.gcd(b.units, b.channels // block)) for b in chain.branches)
        if min(b.units for b in branches) >= 2:
            kept.append(replace(chain, branches=branches))
    return kept
