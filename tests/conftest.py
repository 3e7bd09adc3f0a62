"""Opt-in test groups, switched on by environment variables (CI runs neither).

- ``@pytest.mark.arm64``: cross-built aarch64 code run under qemu (needs Debian's
  gcc-aarch64-linux-gnu, g++-aarch64-linux-gnu, qemu-user): ``TVM_MEMPLAN_RUN_ARM64=1``;
- ``@pytest.mark.tuning``: MetaSchedule tuning runs (minutes): ``TVM_MEMPLAN_RUN_TUNING=1``;
- ``@pytest.mark.mcu``: MobileNetV2 as standalone C on the emulated Cortex-M7 (needs
  gcc-arm-none-eabi, libnewlib-arm-none-eabi, qemu-system-arm; ~30 s): ``TVM_MEMPLAN_RUN_MCU=1``;
- ``@pytest.mark.timing``: checks that compare measured times (the LQ machine limits against the
  kernels); timed assertions stay out of CI, where other jobs share the cores:
  ``TVM_MEMPLAN_RUN_TIMING=1``.
"""

from __future__ import annotations

import os

import pytest

OPT_IN = {
    "arm64": "TVM_MEMPLAN_RUN_ARM64",
    "tuning": "TVM_MEMPLAN_RUN_TUNING",
    "mcu": "TVM_MEMPLAN_RUN_MCU",
    "timing": "TVM_MEMPLAN_RUN_TIMING",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for marker, variable in OPT_IN.items():
        if os.environ.get(variable) == "1":
            continue
        skip = pytest.mark.skip(reason=f"opt-in: set {variable}=1")
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)
