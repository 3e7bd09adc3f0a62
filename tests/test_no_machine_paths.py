"""No path of a development machine in what a clone holds: the package, its tests and CI find shared
inputs relative to the checkout, and the package keeps its own files in per-user folders."""

from __future__ import annotations

import re
import subprocess

from .shared_inputs import REPO

DEVELOPMENT_ROOT = b"/" + b"work/"  # spelled in two pieces so that this file does not match itself


def test_no_file_names_a_development_machine_path():
    tracked = (
        subprocess.run(
            ["git", "ls-files", "-z", "tvm_memplan", "tests", ".ci", "pyproject.toml"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    files = [REPO / name for name in tracked if name]
    files += [path for path in (REPO / "tvm_memplan").rglob("*.py")]  # new files not yet committed
    assert len(files) > 50
    offenders = sorted(
        {str(path.relative_to(REPO)) for path in files if path.is_file() and DEVELOPMENT_ROOT in path.read_bytes()}
    )
    assert not offenders


def test_user_facing_text_names_techniques_not_our_source_files():
    """The README, results, design notes, tutorials and package docstrings name a technique and its paper,
    not the project's internal source documents ("seed 003", "field notes, section 4")."""
    internal = re.compile(rb"\bseed 00\d|\bfield notes\b", re.IGNORECASE)
    files = [REPO / "README.md", REPO / "results" / "README.md", *(REPO / "docs").glob("*.md")]
    files += [*(REPO / "tutorials").glob("*.ipynb"), *(REPO / "tvm_memplan").rglob("*.py")]
    offenders = sorted(str(path.relative_to(REPO)) for path in files if internal.search(path.read_bytes()))
    assert not offenders
