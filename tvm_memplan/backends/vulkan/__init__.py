"""A Vulkan code generator for TVM builds without one (the PyPI wheel has no ``target.build.vulkan``).

:func:`register` installs :func:`.build.build_vulkan` as ``target.build.vulkan`` unless TVM already
has a builder (a TVM built with ``USE_VULKAN=ON`` keeps its own SPIR-V generator). It imports nothing
heavy, so ``import tvm`` can call it through the ``tvm.backends`` entry point and
:func:`tvm_memplan.pipeline` calls it for Vulkan targets.
"""

from __future__ import annotations

import tvm_ffi

BUILDER = "target.build.vulkan"
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
