"""An independent check of a placement: nothing here shares code with the allocators."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .problem import Problem


class InvalidPlanError(AssertionError):
    """A placement that breaks the problem's rules."""


def validate_offsets(problem: Problem, offsets: Sequence[int], arena_bytes: int | None = None) -> int:
    """Prove the placement valid and return the arena it needs.

    Checks: one non-negative offset a buffer, every offset a multiple of the alignment, every
    buffer inside ``arena_bytes`` (when given), every alias at its declared offset, and no two
    buffers that are alive together, named in ``problem.conflicts`` or alive in one of
    ``problem.concurrent``'s step ranges (re-derived here, not read from the conflicts) sharing
    a byte — unless they belong to the same alias group, whose sharing is by design.
    """
    n = len(problem.buffers)
    if len(offsets) != n:
        raise InvalidPlanError(f"{len(offsets)} offsets for {n} buffers")
    if n == 0:
        return 0
    off = np.asarray(offsets, dtype=np.int64)
    size = np.array([b.size for b in problem.buffers], dtype=np.int64)
    start = np.array([b.start for b in problem.buffers], dtype=np.int64)
    end = np.array([b.end for b in problem.buffers], dtype=np.int64)
    if (off < 0).any():
        raise InvalidPlanError(f"negative offset for buffer {problem.buffers[int(np.argmin(off))].name!r}")
    misaligned = np.nonzero(off % problem.alignment)[0]
    if misaligned.size:
        i = int(misaligned[0])
        raise InvalidPlanError(
            f"buffer {problem.buffers[i].name!r} at offset {off[i]} is not {problem.alignment}-byte aligned"
        )
    needed = int((off + size).max())
    if arena_bytes is not None and needed > arena_bytes:
        raise InvalidPlanError(f"buffers reach byte {needed}, beyond the arena of {arena_bytes}")

    group = np.arange(n)
    for i in range(n):
        root, delta = problem.alias_root(i)
        group[i] = root
        if off[i] != off[root] + delta:
            raise InvalidPlanError(
                f"buffer {problem.buffers[i].name!r} at offset {off[i]} should alias "
                f"{problem.buffers[root].name!r} at {off[root]} + {delta}"
            )

    # Pairwise: alive together (or an explicit conflict) and byte ranges intersect.
    # Zero-size buffers occupy no bytes and never collide.
    together = (start[:, None] < end[None, :]) & (start[None, :] < end[:, None])
    for i, j in problem.conflicts:
        together[i, j] = together[j, i] = True
    for lo, hi in problem.concurrent:
        alive = (start < hi) & (lo < end)
        together |= alive[:, None] & alive[None, :]
    np.fill_diagonal(together, False)
    overlap = (off[:, None] < (off + size)[None, :]) & (off[None, :] < (off + size)[:, None])
    nonempty = size > 0
    bad = together & overlap & nonempty[:, None] & nonempty[None, :] & (group[:, None] != group[None, :])
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        bi, bj = problem.buffers[i], problem.buffers[j]
        raise InvalidPlanError(
            f"buffers {bi.name!r} [{off[i]}, {off[i] + size[i]}) and {bj.name!r} "
            f"[{off[j]}, {off[j] + size[j]}) overlap while both are live"
        )
    return needed
