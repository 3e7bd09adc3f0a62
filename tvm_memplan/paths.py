"""Where tvm_memplan keeps files of its own: per-user folders from platformdirs (the XDG base directories
on Linux: ``$XDG_DATA_HOME``, ``$XDG_CACHE_HOME``), never the current directory or TVM's package."""

from __future__ import annotations

from pathlib import Path

import platformdirs

APP = "tvm_memplan"


def data_dir() -> Path:
    """Files that cannot be made again cheaply: the GPU runtimes ``setup-gpu`` builds."""
    return platformdirs.user_data_path(APP, appauthor=False)


def cache_dir() -> Path:
    """Files that can be deleted at any time: measured latencies, trained demo models."""
    return platformdirs.user_cache_path(APP, appauthor=False)
