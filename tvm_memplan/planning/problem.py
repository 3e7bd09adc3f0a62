"""The planning problem: buffers with sizes and half-open lifetimes, plus extra conflicts.

This module is TVM-free on purpose: everything here runs and tests in milliseconds.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

DEFAULT_ALIGNMENT = 64


def align_up(value: int, alignment: int) -> int:
    """Round ``value`` up to a multiple of ``alignment``."""
    return -(-value // alignment) * alignment


class TensorBytes:
    """The byte size of a tensor class with a ``shape`` and an ``itemsize`` (bytes per element)."""

    shape: tuple[int, ...]
    itemsize: int

    @property
    def nbytes(self) -> int:
        return self.itemsize * math.prod(self.shape)


@dataclass(frozen=True)
class Buffer:
    """One tensor to place: ``size`` bytes alive over the steps ``[start, end)``."""

    name: Hashable
    size: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.size < 0:
            raise ValueError(f"buffer {self.name!r}: negative size {self.size}")
        if self.end <= self.start:
            raise ValueError(f"buffer {self.name!r}: empty lifetime [{self.start}, {self.end})")

    def lives_with(self, other: Buffer) -> bool:
        """True when the two half-open lifetimes intersect."""
        return self.start < other.end and other.start < self.end


@dataclass
class AliasGroup:
    """Buffers that share one block of memory at fixed offsets (a single buffer when unaliased)."""

    members: list[int]
    deltas: list[int]
    start: int
    end: int
    size: int


@dataclass
class Problem:
    """Buffers to place in one arena.

    ``conflicts`` holds extra index pairs that may not share bytes even when their lifetimes
    are disjoint (the F-predicate of layer grouping). ``alignment`` applies to every offset;
    sizes are padded to it when placing, so the lower bound is taken over padded sizes.
    ``concurrent`` lists disjoint step ranges ``[lo, hi)`` whose operators run as one group:
    every buffer alive anywhere in a range may share bytes with no other such buffer, so the
    pairs this implies are added to ``conflicts`` (layer grouping's F-predicate, docs/design.md).
    """

    buffers: list[Buffer]
    conflicts: frozenset[tuple[int, int]] = field(default_factory=frozenset)
    alignment: int = DEFAULT_ALIGNMENT
    aliases: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Buffer ``i`` → ``(j, delta)``: ``i`` must sit at ``offset(j) + delta`` (in-place outputs,
    concat inputs written into their slice of the output). Buffers joined this way form an
    alias group; they may share bytes while alive, by design."""
    concurrent: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.alignment < 1:
            raise ValueError(f"alignment must be positive, got {self.alignment}")
        n = len(self.buffers)
        self.concurrent = tuple(sorted((int(lo), int(hi)) for lo, hi in self.concurrent))
        for (lo, hi), following in pairwise((*self.concurrent, None)):
            if hi <= lo or (following is not None and following[0] < hi):
                raise ValueError(f"concurrent step ranges must be non-empty and disjoint, got {self.concurrent}")
        normalised = set(self._concurrent_pairs())
        for i, j in self.conflicts:
            if not (0 <= i < n and 0 <= j < n) or i == j:
                raise ValueError(f"conflict pair ({i}, {j}) does not name two buffers")
            normalised.add((min(i, j), max(i, j)))
        self.conflicts = frozenset(normalised)
        for i, (j, delta) in self.aliases.items():
            if not (0 <= i < n and 0 <= j < n) or i == j:
                raise ValueError(f"alias ({i} -> {j}) does not name two buffers")
            if delta < 0 or delta % self.alignment:
                raise ValueError(
                    f"alias offset {delta} of buffer {i} is not a non-negative multiple of {self.alignment}"
                )

    def _concurrent_pairs(self) -> list[tuple[int, int]]:
        """Pairs alive in one concurrent range whose own lifetimes are disjoint.

        Members of one alias group are left out: whoever aliased them (in-place kernels, concat
        slices) knew the groups and shares their bytes by design.
        """
        if not self.concurrent:
            return []
        root = [self.alias_root(i)[0] for i in range(len(self.buffers))]
        pairs = []
        for lo, hi in self.concurrent:
            inside = [i for i, b in enumerate(self.buffers) if b.start < hi and lo < b.end]
            for a, i in enumerate(inside):
                for j in inside[a + 1 :]:
                    if root[i] != root[j] and not self.buffers[i].lives_with(self.buffers[j]):
                        pairs.append((i, j))
        return pairs

    def widened_lifetime(self, start: int, end: int) -> tuple[int, int]:
        """``[start, end)`` stretched over the concurrent ranges its first and last steps fall in."""
        for lo, hi in self.concurrent:
            if lo <= start < hi:
                start = lo
            if lo <= end - 1 < hi:
                end = hi
        return start, end

    def alias_root(self, index: int) -> tuple[int, int]:
        """The buffer at the top of ``index``'s alias chain and ``index``'s offset from it."""
        delta, seen = 0, set()
        while index in self.aliases:
            if index in seen:
                raise ValueError(f"alias cycle through buffer {index}")
            seen.add(index)
            index, step = self.aliases[index]
            delta += step
        return index, delta

    def __len__(self) -> int:
        return len(self.buffers)

    def padded_size(self, index: int) -> int:
        return align_up(self.buffers[index].size, self.alignment)

    def padded_sizes(self) -> list[int]:
        return [align_up(b.size, self.alignment) for b in self.buffers]

    def must_not_overlap(self, i: int, j: int) -> bool:
        """Whether buffers ``i`` and ``j`` need disjoint byte ranges."""
        if i == j:
            return False
        if self.buffers[i].lives_with(self.buffers[j]):
            return True
        return (min(i, j), max(i, j)) in self.conflicts

    def naive_bytes(self) -> int:
        """Bytes needed when every buffer gets its own memory."""
        return sum(self.padded_sizes())

    def alias_groups(self) -> list[AliasGroup]:
        """Buffers joined by aliases, each group with its lifetime hull and byte extent."""
        index_of: dict[int, int] = {}
        groups: list[AliasGroup] = []
        for i in range(len(self.buffers)):
            root, delta = self.alias_root(i)
            if root not in index_of:
                index_of[root] = len(groups)
                groups.append(AliasGroup([], [], self.buffers[i].start, self.buffers[i].end, 0))
            group = groups[index_of[root]]
            group.members.append(i)
            group.deltas.append(delta)
            group.start = min(group.start, self.buffers[i].start)
            group.end = max(group.end, self.buffers[i].end)
            group.size = max(group.size, delta + self.padded_size(i))
        return groups

    def lower_bound(self) -> int:
        """Maximum over time of the padded bytes alive at once (a bound for any placement).

        An alias group counts once, with its byte extent, over its lifetime hull. With
        ``concurrent`` ranges each hull is widened over the ranges it touches: the buffers alive
        at one widened step pairwise may not share bytes, so their sum still bounds any placement.
        """
        events: list[tuple[int, int]] = []
        for group in self.alias_groups():
            start, end = self.widened_lifetime(group.start, group.end)
            events.append((start, group.size))
            events.append((end, -group.size))
        # At equal times frees (negative) come first: lifetimes are half-open.
        events.sort(key=lambda e: (e[0], e[1]))
        live = peak = 0
        for _, delta in events:
            live += delta
            peak = max(peak, live)
        return peak

    def horizon(self) -> int:
        """One past the last step any buffer is alive."""
        return max((b.end for b in self.buffers), default=0)

    @classmethod
    def from_rows(
        cls,
        rows: Iterable[tuple[Hashable, int, int, int]],
        alignment: int = DEFAULT_ALIGNMENT,
    ) -> Problem:
        """Build from ``(name, start, end, size)`` rows."""
        return cls([Buffer(name, size, start, end) for name, start, end, size in rows], alignment=alignment)


class ProblemFormatError(ValueError):
    """A problem file that cannot be read; the message is one line for the CLI."""


def read_minimalloc_csv(path: str | Path, alignment: int = DEFAULT_ALIGNMENT) -> Problem:
    """Read MiniMalloc's CSV format: a header ``id,lower,upper,size`` then one buffer a row."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ProblemFormatError(f"no such file: {path}") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise ProblemFormatError(f"cannot read {path}: {exc}") from None
    reader = csv.reader(text.splitlines())
    header = next(reader, None)
    expected = ["id", "lower", "upper", "size"]
    if header is None or [h.strip().lower() for h in header] != expected:
        raise ProblemFormatError(f"{path}: expected the header 'id,lower,upper,size', got {header!r}")
    rows = []
    for line_no, row in enumerate(reader, start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != 4:
            raise ProblemFormatError(f"{path}:{line_no}: expected 4 columns, got {len(row)}")
        try:
            name = row[0].strip()
            lower, upper, size = (int(cell) for cell in row[1:])
        except ValueError:
            raise ProblemFormatError(f"{path}:{line_no}: lower, upper and size must be integers") from None
        if upper <= lower or size < 0:
            raise ProblemFormatError(f"{path}:{line_no}: need lower < upper and size >= 0")
        rows.append((name, lower, upper, size))
    if not rows:
        raise ProblemFormatError(f"{path}: no buffers")
    return Problem.from_rows(rows, alignment=alignment)


def write_offsets_csv(path: str | Path, problem: Problem, offsets: Sequence[int]) -> None:
    """Write MiniMalloc's solution format: ``id,lower,upper,size,offset``."""
    lines = ["id,lower,upper,size,offset"]
    for b, offset in zip(problem.buffers, offsets, strict=True):
        lines.append(f"{b.name},{b.start},{b.end},{b.size},{offset}")
    Path(path).write_text("\n".join(lines) + "\n")
