"""Named deployment targets: the TVM target, how the artifact is compiled, and what runs it.

TVM 0.27 wants target dicts (strings with options are rejected) and knows nothing of cross
compilers, so each name here bundles the target with the compiler that links the artifact.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from typing import Any

import tvm

from ..backends import vulkan as vulkan_codegen
from ..backends.sidecars import SIDECARS, device_exists, runtime_loaded
from ..errors import UserError

# num-cores: MetaSchedule needs it; 4 is a phone's big cluster (used only to tune for it).
_AARCH64_LLVM = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"], "num-cores": 4}
_AARCH64_DOTPROD_LLVM = {**_AARCH64_LLVM, "mattr": ["+neon", "+dotprod"]}
_AARCH64_CXX = "aarch64-linux-gnu-g++"
_ANDROID_LLVM = {"kind": "llvm", "mtriple": "aarch64-linux-android", "mattr": ["+neon"], "num-cores": 4}
_ANDROID_CXX = "aarch64-linux-android28-clang++"
"""The Android NDK's compiler for API 28; its toolchains/llvm/prebuilt/*/bin must be on PATH."""
DEFAULT_CUDA_ARCH = "sm_75"
"""CUDA arch when building without a GPU: the oldest that CUDA 11 to 13 all compile for."""


@dataclass(frozen=True)
class McuBoard:
    """A Cortex-M core, the qemu-system-arm board that emulates it, and that board's memory map
    as the linker script uses it (code, constants, RAM)."""

    cpu: str
    cpu_flags: str
    board: str
    machine: str
    flash_origin: int
    flash_length: int
    rodata_name: str
    rodata_origin: int
    rodata_length: int
    ram_name: str
    ram_origin: int
    ram_length: int
    stack_size: int = 0x10000


_MIB = 1 << 20
# qemu-system-arm 7.2 memory maps ('info mtree'): MPS2 boards have 4 MiB SSRAM1 at 0 (code),
# 4 MiB SSRAM2/3 at 0x20000000 (RAM) and 16 MiB more RAM (0x60000000 on AN500, 0x21000000 on AN386)
# that holds the weights; AN547 (SSE-300) has 512 KiB ITCM at 0, 512 KiB DTCM at 0x20000000 and DDR.
CORTEX_M7 = McuBoard(
    "cortex-m7",
    "-mcpu=cortex-m7 -mthumb -mfpu=fpv5-d16 -mfloat-abi=hard",
    "MPS2 AN500",
    "mps2-an500",
    0,
    4 * _MIB,
    "PSRAM",
    0x60000000,
    16 * _MIB,
    "SSRAM2/3",
    0x20000000,
    4 * _MIB,
)
CORTEX_M4 = McuBoard(
    "cortex-m4",
    "-mcpu=cortex-m4 -mthumb -mfpu=fpv4-sp-d16 -mfloat-abi=hard",
    "MPS2 AN386",
    "mps2-an386",
    0,
    4 * _MIB,
    "PSRAM",
    0x21000000,
    16 * _MIB,
    "SSRAM2/3",
    0x20000000,
    4 * _MIB,
)
CORTEX_M55 = McuBoard(
    "cortex-m55",
    "-mcpu=cortex-m55 -mthumb -mfloat-abi=hard",
    "MPS3 AN547",
    "mps3-an547",
    0,
    512 * 1024,
    "DDR",
    0x70000000,
    256 * _MIB,
    "ISRAM",
    0x31000000,
    4 * _MIB,
)


@dataclass(frozen=True)
class DeployTarget:
    """A named target: TVM target config, the device that runs it, and how to link the artifact."""

    name: str
    config: dict[str, Any] | None
    """TVM target config; None means this machine's CPU (``Target.from_device``)."""
    device: str
    """TVM device name the artifact runs on: cpu, cuda, vulkan, opencl."""
    cross_compiler: str | None = None
    """C++ compiler that links the artifact for another architecture (None: the host's)."""
    what: str = ""
    board: McuBoard | None = None
    """For microcontroller targets: the core and emulated board the standalone C is built for."""

    @property
    def is_mcu(self) -> bool:
        """Targets with no VM: only ``build --emit-c`` makes sense for them."""
        return self.board is not None and self.device == "mcu"

    @property
    def kind(self) -> str:
        return self.config["kind"] if self.config else "llvm"

    @property
    def is_c(self) -> bool:
        return self.kind == "c"

    def tvm_target(self) -> tvm.target.Target:
        """The TVM target (``host``: this CPU with its core count, which MetaSchedule needs)."""
        if self.config is None:
            config = json.loads(str(tvm.target.Target.from_device("cpu")))
            config["num-cores"] = os.cpu_count() or 1
        else:
            config = dict(self.config)
        if config["kind"] == "cuda" and not tvm.cuda().exist:
            # TVM reads the arch from the GPU; without one it falls back to sm_50, which CUDA 13 dropped.
            config["arch"] = DEFAULT_CUDA_ARCH
        return tvm.target.Target(config)

    def check_codegen(self) -> None:
        """Raise a one-line UserError when this TVM build cannot generate code for the target."""
        builder = f"target.build.{self.kind}"
        if self.kind == "vulkan":
            vulkan_codegen.register()
            if vulkan_codegen.is_ours():
                vulkan_codegen.check_ready(self.name)
        if tvm.get_global_func(builder, allow_missing=True) is None:
            flag = f"USE_{self.kind.upper()}"
            raise UserError(
                f"target {self.name}: the installed TVM {tvm.__version__} has no {self.kind} code generator "
                f"({builder} missing; it was built with {flag}=OFF): install a TVM built with {flag}=ON"
            )
        if self.cross_compiler and shutil.which(self.cross_compiler) is None:
            hint = (
                "put the Android NDK's toolchains/llvm/prebuilt/linux-x86_64/bin on PATH"
                if "android" in self.cross_compiler
                else "Debian: apt-get install g++-aarch64-linux-gnu"
            )
            raise UserError(
                f"target {self.name}: cross compiler {self.cross_compiler} not found ({hint}), "
                "or name another with --cross-compiler"
            )
        if self.kind == "cuda":
            problem = cuda_compiler_problem()
            if problem:
                raise UserError(f"target {self.name}: {problem}")

    def runtime_problem(self) -> str | None:
        """Why this machine cannot run the artifact, or None when it can."""
        if self.is_mcu:
            return (
                f"target {self.name} has no VM: write the C with build --emit-c DIR, then run it with "
                f"tvm-memplan measure DIR --device qemu-{self.name}"
            )
        if self.device in SIDECARS and not runtime_loaded(self.device):
            return (
                f"target {self.name}: the installed TVM has no {SIDECARS[self.device].title} runtime: "
                "build it with tvm-memplan setup-gpu, or run the artifact through --rpc-tracker/--rpc-key"
            )
        if self.device != "cpu" and not device_exists(self.device):
            return (
                f"target {self.name}: no {self.device} device on this machine (the installed TVM has no "
                f"{self.device} runtime or no driver loads it): run the artifact through --rpc-tracker/--rpc-key"
            )
        if self.cross_compiler:
            return (
                f"target {self.name} is linked by {self.cross_compiler} for another machine: "
                "run it there through --rpc-tracker/--rpc-key"
            )
        return None

    def export(self, executable: tvm.runtime.Executable, path: str) -> None:
        """Link ``executable`` into a shared library at ``path``."""
        options = ["-O2"] if self.is_c else None  # the C target compiles at -O0 without it
        fcompile = None
        if self.cross_compiler:
            # C sources carry no triple: export_library asks the compiler (-dumpmachine) instead.
            fcompile = tvm.support.cc.cross_compiler(
                self.cross_compiler,
                output_format="so",
                get_target_triple=tvm.support.cc.get_target_by_dump_machine(self.cross_compiler),
            )
        executable.export_library(path, fcompile=fcompile, options=options)


def cuda_compiler_problem() -> str | None:
    """Why TVM cannot compile CUDA kernels here, or None.

    Where TVM's CUDA runtime is loaded (a driver is installed), the build compiles the kernels through
    ``tvm_callback_cuda_compile``: with NVRTC from the cuda-bindings package unless TVM_CUDA_COMPILE_MODE=nvcc
    asks for the toolkit's nvcc (both ran on an H200, results/bench_gpu_cuda.md). Without that runtime the
    artifact keeps CUDA source instead; nvcc is still required there, as before, since that path was not run
    on a GPU."""
    if _cuda_runtime_loaded() and os.environ.get("TVM_CUDA_COMPILE_MODE", "nvrtc").lower() != "nvcc":
        if not _cuda_bindings_installed():
            return (
                "TVM compiles CUDA kernels with NVRTC from the cuda-bindings package, which is not installed: "
                "pip install 'tvm_memplan[cuda]' (cuda-bindings), "
                "or set TVM_CUDA_COMPILE_MODE=nvcc to use the CUDA toolkit's nvcc"
            )
        return None
    if shutil.which("nvcc") is None:
        return "nvcc not found: TVM compiles CUDA kernels with the CUDA toolkit's nvcc"
    return None


def _cuda_runtime_loaded() -> bool:
    """Whether TVM's CUDA runtime loaded (libtvm_runtime_cuda found libcudart and the driver's libcuda)."""
    return tvm.get_global_func("device_api.cuda", allow_missing=True) is not None


def _cuda_bindings_installed() -> bool:
    return importlib.util.find_spec("cuda") is not None and importlib.util.find_spec("cuda.bindings") is not None


def _opencl(device: str) -> dict[str, Any]:
    config: dict[str, Any] = {"kind": "opencl", "device": device, "host": _AARCH64_LLVM}
    if device == "adreno":
        config["keys"] = ["adreno", "opencl", "gpu"]  # selects TVM's Adreno Relax pipeline
    return config


def _mcu(board: McuBoard) -> DeployTarget:
    """The standalone C target named after ``board``'s core."""
    what = f"{board.cpu.replace('cortex-m', 'Cortex-M')} standalone C (--emit-c; qemu {board.machine})"
    return DeployTarget(board.cpu, {"kind": "c", "mcpu": board.cpu}, "mcu", what=what, board=board)


TARGETS: dict[str, DeployTarget] = {
    t.name: t
    for t in (
        DeployTarget("host", None, "cpu", what="this machine's CPU (LLVM, Target.from_device)"),
        DeployTarget(
            "x86-64",
            {"kind": "llvm", "mcpu": "x86-64"},
            "cpu",
            what="any x86-64 CPU (LLVM, baseline instructions only)",
        ),
        DeployTarget("llvm-aarch64", _AARCH64_LLVM, "cpu", _AARCH64_CXX, "arm64 Linux CPU (LLVM + NEON), cross-linked"),
        DeployTarget(
            "llvm-aarch64-dotprod",
            _AARCH64_DOTPROD_LLVM,
            "cpu",
            _AARCH64_CXX,
            "arm64 Linux CPU with Armv8.2's dot product (Cortex-A55/A76 and later): int8 convolutions use sdot",
        ),
        DeployTarget(
            "android-arm64", _ANDROID_LLVM, "cpu", _ANDROID_CXX, "Android phone CPU (LLVM + NEON), linked by the NDK"
        ),
        DeployTarget("c", {"kind": "c"}, "cpu", what="C source compiled with -O2 on this machine, bytecode VM"),
        DeployTarget("c-aarch64", {"kind": "c"}, "cpu", _AARCH64_CXX, "C source cross-compiled -O2 for arm64 Linux"),
        DeployTarget(
            "c-standalone",
            {"kind": "c"},
            "cpu",
            what="the whole model as standalone C (--emit-c), built for this machine",
            board=CORTEX_M7,
        ),
        *(_mcu(board) for board in (CORTEX_M7, CORTEX_M4, CORTEX_M55)),
        DeployTarget(
            "cuda",
            {"kind": "cuda", "host": "llvm"},
            "cuda",
            what="NVIDIA GPU (CUDA; kernels compiled by NVRTC from cuda-bindings, or nvcc)",
        ),
        DeployTarget(
            "vulkan",
            {"kind": "vulkan", "host": "llvm"},
            "vulkan",
            what="Vulkan device on this machine (lavapipe runs it on the CPU; tvm-memplan setup-gpu, glslang-tools)",
        ),
        DeployTarget(
            "vulkan-arm64",
            {"kind": "vulkan", "host": _AARCH64_LLVM},
            "vulkan",
            _AARCH64_CXX,
            "Vulkan GPU on an arm64 phone or board (Mali, Adreno); the NDK's clang with --cross-compiler",
        ),
        DeployTarget(
            "opencl",
            {"kind": "opencl", "host": "llvm"},
            "opencl",
            what="OpenCL device on this machine (PoCL runs it on the CPU; tvm-memplan setup-gpu)",
        ),
        DeployTarget("opencl-mali", _opencl("mali"), "opencl", _AARCH64_CXX, "Arm Mali GPU on an arm64 phone (OpenCL)"),
        DeployTarget(
            "opencl-adreno", _opencl("adreno"), "opencl", _AARCH64_CXX, "Qualcomm Adreno GPU on an arm64 phone (OpenCL)"
        ),
    )
}


_DEVICE_OF_KIND = {"llvm": "cpu", "c": "cpu", "cuda": "cuda", "vulkan": "vulkan", "opencl": "opencl"}


def get_target(name: str, cross_compiler: str | None = None) -> DeployTarget:
    """The named target, or one from a TVM target (a kind such as ``llvm`` or a JSON dict), linked by
    ``cross_compiler`` when given; a one-line UserError for anything else."""
    target = TARGETS.get(name) or _from_tvm_target(name)
    return dataclasses.replace(target, cross_compiler=cross_compiler) if cross_compiler else target


def _from_tvm_target(text: str) -> DeployTarget:
    """A TVM target (``llvm``, ``{"kind": "llvm", "mcpu": "skylake"}``), built and linked for this machine."""
    try:
        config = json.loads(text) if text.lstrip().startswith("{") else json.loads(str(tvm.target.Target(text)))
        kind = tvm.target.Target(config).kind.name
    except Exception as exc:  # noqa: BLE001 - json and TVM raise several types for a bad target
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(
            f"unknown target {text!r}: not one of {', '.join(TARGETS)}, nor a TVM target ({reason})"
        ) from None
    if kind not in _DEVICE_OF_KIND:
        raise UserError(f"target {text!r}: kind {kind} is not supported (supported: {', '.join(_DEVICE_OF_KIND)})")
    return DeployTarget(text, config, _DEVICE_OF_KIND[kind], what=f"TVM target {text}")
