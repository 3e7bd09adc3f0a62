"""Where ``setup-gpu`` installs TVM's OpenCL and Vulkan runtimes, and loading them into this process.

The runtimes live in the user's data directory (``$XDG_DATA_HOME/tvm_memplan/tvm-<version>/lib`` on
Linux, via platformdirs), one folder per TVM version, so reinstalling or upgrading apache-tvm neither
deletes nor mixes them up. TVM only looks in its own ``tvm/lib``; :func:`load_installed` loads them
instead, at ``import tvm`` (the ``tvm.backends`` entry point) or at ``import tvm_memplan`` when TVM was
imported first. A runtime TVM already has (a GPU build of TVM, or an older copy in ``tvm/lib``) wins.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from ..paths import data_dir

BACKENDS = ("opencl", "vulkan")
LOAD_ERRORS: dict[str, str] = {}
"""Why an installed runtime did not load into this process (``setup-gpu`` reports it)."""


def runtime_lib_dir() -> Path:
    """The folder of the runtimes built for the installed TVM version."""
    import tvm

    return data_dir() / f"tvm-{tvm.__version__}" / "lib"


def runtime_file(backend: str) -> Path:
    return runtime_lib_dir() / f"libtvm_runtime_{backend}.so"


def has_runtime(backend: str) -> bool:
    """Whether TVM in this process has ``backend``'s device API (built in or loaded)."""
    import tvm_ffi

    return tvm_ffi.get_global_func(f"device_api.{backend}", allow_missing=True) is not None


def load_installed() -> None:
    """Load every installed runtime that TVM lacks; idempotent. A file that fails to load is skipped
    (TVM does the same with its own sidecars) and its reason kept in :data:`LOAD_ERRORS`."""
    import tvm.base

    for backend in BACKENDS:
        path = runtime_file(backend)
        if has_runtime(backend) or not path.is_file():
            continue
        try:
            # libtvm_runtime is loaded RTLD_GLOBAL; a runtime only registers its functions when loaded
            tvm.base._LOADED_LIBS[f"tvm_runtime_{backend}"] = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
            LOAD_ERRORS.pop(backend, None)
        except OSError as exc:
            LOAD_ERRORS[backend] = str(exc)
