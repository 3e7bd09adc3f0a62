"""Shared report formatting for the CLI: byte sizes, tables, and a text memory profile."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from time import monotonic
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..planning import Problem


def human_bytes(nbytes: int | float | None) -> str:
    if nbytes is None:
        return "-"
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def console() -> Console:
    return Console(file=sys.stdout, highlight=False, soft_wrap=True)


def progress_display(counted: bool = True) -> AbstractContextManager[Progress | None]:
    """A rich progress display on stderr while a long command works, only when stderr is a terminal
    (None otherwise: logs and pipes stay clean). ``counted``: show done/total."""
    if not sys.stderr.isatty():
        return nullcontext(None)
    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        *([MofNCompleteColumn()] if counted else []),
        TimeElapsedColumn(),
    ]
    return Progress(*columns, console=Console(file=sys.stderr), transient=True)


@contextmanager
def split_search_progress(seconds: float) -> Iterator[Callable[[int, int], None] | None]:
    """A bar over the split search's time limit: candidates timed and the lowest peak so far."""
    with progress_display(counted=False) as bar:
        if bar is None:
            yield None
            return
        task = bar.add_task("split search", total=seconds)
        started = monotonic()

        def progress(timed: int, peak_bytes: int) -> None:
            bar.update(
                task,
                completed=min(monotonic() - started, seconds),
                description=f"split search: {timed} candidates timed, lowest peak {human_bytes(peak_bytes)}",
            )

        yield progress


def key_value_table(title: str, rows: Sequence[tuple[str, str]]) -> Table:
    table = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False, expand=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, value)
    return table


def memory_profile(problem: Problem, arena_bytes: int, width: int = 60, height: int = 8) -> str:
    """Peak bytes alive per time window as a text area chart scaled to the arena (the terminal's layout picture)."""
    horizon = problem.horizon()
    if horizon == 0 or arena_bytes == 0:
        return ""
    columns = min(width, horizon)
    events: dict[int, int] = {}
    for buffer, size in zip(problem.buffers, problem.padded_sizes(), strict=True):
        events[buffer.start] = events.get(buffer.start, 0) + size
        events[buffer.end] = events.get(buffer.end, 0) - size
    peaks = [0] * columns
    live = 0
    times = sorted(events)
    for index, time in enumerate(times):
        live += events[time]
        until = times[index + 1] if index + 1 < len(times) else horizon
        if until <= time:
            continue
        # Live is constant on [time, until): raise every column that window touches.
        first, last = time * columns // horizon, (until - 1) * columns // horizon
        for column in range(first, last + 1):
            peaks[column] = max(peaks[column], live)
    lines = []
    for row in range(height, 0, -1):
        threshold = arena_bytes * (row - 0.5) / height
        lines.append("│" + "".join("█" if peak >= threshold else " " for peak in peaks) + "│")
    lines.append("└" + "─" * columns + "┘")
    lines.append(f" peak live bytes over steps 0..{horizon - 1}; full height = arena {human_bytes(arena_bytes)}")
    return "\n".join(lines)


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False))
