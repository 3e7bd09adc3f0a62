"""Runs ``scripts/<name>`` as a user runs it, for the tests of the benchmark and tool scripts."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_script(
    name: str, *args: str, timeout: int = 600, returncode: int = 0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python scripts/<name> ARGS``; its exit status is asserted (0 unless told), stderr shown if not."""
    command = [sys.executable, str(ROOT / "scripts" / name), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    assert done.returncode == returncode, done.stderr[-3000:]
    return done
