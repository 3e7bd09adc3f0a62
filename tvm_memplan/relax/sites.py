"""Allocation sites: the tensors the arena planner places, as the extractor and the in-place
analysis both see them."""

from __future__ import annotations

from dataclasses import dataclass

from tvm import relax


@dataclass(frozen=True)
class AllocSite:
    """One ``R.builtin.alloc_tensor`` binding at a known step of the function."""

    var: relax.Var
    step: int
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    device_index: int
    scope: str
