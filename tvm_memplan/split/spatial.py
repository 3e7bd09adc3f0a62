"""Spatial tiles (sliding-window axes, MCUNetV2's patches): which rows each operator of a row-tiled chain
computes, halos included.

A *spatial chain* is cut along the rows (H) of its NCHW tensors, so every tile keeps all the
channels (a convolution's register tile and vector width stay as in the whole kernel; channel
tiles of a 3-channel stem re-read the input once per tile). A convolution or pool reading rows
through a window needs ``dilation * (kernel - 1)`` rows beyond ``stride`` per output row: tiles
of its input overlap by that halo, which neighbouring tiles both compute (MCUNetV2's patch-based
inference pays the same recomputation). Rows are planned backwards from the chain's last tensor:
each operator computes the hull of what its consumers in the chain need.

:func:`rolling_rows` plans the other way to pay for halos: tiles run in order and every operator keeps
the rows of its previous tile that the next tile reads again (a rolling line buffer, as in TinyEngine
and the line buffers of image-processing pipelines), computing only the rows it has not produced yet.
"""

from __future__ import annotations

from dataclasses import dataclass

Rows = tuple[int, int]
"""``[lo, hi)``"""


@dataclass(frozen=True)
class RowWindow:
    """How a convolution or pool reads rows: output row ``r`` reads input rows
    ``stride * r - pad_top + dilation * k`` for ``k < kernel`` (those outside ``[0, rows_in)`` are padding)."""

    kernel: int
    stride: int
    pad_top: int
    dilation: int
    rows_in: int

    def input_rows(self, rows: Rows) -> tuple[Rows, int, int]:
        """Input rows that output ``rows`` read, and the padding above and below them that a
        convolution over just those rows needs to produce exactly ``rows``."""
        lo, hi = rows
        first = lo * self.stride - self.pad_top
        end = (hi - 1) * self.stride - self.pad_top + self.dilation * (self.kernel - 1) + 1
        clipped = (max(first, 0), min(end, self.rows_in))
        return clipped, clipped[0] - first, end - clipped[1]


@dataclass(frozen=True)
class RowOp:
    """One binding of a spatial chain, for the simulator and the rewriter."""

    name: str
    rows: int
    """Rows of its output."""
    row_bytes: int
    """Bytes of one output row (all channels and columns)."""
    reads: tuple[str, ...] = ()
    """Bindings of the chain it reads (its row operands inside the chain)."""
    window: RowWindow | None = None
    """None: output row ``r`` reads row ``r`` of its operands (elementwise, 1x1 stride-1 convolutions)."""
    outside: tuple[str, ...] = ()
    """Operands from outside the chain it reads row by row (its rows of them per tile)."""
    copied_row_bytes: int = 0
    """Bytes of one row of the outside operand that a tile copies out before its window reads it (0: the
    window reads its rows in place). An int8 model's convolution must read a ``dequantize`` to stay an
    integer kernel, so its tile dequantizes a copy of the int8 rows."""


def operand_rows(op: RowOp, rows: Rows) -> Rows:
    """Rows of ``op``'s row operands that its output ``rows`` read."""
    return op.window.input_rows(rows)[0] if op.window is not None else rows


def tile_rows(ops: tuple[RowOp, ...], parts: int) -> list[dict[str, Rows]]:
    """Per tile, the output rows every operator computes: the last operator's rows split into
    ``parts`` even ranges, earlier ones the hull of what their consumers in the chain read."""
    last = ops[-1]
    tiles = []
    for t in range(parts):
        need: dict[str, Rows] = {last.name: (t * last.rows // parts, (t + 1) * last.rows // parts)}
        for op in reversed(ops):
            rows = need[op.name]
            for name in op.reads:
                lo, hi = operand_rows(op, rows)
                have = need.get(name)
                need[name] = (lo, hi) if have is None else (min(have[0], lo), max(have[1], hi))
        tiles.append(need)
    return tiles


@dataclass(frozen=True)
class RollingRows:
    """One operator's rows in one tile of a line-buffered chain."""

    held: Rows
    """Rows its tile buffer holds (what its consumers in the chain read in this tile)."""
    kept: Rows | None
    """The first of them, carried over from its previous tile's buffer (None: nothing carried)."""

    @property
    def computed(self) -> Rows:
        """Rows it computes in this tile (never none: a tile that would compute none recomputes them)."""
        return (self.kept[1], self.held[1]) if self.kept is not None else self.held


def run_starts(parts: int, runs: int) -> list[int]:
    """First tile of each of ``runs`` contiguous runs of ``parts`` tiles (one per worker)."""
    runs = max(1, min(runs, parts))
    return [r * parts // runs for r in range(runs)]


def rolling_rows(ops: tuple[RowOp, ...], parts: int, runs: int = 1) -> list[dict[str, RollingRows]]:
    """Per tile, the rows every operator holds and keeps when the tiles run in order within each of
    ``runs`` contiguous runs (the first tile of a run computes all its rows, as :func:`tile_rows`): the
    last operator's rows split into ``parts`` even ranges, each earlier operator holding the hull of what
    its consumers read for the rows they compute, the part of it its previous tile held kept."""
    last = ops[-1]
    starts = set(run_starts(parts, runs))
    tiles: list[dict[str, RollingRows]] = []
    for t in range(parts):
        before = {} if t in starts else tiles[-1]
        need: dict[str, Rows] = {last.name: (t * last.rows // parts, (t + 1) * last.rows // parts)}
        plan: dict[str, RollingRows] = {}
        for op in reversed(ops):
            if op.name not in need:  # nothing reads it in this tile: its next tile starts afresh
                continue
            held, previous = need[op.name], before.get(op.name)
            kept = None
            # rows its previous tile held are kept, unless they are all it holds (a copy with nothing to
            # compute under it: recomputed instead, which only the tiles at the bottom border meet)
            if previous is not None and previous.held[0] <= held[0] < previous.held[1] < held[1]:
                kept = (held[0], previous.held[1])
            plan[op.name] = RollingRows(held, kept)
            lo, hi = plan[op.name].computed
            if lo >= hi:
                continue
            for name in op.reads:
                rlo, rhi = operand_rows(op, (lo, hi))
                have = need.get(name)
                need[name] = (rlo, rhi) if have is None else (min(have[0], rlo), max(have[1], rhi))
        tiles.append(plan)
    return tiles
