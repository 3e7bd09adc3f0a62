"""Run the tutorial notebooks and store them with their outputs, so a reader sees results without running them.

    TVM_NUM_THREADS=2 python scripts/execute_tutorials.py [tutorials/05_fine_grained_splitting.ipynb ...]

Each notebook runs top to bottom in a fresh kernel inside a scratch directory (files it writes stay
out of the repository) and replaces the stored one only when every cell ran (atomic write).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"


def execute(notebook: Path, timeout: int = 1200) -> float:
    """Run ``notebook`` and write it back with its outputs; seconds taken."""
    nb = nbformat.read(notebook, as_version=4)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tutorial-") as scratch:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": scratch}}).execute()
    partial = notebook.with_suffix(".ipynb.partial")
    nbformat.write(nb, partial)
    partial.replace(notebook)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook in tutorials/")
    args = parser.parse_args(argv)
    for notebook in args.notebooks or sorted(TUTORIALS.glob("*.ipynb")):
        print(f"{notebook.name}: {execute(notebook):.0f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
