"""Progress bars show on a terminal only: piped output and logs stay clean."""

from __future__ import annotations

import sys

from rich.progress import Progress

from tvm_memplan.cli.format import progress_display, split_search_progress


def test_no_progress_display_unless_stderr_is_a_terminal(monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    with progress_display() as bar, split_search_progress(10.0) as progress:
        assert bar is None and progress is None
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with progress_display() as bar:
        assert isinstance(bar, Progress)
    with split_search_progress(10.0) as progress:
        progress(3, 4096)  # candidates timed, lowest peak
