"""Inputs too large for the repository, found in ``shared/`` beside the checkout (``../shared``, where CI
puts it) or inside it; tests that need them skip when neither is there."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    """``shared/`` inside the checkout if there is one, else ``../shared`` beside it (may not exist)."""
    inside = REPO / "shared"
    return inside if inside.is_dir() else REPO.parent / "shared"


MINIMALLOC_CHALLENGING = shared_dir() / "benchmarks" / "minimalloc-challenging"
"""MiniMalloc's challenging instances."""


def tvm_source() -> Path:
    """The TVM source tree for setup-gpu: ``$TVM_MEMPLAN_TVM_SRC``, else the shared source kit."""
    given = os.environ.get("TVM_MEMPLAN_TVM_SRC")
    return Path(given) if given else shared_dir() / "third_party" / "tvm-gpu-runtime-src"
