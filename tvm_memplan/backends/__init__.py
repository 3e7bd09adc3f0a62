"""GPU backends for the installed TVM without rebuilding it.

The PyPI wheel ships TVM's OpenCL code generator but neither the OpenCL nor the Vulkan runtime:
:mod:`.sidecars` compiles those two runtimes from TVM's sources against the wheel into the user's data
directory, and :mod:`.runtimes` loads them at ``import tvm``; :mod:`.vulkan` adds a Vulkan code generator.
"""

from __future__ import annotations


def register() -> None:
    """The ``tvm.backends`` entry point that ``import tvm`` calls: load the runtimes ``setup-gpu``
    installed, and give a TVM without ``target.build.vulkan`` this package's Vulkan generator."""
    from . import runtimes, vulkan

    runtimes.load_installed()
    vulkan.register()
