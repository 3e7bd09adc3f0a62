"""The JSON manifests written beside a build's output (``OUT.so.json``, ``memplan_c.json``): a dataclass
saved as indented JSON, atomically, and read back with a one-line error when it is missing or is not one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, TypeVar

from ..errors import UserError
from .results import write_atomically

Record = TypeVar("Record")


def save_manifest(record: Any, path: Path) -> None:
    """The dataclass ``record`` as indented JSON at ``path``."""
    write_atomically(path, json.dumps(dataclasses.asdict(record), indent=2) + "\n")


def load_manifest(cls: type[Record], path: Path, missing: str, kind: str) -> Record:
    """The ``cls`` saved at ``path``; ``missing`` is the error when there is none, ``kind`` what the
    error calls the manifest when the file is not one."""
    if not path.is_file():
        raise UserError(missing)
    try:
        return cls(**json.loads(path.read_text()))
    except (TypeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path} is not a {kind}: {exc}") from None
