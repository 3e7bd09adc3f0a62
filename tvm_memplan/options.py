"""Planner options, settable per call or for a scope with :func:`config`.

TVM 0.27 rejects ``PassContext`` config keys that its C++ side did not register and offers no
Python hook to register new ones, so tvm_memplan keeps its own scoped configuration. Passes
read it when they run, the way TVM passes read ``PassContext.current().config``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .errors import UserError
from .planning import DEFAULT_ALIGNMENT
from .planning.grouping import GroupSetting, parse_groups

SCHEDULES = ("default", "none")
LAYOUTS = ("auto", "nchw", "blocked")


@dataclass(frozen=True)
class MemplanOptions:
    """What the memory planning passes do."""

    alignment: int = DEFAULT_ALIGNMENT
    """Byte alignment of every offset. Below 64, TVM copies instead of aliasing."""
    time_budget: float = 10.0
    """Seconds the allocator search may spend per arena once the greedy orderings miss the bound."""
    inplace: bool = True
    """In-place kernels and concat elimination (docs/design.md): tensors share bytes by design."""
    order: str = "search"
    """Execution order: ``program`` (as imported), ``dfs``/``bfs`` (TVM's TopologicalSort), ``search``."""
    order_seconds: float = 10.0
    """Seconds the execution-order search may spend per function."""
    schedule: str = "default"
    """Kernel schedules: ``default`` (tvm_memplan's: on CPU targets every kernel, tuned ones kept; on
    GPU targets convolutions and pools, the rest dlight's) or ``none`` (what TVM's pipeline emits:
    plain loops on CPU, dlight's rules alone on GPU; for comparison)."""
    layout: str = "auto"
    """Activation layout on ``llvm`` targets: ``blocked`` (convolutions, their epilogues and pools in
    NCHW[x]c, x the target's float32 vector lanes, weights packed at compile time, channels padded to
    whole blocks; :mod:`tvm_memplan.relax.layout`), ``nchw`` (as imported), or ``auto`` (the default:
    blocked where the target's ISA has a block, 16 lanes with AVX-512 or 8 with AVX2; NCHW on arm64
    NEON, the ``c`` target and GPUs; ``blocked`` runs NCHW4c on NEON)."""
    groups: GroupSetting | None = None
    """Layer grouping (docs/design.md): None (off), ``seq`` (layer-wise order, one kernel a group),
    a group count per layer, or ``auto`` (cost-aware). Tensors a group uses never share bytes
    and the order becomes layer-wise: a group's kernels may run at once."""

    def __post_init__(self) -> None:
        if self.alignment < 1 or self.alignment & (self.alignment - 1):
            raise UserError(f"alignment must be a positive power of two, got {self.alignment}")
        if self.time_budget < 0 or self.order_seconds < 0:
            raise UserError("time budgets must be >= 0 seconds")
        if self.order not in ("program", "dfs", "bfs", "search"):
            raise UserError(f"unknown order {self.order!r}; choose one of program, dfs, bfs, search")
        if self.schedule not in SCHEDULES:
            raise UserError(f"unknown schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}")
        if self.layout not in LAYOUTS:
            raise UserError(f"unknown layout {self.layout!r}; choose one of {', '.join(LAYOUTS)}")
        if self.groups is not None:
            try:
                object.__setattr__(self, "groups", parse_groups(self.groups))
            except ValueError as exc:
                raise UserError(str(exc)) from None

    def updated(self, **changes: Any) -> MemplanOptions:
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise UserError(f"unknown tvm_memplan option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


_scope = threading.local()


def current_options() -> MemplanOptions:
    """The options of the innermost :func:`config` scope (defaults outside any)."""
    return getattr(_scope, "options", None) or MemplanOptions()


@contextlib.contextmanager
def config(**changes: Any) -> Iterator[MemplanOptions]:
    """Set planner options for everything compiled inside the ``with`` block."""
    previous = getattr(_scope, "options", None)
    _scope.options = current_options().updated(**changes)
    try:
        yield _scope.options
    finally:
        _scope.options = previous
