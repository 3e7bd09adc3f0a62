"""Memory and cost of whole models as standalone C on emulated Cortex-M cores, as a Markdown table.

    python scripts/bench_mcu.py --out results/bench_mcu.md

Each row is ``build --target CPU --emit-c`` then ``measure DIR --device qemu-CPU``: the arena is the
size of ``memplan_arena`` in the linked ELF, SRAM is ``.data + .bss`` plus the measured stack
high-water mark, flash is ``.text + .rodata + .data``, instructions are counted under
``qemu -icount``. Split rows first run the fine-grained split search (``--split acg``) with the
SRAM budget as its memory limit. Needs gcc-arm-none-eabi, libnewlib-arm-none-eabi, qemu-system-arm.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from tvm_memplan.deploy.emit_c import emit_c
from tvm_memplan.deploy.split import search_split
from tvm_memplan.deploy.standalone import measure_c
from tvm_memplan.frontend import load_model

SRAM_LIMIT = 512 * 1024
FLASH_LIMIT = 2 * 1024 * 1024
"""STM32F767 (seed 003): 512 KiB SRAM, 2 MiB flash."""
RESERVE = 16 * 1024
"""SRAM left to kernel scratch, stack and runtime when a split plan is searched for the arena."""
SPLIT_LIMIT = SRAM_LIMIT - RESERVE
ROWS = [
    ("zoo:mcu_cnn", "cortex-m7", None),
    ("zoo:mcu_cnn", "cortex-m4", None),
    ("zoo:mcu_cnn", "cortex-m55", None),
    ("zoo:mobilenet_v2?width=0.35&resolution=96", "cortex-m7", None),
    ("zoo:mobilenet_v2?width=0.35&resolution=144", "cortex-m7", None),
    ("zoo:mobilenet_v2?width=0.35&resolution=144", "cortex-m7", SPLIT_LIMIT),
]
"""(model, core, memory limit of the split search or None for no split)."""


def kib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 1024:,.1f}"


def row(spec: str, cpu: str, split_limit: int | None, scratch: Path, search_seconds: float) -> str:
    options = {}
    if split_limit is not None:
        # latencies of the split candidates are measured with the same C kernels on this machine
        outcome = search_split(load_model(spec), "c", memory_limit=split_limit, seconds=search_seconds)
        options["prepare"] = outcome.prepare()
    directory = scratch / f"{cpu}-{abs(hash((spec, split_limit)))}"
    emitted = emit_c(spec, directory, cpu, **options).model
    result = measure_c(directory, f"qemu-{cpu}")
    io_bytes = sum(int(np.prod(t["shape"])) * np.dtype(t["dtype"]).itemsize for t in emitted.inputs + emitted.outputs)
    without_io = result.sram_bytes - io_bytes
    cells = [
        spec.removeprefix("zoo:") + (f" + split ≤ {split_limit // 1024} KiB" if split_limit else ""),
        cpu, kib(result.arena_bytes),
        "yes" if result.arena_bytes == emitted.arena_bytes else "NO", kib(emitted.tvm_default_bytes),
        kib(emitted.naive_bytes), kib(emitted.workspace_bytes), kib(result.stack_bytes), kib(io_bytes),
        kib(result.sram_bytes), kib(without_io), kib(result.flash_bytes), kib(emitted.weight_bytes),
        f"{result.instructions / 1e6:,.1f}", f"{result.max_abs_diff:.1e}" if result.correct else "NO",
        "yes" if without_io <= SRAM_LIMIT else "no", "yes" if result.flash_bytes <= FLASH_LIMIT else "no",
    ]
    return "| " + " | ".join(cells) + " |\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/bench_mcu.md"))
    parser.add_argument("--search-seconds", type=float, default=60.0, help="split search time limit")
    args = parser.parse_args()
    header = (
        "# Whole models as standalone C on emulated Cortex-M (qemu-system-arm)\n\n"
        "KiB unless noted; float32 weights and activations, batch 1. `arena` is `memplan_arena` in the linked ELF "
        "(`= plan`: equal to the planned arena byte for byte); TVM default = StaticPlanBlockMemory on the same "
        "kernels; naive = every intermediate in its own buffer. SRAM = .data + .bss + measured stack "
        "high-water; it includes the harness's input/output buffers (`I/O`), which the model's caller owns, "
        "so `SRAM - I/O` is what the model itself needs. Flash = .text + .rodata + .data image. "
        "Instructions: retired under `-icount shift=0` (SysTick, calibrated). Split rows: `--split acg` searched "
        f"for an arena of at most {SPLIT_LIMIT // 1024} KiB ({RESERVE // 1024} KiB left to kernel scratch and stack). "
        f"`fits` compares with an STM32F767 (seed 003): {SRAM_LIMIT // 1024} KiB SRAM (`SRAM - I/O`), "
        f"{FLASH_LIMIT // 1024 // 1024} MiB flash. `max abs diff`: largest absolute difference to onnxruntime.\n\n"
        "Written by `python scripts/bench_mcu.py --out results/bench_mcu.md`.\n\n"
        "| model | core | arena | = plan | TVM default | naive | kernel scratch | stack | I/O | SRAM | SRAM - I/O "
        "| flash | weights | instructions (M) | max abs diff | fits SRAM | fits flash |\n"
        "|---|---|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|:---:|\n"
    )
    lines = [header]
    with tempfile.TemporaryDirectory(prefix="bench-mcu-") as scratch:
        for spec, cpu, split_limit in ROWS:
            lines.append(row(spec, cpu, split_limit, Path(scratch), args.search_seconds))
            print(lines[-1], end="", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
