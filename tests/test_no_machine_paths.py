"""No path of a development machine in what a clone holds: the package, its tests and CI find shared
inputs relative to the checkout, and the package keeps its own files in per-user folders."""

from __future__ import annotations

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
