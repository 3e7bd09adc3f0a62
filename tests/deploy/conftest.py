"""Shared pieces for the deploy tests: a loopback device farm and CLI helpers.

Every process the farm starts listens on 127.0.0.1, exits by itself after its lifetime or when
this test process is gone, and is killed at teardown.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest

from tvm_memplan.cli.main import main
from tvm_memplan.deploy.rpc import LocalFarm, start_farm

FARM_LIFETIME_S = 3600  # the servers also exit when this test process is gone; a loaded CI run takes 25 min

needs_aarch64_gxx = pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-g++") is None,
    reason="aarch64-linux-gnu-g++ missing (Debian: g++-aarch64-linux-gnu)",
)


needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="arm-none-eabi-gcc or qemu-system-arm missing (.ci/run installs them)",
)
SPLIT_LIMIT = 6 * 1024
"""A memory limit below half of the unsplit int8 arena of :func:`models.early_activation` (11,520 bytes)."""


@pytest.fixture(scope="module")
def int8_model(tmp_path_factory) -> Path:
    """:func:`models.early_activation` quantized to int8 QDQ, saved: a model that splits into row tiles."""
    from ..quant import models

    path = tmp_path_factory.mktemp("int8") / "early.int8.onnx"
    onnx.save(models.quantize_qdq(models.early_activation()), str(path))
    return path


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def over_rpc(tracker: str, key: str, log) -> tuple[str, ...]:
    """``measure``'s options for a device behind ``tracker`` under ``key``, logging to ``log``."""
    return ("--rpc-tracker", tracker, "--rpc-key", key, "--log", str(log))


def run_cli_json(capsys, *argv: str) -> dict:
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="session")
def farm() -> LocalFarm:
    """A tracker and one server under key ``local`` for the whole session."""
    with start_farm({"local": 1}, lifetime=FARM_LIFETIME_S) as running:
        yield running
