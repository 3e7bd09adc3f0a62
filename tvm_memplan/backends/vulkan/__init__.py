"""A Vulkan code generator for TVM builds without one (the PyPI wheel has no ``target.build.vulkan``).

:func:`register` installs :func:`.build.build_vulkan` as ``target.build.vulkan`` unless TVM already
has a builder (a TVM built with ``USE_VULKAN=ON`` keeps its own SPIR-V generator). It imports nothing
heavy, so ``import tvm`` can call it through the ``tvm.backends`` entry point and
:func:`tvm_memplan.pipeline` calls it for Vulkan targets.
"""

from __future__ import annotations

import shutil

import tvm_ffi

from ...errors import UserError

BUILDER = "target.build.vulkan"
GLSLANG = "glslangValidator"
GLSLANG_PACKAGE = "glslang-tools"
RUNTIME_FACTORY = "ffi.Module.create.vulkan"
"""Registered by TVM's Vulkan runtime (the sidecar ``tvm-memplan setup-gpu`` builds)."""
_registered = False


def _build(mod, target):
    from .build import build_vulkan

    return build_vulkan(mod, target)


def register() -> None:
    """Register the GLSL-based builder when this TVM has no Vulkan code generator; idempotent."""
    global _registered
    if not _registered and tvm_ffi.get_global_func(BUILDER, allow_missing=True) is None:
        tvm_ffi.register_global_func(BUILDER, _build)
        _registered = True


def is_ours() -> bool:
    """Whether ``target.build.vulkan`` is this package's generator (so it needs the runtime sidecar)."""
    return _registered


def check_ready(what: str = "vulkan") -> None:
    """Raise a one-line UserError when the generator cannot run: no Vulkan runtime, or no glslangValidator."""
    if tvm_ffi.get_global_func(RUNTIME_FACTORY, allow_missing=True) is None:
        raise UserError(
            f"target {what}: the installed TVM has no Vulkan runtime to hold the kernels: "
            "run tvm-memplan setup-gpu (Debian: libvulkan-dev mesa-vulkan-drivers glslang-tools)"
        )
    if shutil.which(GLSLANG) is None:
        raise UserError(f"target {what}: the Vulkan code generator needs {GLSLANG}: apt-get install {GLSLANG_PACKAGE}")
