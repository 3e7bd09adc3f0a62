"""An append-only JSON-lines log of measurements that a crash cannot corrupt.

Each append rewrites the log to a temporary file in the same directory, fsyncs it and renames it
over the old one, under an exclusive lock: a reader (or the next run after a crash, a lost device
or Ctrl-C) sees the log either before or after a record, never half a line.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DEFAULT_LOG = Path("results") / "measurements.jsonl"


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file renamed over it: a result table is either
    the old one or the new one, never half written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(text)
    temporary.replace(path)


def write_or_print(path: Path | None, text: str) -> None:
    """A script's table: written atomically to ``path`` (its ``--out``), or printed where there is none."""
    if path is None:
        print(text, end="")
    else:
        write_atomically(path, text)


class ResultsLog:
    """JSON-lines file of measurement records (dicts), appended atomically."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def append(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record, sort_keys=False) + "\n"
        with open(self.path.with_name(self.path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            old = self.path.read_bytes() if self.path.exists() else b""
            if old and not old.endswith(b"\n"):
                old += b"\n"
            fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(old + line.encode())
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(temporary, self.path)
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise

    def records(self) -> Iterator[dict[str, Any]]:
        """Every record, oldest first."""
        if not self.path.exists():
            return
        with open(self.path) as lines:
            for line in lines:
                if line.strip():
                    yield json.loads(line)
