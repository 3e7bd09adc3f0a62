"""``tvm-memplan setup-gpu``: give the installed TVM its OpenCL and Vulkan runtimes."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from ..errors import UserError
from .format import console, print_json, progress_display
from .vocabulary import add_command


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..backends.sidecars import HOW_TO_GET_SOURCE, SIDECARS, SOURCE_ENV

    setup = add_command(subparsers, "setup-gpu", run_setup_gpu)
    setup.add_argument(
        "--tvm-src",
        metavar="DIR",
        help=f"TVM v0.27 source tree (default ${SOURCE_ENV}); to get one: {HOW_TO_GET_SOURCE.split(', then')[0]}",
    )
    setup.add_argument(
        "--backend", action="append", choices=list(SIDECARS), help="only this runtime (repeatable; default all)"
    )
    setup.add_argument("--jobs", type=int, metavar="N", help="parallel compiler processes (default: CPU count)")
    setup.add_argument("--force", action="store_true", help="rebuild even when the installed runtime is up to date")
    setup.add_argument("--json", action="store_true", help="print one JSON object")


def run_setup_gpu(args: argparse.Namespace) -> int:
    """build TVM's OpenCL and Vulkan runtimes for the installed TVM and list the devices

    Compile TVM's OpenCL and Vulkan runtimes (which the apache-tvm wheel ships without) from TVM v0.27's source
    against the installed wheel, into your data directory (~/.local/share/tvm_memplan on Linux), where 'import tvm'
    loads them; skipped when already up to date. Needs Debian g++, opencl-headers, ocl-icd-opencl-dev,
    libvulkan-dev; a device needs a driver (pocl-opencl-icd and mesa-vulkan-drivers run on the CPU)."""
    from ..backends.sidecars import setup_gpu

    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {args.jobs}")
    with progress_display() as bar:
        tasks: dict[str, int] = {}

        def progress(backend: str, done: int, total: int) -> None:
            if bar is not None:
                if backend not in tasks:
                    tasks[backend] = bar.add_task(f"building the {backend} runtime", total=total)
                bar.update(tasks[backend], completed=done)

        reports = setup_gpu(args.backend, args.tvm_src, args.jobs, args.force, progress)
    if args.json:
        print_json({r.backend: dataclasses.asdict(r) for r in reports})
    else:
        out = console()
        for r in reports:
            how = f"built in {r.build_seconds:.1f} s" if r.built else "up to date"
            out.print(f"[bold]{r.backend}[/bold]: {r.path} ({how})")
            for dev in r.devices:
                out.print(
                    f"  {r.backend}({dev['index']}): {dev['name']} (max {dev['max_threads_per_block']} threads per "
                    "block)"
                )
    for r in reports:
        if r.loaded_from and Path(r.loaded_from).resolve() != Path(r.path).resolve():
            print(
                f"tvm-memplan: note: TVM loads its {r.backend} runtime from {r.loaded_from}, not {r.path} "
                "(delete that file if an older setup-gpu put it there)",
                file=sys.stderr,
            )
    problems = [r.problem for r in reports if r.problem]
    if problems:
        print(f"tvm-memplan: error: {'; '.join(problems)}", file=sys.stderr)
        return 2
    return 0
