"""``target.build.vulkan`` for a TVM without its SPIR-V code generator: GLSL, glslangValidator, TVM's module.

Each device kernel is printed as GLSL (:mod:`.glsl`), compiled to SPIR-V by ``glslangValidator``
(Debian ``glslang-tools``) and packed into the module TVM's Vulkan runtime creates
(``ffi.Module.create.vulkan``), so ``export_library``, RPC upload and loading work as with TVM's own
code generator: the serialized form is the runtime's, not ours.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tvm
import tvm_ffi

from ...errors import UserError
from . import GLSLANG, RUNTIME_FACTORY, check_ready
from .glsl import Kernel, kernel_to_glsl, push_constant_bytes

SPIRV_ENV = "vulkan1.1"
"""What phones' Vulkan drivers (Mali, Adreno) and lavapipe all accept."""
DEVICE_KERNEL_LAUNCH = 2
"""``calling_conv`` of a kernel the host launches (TVM's ``kDeviceKernelLaunch``)."""


def compile_glsl(kernel: Kernel, scratch: Path) -> bytes:
    """SPIR-V words of ``kernel``, its entry point renamed to the kernel's name as the runtime looks it up."""
    source, binary = scratch / f"{kernel.name}.comp", scratch / f"{kernel.name}.spv"
    source.write_text(kernel.glsl)
    result = subprocess.run(
        [
            GLSLANG,
            "-V",
            "--target-env",
            SPIRV_ENV,
            "-S",
            "comp",
            "--source-entrypoint",
            "main",
            "-e",
            kernel.name,
            "-o",
            str(binary),
            str(source),
        ],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        errors = [line for line in result.stdout.splitlines() if "ERROR" in line] or result.stdout.splitlines()
        raise UserError(
            f"Vulkan code generator: glslangValidator rejected the GLSL of kernel {kernel.name}: "
            f"{errors[0].strip() if errors else result.returncode}"
        )
    return binary.read_bytes()


def shader_bytes(spirv: bytes) -> bytes:
    """TVM's serialized ``SPIRVShader``: a uint32 flag (0: scalars in push constants, never its uniform
    buffer), then the words as a uint64-counted vector."""
    return struct.pack("<IQ", 0, len(spirv) // 4) + spirv


def function_info(kernels: list[Kernel]):
    """The runtime's ``Map<String, FunctionInfo>``, made by its own JSON loader."""
    info = {
        k.name: {"name": k.name, "arg_types": k.arg_types, "launch_param_tags": k.launch_param_tags} for k in kernels
    }
    return tvm_ffi.get_global_func("runtime.LoadMetaDataFromJSON")(
        json.dumps({"tvm_version": tvm.__version__, "func_info": info})
    )


def device_kernels(mod: tvm.IRModule, target: tvm.target.Target) -> list[Kernel]:
    """Every function of the device module as GLSL."""
    limit = push_constant_bytes(target)
    kernels = []
    for gv, func in mod.functions.items():
        name = str(func.attrs.get("global_symbol", gv.name_hint)) if func.attrs else gv.name_hint
        if func.attrs is None or int(func.attrs.get("calling_conv", 0)) != DEVICE_KERNEL_LAUNCH:
            raise UserError(
                f"Vulkan code generator: {name} is a device function that is not a kernel (calls between "
                "device functions have no GLSL form here)"
            )
        kernels.append(kernel_to_glsl(name, func, limit))
    return kernels


def build_vulkan(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.runtime.Module:
    """``target.build.vulkan``: the device module as TVM's Vulkan runtime module."""
    check_ready()
    kernels = device_kernels(mod, target)
    with tempfile.TemporaryDirectory(prefix="tvm_memplan_vulkan_") as scratch:
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            binaries = list(pool.map(lambda k: compile_glsl(k, Path(scratch)), kernels))
    shaders = {k.name: shader_bytes(b) for k, b in zip(kernels, binaries, strict=True)}
    glsl = "\n".join(f"// kernel {k.name}\n{k.glsl}" for k in kernels)
    return tvm_ffi.get_global_func(RUNTIME_FACTORY)(shaders, "vulkan", function_info(kernels), {"glsl": glsl, "": glsl})
