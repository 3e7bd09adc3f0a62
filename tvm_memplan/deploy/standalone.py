"""Run the standalone C of ``build --emit-c DIR`` and measure it: on this machine, or on an emulated
Cortex-M (qemu-system-arm with semihosting and ``-icount``).

What comes back is checked against onnxruntime and measured from the binary itself: the arena's
size is its ELF symbol's, flash is ``.vectors + .text + .ARM.exidx + .rodata + .data`` (the .data
image), SRAM is ``.data + .bss`` plus the stack high-water mark the firmware finds in its painted
stack, and the cost is instructions retired under ``-icount shift=0`` (one instruction per virtual
nanosecond), read from SysTick and converted with a calibration loop of known length.
"""

from __future__ import annotations

import datetime
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError
from ..frontend import load_model
from .mcu import ModelC
from .measure import compare_outputs, int8_allowed, reference_outputs
from .targets import McuBoard, get_target

DEVICES = {"host": None, "qemu-cortex-m7": "cortex-m7", "qemu-cortex-m4": "cortex-m4", "qemu-cortex-m55": "cortex-m55"}
"""Device name -> the target whose board it emulates (None: this machine)."""
FLASH_SECTIONS = (".vectors", ".text", ".ARM.exidx", ".rodata", ".data")
SRAM_SECTIONS = (".data", ".bss", ".memplan_arena")
_LINE = re.compile(
    r"^MEMPLAN status=(\d+) ticks=(\d+) calib_ticks=(\d+) calib_instructions=(\d+) stack_used=(\d+) stack_size=(\d+)",
    re.M,
)
_ARM_PACKAGES = "Debian: apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm"


def qemu_command(machine: str, kernel: str) -> list[str]:
    """qemu-system-arm running ``kernel`` (an ELF) on board ``machine`` with semihosting for its I/O and
    ``-icount shift=0``: one instruction per virtual nanosecond, so counts are deterministic."""
    return [
        "qemu-system-arm",
        "-M",
        machine,
        "-nographic",
        "-monitor",
        "none",
        "-serial",
        "none",
        "-semihosting-config",
        "enable=on,target=native",
        "-icount",
        "shift=0,sleep=off",
        "-kernel",
        kernel,
    ]


@dataclass
class CMeasurement:
    """The standalone C of one model run once on one device."""

    correct: bool
    max_abs_diff: float
    arena_bytes: int
    """Size of ``memplan_arena`` in the built binary (its ELF symbol)."""
    sram_bytes: int | None
    flash_bytes: int | None
    instructions: int | None
    model: str
    device: str
    planned_arena_bytes: int
    tvm_default_bytes: int
    naive_bytes: int
    workspace_bytes: int
    weight_bytes: int
    stack_bytes: int | None
    sections: dict[str, int]
    kernel_calls: int
    reference: str
    error: str | None = None
    tolerance: float | None = None
    """For an int8 (QDQ) model: the absolute difference allowed, onnxruntime's own optimized vs
    unoptimized spread in output LSB (at least 2 LSB); None: the float tolerance."""
    spread: float | None = None
    """For an int8 (QDQ) model: onnxruntime's own optimized vs unoptimized spread on these inputs, as an
    absolute difference (the largest over the outputs), without the 2-LSB floor of ``tolerance``."""
    spread_lsb: int | None = None
    """The same spread in output LSB."""
    diff_lsb: int | None = None
    """For an int8 (QDQ) model: the largest difference to onnxruntime's default run, in output LSB (the
    issue's rule for a network: at most ``spread_lsb``)."""
    kernels: list[dict[str, Any]] | None = None
    """With ``per_kernel``: per call of ``<name>_run``, its step, kernel and instructions (from the
    profiling build, which reads the counter after every kernel; every figure above is that build's)."""
    time: str = field(
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    )

    def summary(self) -> dict[str, Any]:
        return asdict(self)


def _require(tools: list[str], hint: str) -> None:
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        raise UserError(f"{', '.join(missing)} not found ({hint})")


def _board_for(device: str, model_c: ModelC) -> McuBoard | None:
    if device not in DEVICES:
        raise UserError(f"unknown device {device!r}; known: {', '.join(DEVICES)}")
    if DEVICES[device] is None:
        return None
    board = get_target(DEVICES[device]).board
    written = get_target(model_c.target).board
    if written is None or written.cpu != board.cpu:
        raise UserError(
            f"the C in this directory was written for {model_c.target}; write it again with "
            f"build --target {DEVICES[device]} --emit-c DIR to run it on {device}"
        )
    return board


def _run(command: list[str], cwd: Path, timeout: float, what: str) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise UserError(f"{what} did not finish within {timeout:.0f} s") from None
    if result.returncode != 0 and what.startswith("building"):
        lines = [line for line in (result.stderr + result.stdout).splitlines() if "error" in line.lower()]
        raise UserError(f"{what} failed: {(lines or (result.stderr + result.stdout).splitlines() or ['?'])[0].strip()}")
    return result


def section_sizes(binary: Path, size_tool: str) -> dict[str, int]:
    """``{section: bytes}`` from ``size -A``."""
    text = subprocess.run([size_tool, "-A", "-d", str(binary)], capture_output=True, text=True, check=True).stdout
    sizes = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].startswith(".") and parts[1].isdigit():
            sizes[parts[0]] = int(parts[1])
    return sizes


def symbol_size(binary: Path, nm_tool: str, symbol: str) -> int:
    """Size of ``symbol`` in ``binary`` (0 when it is absent: a model with no intermediate tensors)."""
    text = subprocess.run([nm_tool, "-S", str(binary)], capture_output=True, text=True, check=True).stdout
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[3] == symbol:
            return int(parts[1], 16)
    return 0


def measure_c(
    directory: str | Path, device: str = "host", timeout: float = 600.0, per_kernel: bool = False
) -> CMeasurement:
    """Build the C in ``directory`` for ``device``, run it once on the model's seeded inputs, and
    check and measure it (see the module docstring). ``per_kernel``: build ``model_profile.elf``,
    which also reads the counter after every kernel, and give each kernel's instructions."""
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"no such directory: {directory}")
    model_c = ModelC.load(directory)
    board = _board_for(device, model_c)
    if per_kernel and (board is None or not model_c.kernel_names):
        raise UserError(
            "per-kernel instructions need an emulated device (--device qemu-cortex-m7, ...) and C "
            "written by this version of build --emit-c"
        )
    if board is None:
        _require(["make", "cc", "size", "nm"], "install make and a C compiler (Debian: build-essential)")
        binary, tools = directory / "model_host", ("size", "nm")
        build_cmd = ["make", "-s", "model_host"]
    else:
        _require(["make", "arm-none-eabi-gcc", "qemu-system-arm"], _ARM_PACKAGES)
        binary, tools = (
            directory / ("model_profile.elf" if per_kernel else "model.elf"),
            ("arm-none-eabi-size", "arm-none-eabi-nm"),
        )
        build_cmd = ["make", "-s", binary.name]
        (directory / "profile.bin").unlink(missing_ok=True)
    model = load_model(model_c.model)
    inputs = model.random_inputs(0)
    if len(inputs) != len(model_c.inputs):
        raise UserError(f"{model_c.model} has {len(inputs)} inputs but the C takes {len(model_c.inputs)}")
    for spec, array in zip(model_c.inputs, inputs.values(), strict=True):
        np.ascontiguousarray(array, dtype=spec["dtype"]).tofile(directory / spec["file"])
    for spec in model_c.outputs:
        (directory / spec["file"]).unlink(missing_ok=True)
    _run(build_cmd, directory, timeout, f"building {binary.name}")
    if board is None:
        run_cmd = [str(binary.resolve())]
    else:
        run_cmd = qemu_command(board.machine, binary.name)
    result = _run(run_cmd, directory, timeout, f"running {binary.name} on {device}")
    printed = result.stdout + result.stderr  # qemu writes semihosting text to stderr
    found = _LINE.search(printed)
    if found is None:
        lines = (result.stderr + result.stdout).strip().splitlines()
        raise UserError(
            f"{binary.name} on {device} printed no result (exit {result.returncode}): {(lines or ['no output'])[-1]}"
        )
    status, ticks, calib_ticks, calib_instructions, stack_used, _ = (int(v) for v in found.groups())
    error = next(
        (line.removeprefix("MEMPLAN error: ") for line in printed.splitlines() if line.startswith("MEMPLAN error: ")),
        None,
    )
    reference, reference_name = reference_outputs(model, inputs)
    allowed = int8_allowed(model, inputs, (reference, reference_name))
    diff_lsb = None
    atols = [t.atol for t in allowed] if allowed else None
    if status == 0:
        outputs = [
            np.fromfile(directory / spec["file"], dtype=spec["dtype"]).reshape(spec["shape"])
            for spec in model_c.outputs
        ]
        correct, worst = compare_outputs(outputs, [np.asarray(r) for r in reference], atols)
        if allowed:
            from ..quant.reference import lsb_difference

            compared = zip(outputs, reference, allowed, strict=True)
            diff_lsb = max(lsb_difference(o, np.asarray(r), t.scale) for o, r, t in compared)
    else:
        correct, worst = False, float("inf")
        error = error or f"{model_c.name}_run returned {status}"
    sections = section_sizes(binary, tools[0])
    embedded = board is not None
    kernels = (
        _kernel_instructions(directory / "profile.bin", model_c, calib_instructions / calib_ticks)
        if per_kernel and status == 0 and calib_ticks
        else None
    )
    return CMeasurement(
        correct=correct,
        max_abs_diff=worst,
        arena_bytes=symbol_size(binary, tools[1], "memplan_arena"),
        sram_bytes=sum(sections.get(s, 0) for s in SRAM_SECTIONS) + stack_used if embedded else None,
        flash_bytes=sum(sections.get(s, 0) for s in FLASH_SECTIONS) if embedded else None,
        instructions=round(ticks * calib_instructions / calib_ticks) if embedded and calib_ticks else None,
        model=model_c.model,
        device=device,
        planned_arena_bytes=model_c.arena_bytes,
        **model_c.figures(),
        stack_bytes=stack_used if embedded else None,
        sections={k: v for k, v in sections.items() if k in FLASH_SECTIONS + SRAM_SECTIONS + (".stack",)},
        reference=reference_name,
        error=error,
        tolerance=max(atols) if atols else None,
        spread=max(t.spread_lsb * t.scale for t in allowed) if allowed else None,
        spread_lsb=max(t.spread_lsb for t in allowed) if allowed else None,
        diff_lsb=diff_lsb,
        kernels=kernels,
    )


def _kernel_instructions(profile: Path, model_c: ModelC, per_tick: float) -> list[dict[str, Any]]:
    """Each kernel's instructions from the counter values the profiling build wrote after every kernel."""
    after = np.fromfile(profile, dtype=np.uint64).astype(np.int64) if profile.is_file() else np.zeros(0, np.int64)
    if after.size != len(model_c.kernel_names):
        raise UserError(f"{profile} holds {after.size} counter values for {len(model_c.kernel_names)} kernel calls")
    ticks = np.diff(after, prepend=0)
    return [
        {"step": step, "kernel": kernel, "instructions": round(int(t) * per_tick)}
        for step, (kernel, t) in enumerate(zip(model_c.kernel_names, ticks, strict=True), 1)
    ]
