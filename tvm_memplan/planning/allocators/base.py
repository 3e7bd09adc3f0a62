"""One interface for every heap algorithm, as in XLA's heap simulator."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..problem import Problem, align_up


@dataclass
class Plan:
    """Offsets for every buffer of a problem, in the problem's buffer order."""

    offsets: list[int]
    arena_bytes: int
    allocator: str
    seconds: float = 0.0
    optimal: bool = False
    """True when the allocator proved no smaller arena exists (e.g. it reached the lower bound)."""
    tried: dict[str, int] = field(default_factory=dict)
    """Arena bytes each allocator reached, when a driver ran several."""
    tried_seconds: dict[str, float] = field(default_factory=dict)
    """Seconds each allocator took, keyed like ``tried``."""


def arena_bytes(problem: Problem, offsets: Sequence[int]) -> int:
    """Arena size a placement needs: end of the highest buffer, padded to the alignment."""
    return max(
        (off + align_up(b.size, problem.alignment) for b, off in zip(problem.buffers, offsets, strict=True)),
        default=0,
    )


class Allocator(ABC):
    """Places every buffer of a problem; subclasses are heap algorithms."""

    name: str = "allocator"

    @abstractmethod
    def place(self, problem: Problem, deadline: float | None) -> list[int]:
        """Return one offset a buffer. ``deadline`` is a ``time.monotonic()`` value or None."""

    def place_proven(self, problem: Problem, deadline: float | None) -> tuple[list[int], bool]:
        """Offsets, and whether the allocator proved that no smaller arena exists.

        Heuristics prove nothing; exact searches override this to report their proofs.
        """
        return self.place(problem, deadline), False

    def allocate(self, problem: Problem, deadline: float | None = None) -> Plan:
        """Place and time it; the plan is optimal when proven so or when it meets the lower bound."""
        started = time.monotonic()
        offsets, proven = self.place_proven(problem, deadline)
        arena = arena_bytes(problem, offsets)
        return Plan(
            offsets=offsets,
            arena_bytes=arena,
            allocator=self.name,
            seconds=time.monotonic() - started,
            optimal=proven or arena <= problem.lower_bound(),
        )
