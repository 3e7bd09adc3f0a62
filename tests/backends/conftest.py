"""Skips for the GPU backend tests: they need the runtime sidecars and a software device."""

from __future__ import annotations

import pytest

from tvm_memplan.backends.sidecars import SIDECARS, device_exists, runtime_loaded


def device_ready(backend: str) -> bool:
    return runtime_loaded(backend) and device_exists(backend)


def needs_device(backend: str) -> pytest.MarkDecorator:
    sidecar = SIDECARS[backend]
    return pytest.mark.skipif(
        not device_ready(backend),
        reason=f"no {sidecar.title} device: run tvm-memplan setup-gpu (Debian: {sidecar.header_package} "
        f"{sidecar.library_package} and {sidecar.driver_package})",
    )
