"""``tvm-memplan build | measure | rpc-local | tune``: artifacts for devices, and numbers from them."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.table import Table

from ..errors import UserError
from .format import console, human_bytes, key_value_table, print_json, progress_display
from .plan import (
    model_planner_kwargs,
    model_planner_options,
    parse_bytes,
    run_split_search,
    split_search_options,
    split_summary,
)
from .vocabulary import (
    add_command,
    add_cross_compiler,
    add_json,
    add_model_inputs,
    add_repeats,
    add_rpc_device,
    add_target,
    add_work_dir,
    model_spec_and_inputs,
    rpc_device,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..deploy.targets import TARGETS

    target_help = "; ".join(f"{name}: {t.what}" for name, t in TARGETS.items())

    build = add_command(
        subparsers,
        "build",
        run_build,
        description=(
            f"Compile MODEL for --target and write OUT.so plus OUT.so.json (its manifest). Targets: {target_help}."
        ),
    )
    build.add_argument("model", metavar="MODEL", help="ONNX file or zoo:NAME[?k=v&...]")
    build.add_argument(
        "-o", "--output", metavar="OUT.so", help="the VM library (not for cortex-m* targets, which take --emit-c only)"
    )
    add_target(build)
    add_model_inputs(build, inputs=False)
    build.add_argument(
        "--pipeline", default="memplan", choices=["memplan", "stock"], help="memplan (default) or TVM's stock planner"
    )
    add_work_dir(build)
    build.add_argument(
        "--emit-c",
        metavar="DIR",
        help="write the whole model as standalone C (model.c on one static arena, "
        "Makefile for this machine and Cortex-M)",
    )
    build.add_argument(
        "--sram-limit",
        type=parse_bytes,
        metavar="BYTES",
        help="with --emit-c: fail when arena + kernel scratch exceed this (e.g. 512K)",
    )
    build.add_argument(
        "--flash-limit",
        type=parse_bytes,
        metavar="BYTES",
        help="with --emit-c: fail when the weights exceed this (e.g. 2M)",
    )
    build.add_argument(
        "--io-in-arena",
        action="store_true",
        help="with --emit-c: the inputs and outputs live in the arena, planned with their lifetimes "
        "(<name>_input(i) / <name>_output(i), as TFLite Micro's interpreter.input(i))",
    )
    build.add_argument(
        "--int8-io",
        action="store_true",
        help="with --emit-c, for an int8 (QDQ) model: take and give int8 codes (scale and zero point in model.h)",
    )
    build.add_argument(
        "--no-kernel-checks",
        dest="kernel_checks",
        action="store_false",
        help="with --emit-c: TVM's kernels skip their argument checks and error strings (model.c passes what the "
        "plan fixed), as TF_LITE_STRIP_ERROR_STRINGS does for TFLite Micro: less flash, fewer instructions",
    )
    build.add_argument(
        "--requantize",
        choices=("exact", "fixed"),
        default="exact",
        help="with --emit-c, int8 on a Cortex-M with the DSP extension: how the C kernels requantize; exact "
        "(default): onnxruntime's float rounding, its codes exactly; fixed: integers as CMSIS-NN does (one "
        "SMMLAR per output), each kernel within 1 LSB of onnxruntime, fewer instructions",
    )
    add_cross_compiler(build)
    add_json(build)
    split_search_options(
        build.add_argument_group("fine-grained splitting (as plan --split)"),
        "acg: split channel chains into tiles before planning (latencies measured on this machine, "
        "or instructions on an emulated core with --device)",
    )
    model_planner_options(build)

    measure = add_command(subparsers, "measure", run_measure)
    measure.add_argument(
        "source", metavar="MODEL|OUT.so|DIR", help="a model, a built library, or a directory written by build --emit-c"
    )
    measure.add_argument(
        "--device",
        metavar="DEVICE",
        help="for DIR: host (default; this machine's C compiler), "
        "qemu-cortex-m7, qemu-cortex-m4 or qemu-cortex-m55 (emulated, needs arm-none-eabi-gcc and qemu-system-arm)",
    )
    measure.add_argument(
        "--per-kernel",
        action="store_true",
        help="for DIR on an emulated device: also each kernel call's "
        "instructions (a build that reads the cycle counter after every kernel)",
    )
    add_target(measure, note="MODEL is built for it")
    add_model_inputs(measure)
    add_rpc_device(measure)
    add_repeats(measure)
    measure.add_argument("--compare", action="store_true", help="measure TVM's stock pipeline and memplan side by side")
    add_work_dir(measure)
    add_cross_compiler(measure)
    measure.add_argument(
        "--log", metavar="FILE.jsonl", help="append each result to this JSON-lines log (atomic writes)"
    )
    add_json(
        measure,
        "print one JSON object: each pipeline's result under its name "
        "(memplan, or the artifact's; with --compare stock and memplan)",
    )
    model_planner_options(measure)

    farm = add_command(subparsers, "rpc-local", run_rpc_local)
    farm.add_argument("--port", type=int, default=9190, help="first tracker port to try (default 9190)")
    farm.add_argument("--key", default="local", help="device key of the servers (default local)")
    farm.add_argument(
        "--servers", type=int, default=1, help="number of servers (default 1; 0: only the tracker, e.g. for a phone)"
    )
    farm.add_argument("--lifetime", type=float, default=3600.0, metavar="S", help="stop after S seconds (default 3600)")
    add_json(farm, "print the tracker's address as one JSON object when it is up (nothing more on stdout)")

    tune = add_command(subparsers, "tune", run_tune)
    tune.add_argument("model", metavar="MODEL")
    tune.add_argument("--trials", type=int, required=True, metavar="N", help="total trials over the selected kernels")
    add_work_dir(tune, tuning=True)
    add_target(tune, note="tune takes CPU targets compiled by LLVM (host, x86-64, llvm-aarch64, android-arm64, llvm)")
    tune.add_argument("--kernels", metavar="REGEX", help="tune only kernels whose name matches")
    add_rpc_device(tune, "to tune on")
    tune.add_argument(
        "--builder-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="give up on a candidate whose build takes longer (default 120)",
    )
    add_json(tune)


def run_build(args: argparse.Namespace) -> int:
    """build a model into a shared library for a device (memplan pipeline)"""
    from ..deploy.build import Manifest, build
    from ..deploy.emit_c import emit_c
    from ..deploy.mcu import PLAN_FIGURES, check_limits
    from ..deploy.targets import get_target

    limits = {key: getattr(args, key) for key in ("sram_limit", "flash_limit") if getattr(args, key) is not None}
    if limits and not args.emit_c:
        raise UserError("--sram-limit and --flash-limit check the standalone C: give --emit-c DIR")
    shaping = args.io_in_arena or args.int8_io or not args.kernel_checks or args.requantize != "exact"
    if shaping and not args.emit_c:
        raise UserError(
            "--io-in-arena, --int8-io, --no-kernel-checks and --requantize shape the standalone C: give --emit-c DIR"
        )
    if args.output is None and args.emit_c is None:
        raise UserError(
            f"target {args.target}: give -o OUT.so" + (" or --emit-c DIR" if get_target(args.target).is_c else "")
        )
    args.model, _ = model_spec_and_inputs(args.model, args.input_shapes, None)
    started = time.monotonic()
    if args.int8_io:  # the split search, the build and measure all take the graph with int8 inputs and outputs
        from ..deploy.emit_c import int8_io_spec

        args.model = int8_io_spec(args.model, args.emit_c)
    options = model_planner_kwargs(args)
    split = None
    if args.split == "acg":
        from ..frontend import load_model

        # microcontroller targets cannot run here: without --device qemu-<core> their latencies are those of
        # the same C on this machine; with it, instructions on the emulated core (the planning target stays C)
        latency_target = "c" if get_target(args.target).is_mcu else args.target
        split = run_split_search(
            args, load_model(args.model), latency_target, args.memory_limit, options, io_in_arena=args.io_in_arena
        )
        options["prepare"] = split.prepare()
    output = emitted = None
    if args.output is not None:
        output = build(
            args.model, args.target, args.output, args.pipeline, args.work_dir, args.cross_compiler, **options
        )
    if args.emit_c is not None:
        emitted = emit_c(
            args.model,
            args.emit_c,
            args.target,
            io_in_arena=args.io_in_arena,
            kernel_checks=args.kernel_checks,
            requantize=args.requantize,
            **options,
        )
    if emitted is not None:
        check_limits(emitted.model, **limits)
    manifest = Manifest.load(output) if output is not None else None
    summary = {
        "artifact": str(output) if output is not None else None,
        "manifest": str(output) + ".json" if output is not None else None,
        "target": args.target,
        "pipeline": manifest.pipeline if manifest else "memplan",
        "storage_bytes": manifest.storage_bytes if manifest else emitted.model.arena_bytes,
        "planned_bytes": manifest.planned_bytes if manifest else None,
        "constant_bytes": manifest.constant_bytes if manifest else None,
        "tuned": manifest.tuning_dir if manifest else None,
        "emit_c": args.emit_c,
        "seconds": round(time.monotonic() - started, 2),
    }
    if emitted is not None:
        model_c = emitted.model
        summary |= model_c.figures(("arena_bytes", *PLAN_FIGURES, "split", "io_in_arena", "peak_tensors", "steps"))
    if split is not None:
        summary["split_search"] = split_summary(split)
    if args.json:
        print_json(summary)
        return 0
    rows = []
    if manifest is not None:
        rows += [
            ("artifact", summary["artifact"]),
            ("target", f"{manifest.target}  {manifest.tvm_target}"),
            (
                "pipeline",
                manifest.pipeline + (f" (tuned kernels from {manifest.tuning_dir})" if manifest.tuning_dir else ""),
            ),
            ("planned storage", human_bytes(manifest.storage_bytes)),
            ("VM should request", f"{human_bytes(manifest.planned_bytes)} (storage + outputs)"),
            ("weights (const)", f"{human_bytes(manifest.constant_bytes)} (the executable's constant pool)"),
        ]
    if emitted is not None:
        model_c = emitted.model
        rows += [
            ("standalone C", f"{args.emit_c} for {model_c.target} (see its README.md)"),
            (
                "static arena",
                f"{human_bytes(model_c.arena_bytes)} (TVM's default plan {human_bytes(model_c.tvm_default_bytes)}, "
                f"naive sum {human_bytes(model_c.naive_bytes)})",
            ),
            ("kernel scratch", human_bytes(model_c.workspace_bytes)),
            ("weights (const)", human_bytes(model_c.weight_bytes)),
        ]
    if split is not None and summary["split_search"]["split_advice"]:
        rows.append(("split search", summary["split_search"]["split_advice"]))
    rows.append(("build time", f"{summary['seconds']:.1f} s"))
    console().print(key_value_table("tvm-memplan build", rows))
    if emitted is not None and emitted.model.steps:
        console().print(_steps_table(emitted.model))
    return 0


def _steps_table(model_c) -> Table:
    """X-CUBE-AI's per-layer report for the standalone C: one row per kernel call."""
    peak = max(step["live_arena_bytes"] for step in model_c.steps)
    table = Table(
        title=f"per kernel call (peak {human_bytes(peak)} live, marked *; at the plan's peak: "
        + ", ".join(name for name, _ in model_c.peak_tensors)
        + ")",
        title_justify="left",
    )
    for column in ("step", "kernel", "FLOPs", "weights", "arena live", ""):
        table.add_column(column, justify="left" if column in ("kernel", "") else "right")
    for step in model_c.steps:
        table.add_row(
            str(step["step"]),
            step["kernel"],
            f"{step['flops']:,}",
            human_bytes(step["weight_bytes"]),
            human_bytes(step["live_arena_bytes"]),
            "*" if step["live_arena_bytes"] == peak else "",
        )
    return table


def run_measure(args: argparse.Namespace) -> int:
    """latency, requested memory and correctness of a model or an artifact, here or over RPC

    Measure MODEL (built here for --target) or OUT.so (built by 'tvm-memplan build'); with --log, results are
    also appended to a JSON-lines log."""
    from ..deploy.measure import measure
    from ..deploy.results import ResultsLog

    log = ResultsLog(args.log) if args.log else None
    if Path(args.source).is_dir():
        if args.input_shapes or args.inputs:
            raise UserError("the standalone C runs the inputs it was built with: drop --input-shapes and --inputs")
        return _measure_c(args, log)
    if args.device or args.per_kernel:
        raise UserError(
            f"{'--device' if args.device else '--per-kernel'} runs the standalone C: give the directory "
            "written by build --emit-c DIR"
        )
    source, inputs = args.source, None
    if source.endswith(".so"):
        if args.input_shapes:
            raise UserError(f"{source} was built for its input shapes: --input-shapes applies to a model")
        if args.inputs:
            from ..deploy.build import Manifest

            if not Path(source).exists():
                raise UserError(f"no such artifact: {source}")
            _, inputs = model_spec_and_inputs(Manifest.load(Path(source)).model, None, args.inputs)
    else:
        source, inputs = model_spec_and_inputs(source, args.input_shapes, args.inputs)
    with progress_display() as bar:
        tasks: dict[str, int] = {}

        def progress(pipeline: str, step: str, done: int, total: int) -> None:
            if bar is None:
                return
            if pipeline not in tasks:
                tasks[pipeline] = bar.add_task(pipeline, total=total)
            bar.update(tasks[pipeline], completed=done, description=f"{pipeline}: {step}")

        results = measure(
            source,
            target=args.target,
            inputs=inputs,
            compare=args.compare,
            repeat=args.repeat,
            **rpc_device(args),
            log=log,
            tuning_dir=args.work_dir,
            progress=progress,
            min_repeat_ms=args.min_repeat_ms,
            cross_compiler=args.cross_compiler,
            **model_planner_kwargs(args),
        )
    if args.json:
        print_json({pipeline: m.summary() for pipeline, m in results.items()})
    else:
        _print_measurements(results, log.path if log is not None else None)
    return 0 if all(m.correct for m in results.values()) else 1


def _measure_c(args: argparse.Namespace, log) -> int:
    from ..deploy.standalone import measure_c

    result = measure_c(args.source, args.device or "host", per_kernel=args.per_kernel)
    if log is not None:
        log.append(result.summary())
    if args.json:
        print_json({"memplan": result.summary()})  # the standalone C holds memplan's plan
        return 0 if result.correct else 1
    rows = [
        ("model", f"{result.model} on {result.device} ({result.kernel_calls} kernel calls)"),
        ("correct", "yes" if result.correct else f"NO: {result.error or f'max |diff| {result.max_abs_diff:.3g}'}"),
        (
            "max |diff|",
            f"{result.max_abs_diff:.3g} against {result.reference}"
            + (f" (int8 LSB rule: {result.tolerance:.3g} allowed)" if result.tolerance else ""),
        ),
        (
            "arena in binary",
            f"{human_bytes(result.arena_bytes)} "
            f"({'= plan' if result.arena_bytes == result.planned_arena_bytes else 'NOT the plan'}; "
            f"TVM's default plan {human_bytes(result.tvm_default_bytes)}, naive sum {human_bytes(result.naive_bytes)})",
        ),
    ]
    if result.sram_bytes is not None:
        rows += [
            (
                "SRAM",
                f"{human_bytes(result.sram_bytes)} (.data + .bss + stack high-water {human_bytes(result.stack_bytes)})",
            ),
            (
                "flash",
                f"{human_bytes(result.flash_bytes)} (.text + .rodata + .data image; weights "
                f"{human_bytes(result.weight_bytes)})",
            ),
            ("instructions", f"{result.instructions:,} (qemu -icount)"),
        ]
    console().print(key_value_table("tvm-memplan measure (standalone C)", rows))
    if result.kernels:
        table = Table(title="instructions per kernel call (the profiling build)", title_justify="left")
        for column in ("step", "kernel", "instructions", "share"):
            table.add_column(column, justify="left" if column == "kernel" else "right")
        total = sum(k["instructions"] for k in result.kernels) or 1
        for k in result.kernels:
            table.add_row(
                str(k["step"]), k["kernel"], f"{k['instructions']:,}", f"{100 * k['instructions'] / total:.1f} %"
            )
        console().print(table)
    if log is not None:
        console().print(f"result appended to {log.path}")
    return 0 if result.correct else 1


def _print_measurements(results: dict, log_path) -> None:
    first = next(iter(results.values()))
    table = Table(title=f"{first.model} on {first.device} ({first.target})", title_justify="left")
    # median latency, its interquartile range, the VM's storage requests and the plan's bytes
    for column in ("pipeline", "latency", "IQR", "requested", "planned", "= plan", "correct"):
        table.add_column(column, justify="left" if column == "pipeline" else "right")
    for m in results.values():
        requested = m.requested_bytes
        table.add_row(
            m.pipeline,
            f"{m.latency_ms:.3f} ms",
            f"{m.latency_spread_ms:.3f} ms",
            human_bytes(requested) if requested is not None else "unknown",
            human_bytes(m.planned_bytes),
            "-" if requested is None else ("yes" if requested == m.planned_bytes else "NO"),
            "yes" if m.correct else f"NO (max |diff| {m.max_abs_diff:.3g})",
        )
    out = console()
    out.print(table)
    if "stock" in results and "memplan" in results:
        stock, memplan = results["stock"], results["memplan"]
        if stock.requested_bytes and memplan.requested_bytes is not None:
            out.print(f"memplan requests {memplan.requested_bytes / stock.requested_bytes:.3f}x stock's memory")
        out.print(
            f"memplan latency is {memplan.latency_ms / stock.latency_ms:.3f}x stock's "
            f"(spreads {stock.latency_spread_ms:.3f} / {memplan.latency_spread_ms:.3f} ms)"
        )
    if first.requested_bytes is None:
        out.print(
            "requested bytes unknown: the server has no tvm_memplan.vm_alloc_trace (start it with tvm-memplan "
            "rpc-local)"
        )
    logged = f"; results appended to {log_path}" if log_path is not None else ""
    out.print(f"TVM_NUM_THREADS on the device: {first.tvm_num_threads or 'unset'}{logged}")


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def run_rpc_local(args: argparse.Namespace) -> int:
    """run an RPC tracker and servers on 127.0.0.1 until Ctrl-C

    Start a tracker and servers on 127.0.0.1 (first free ports from 9190 / 9090); Ctrl-C, SIGTERM or --lifetime
    stops them all."""
    from ..deploy.rpc import start_farm

    if args.servers < 0:
        raise UserError(f"--servers must be >= 0, got {args.servers}")
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM must run the same clean-up as Ctrl-C
    out = console()
    with start_farm({args.key: args.servers}, lifetime=args.lifetime, port=args.port) as farm:
        if args.json:
            print_json({"tracker": farm.tracker, "key": args.key, "servers": args.servers, "lifetime_s": args.lifetime})
        else:
            out.print(
                f"tracker {farm.tracker}; {args.servers} server(s) under key {args.key!r}; "
                f"stops in {args.lifetime:.0f} s or on Ctrl-C"
            )
            out.print(f"  tvm-memplan measure MODEL --rpc-tracker {farm.tracker} --rpc-key {args.key}")
            out.print(
                f"  python -m tvm.exec.rpc_server --tracker {farm.tracker} --key KEY   # on a phone or board: add it"
            )
        sys.stdout.flush()
        try:
            time.sleep(args.lifetime)
        except KeyboardInterrupt:
            pass
    if not args.json:
        out.print("stopped tracker and servers")
    return 0


@contextmanager
def _tuning_progress(work_dir: Path, trials: int) -> Iterator[None]:
    """Tuning trials as MetaSchedule commits them: the records in WORK_DIR's database, counted
    twice a second by a thread (tune runs MetaSchedule in this process and says nothing meanwhile)."""
    records = work_dir / "database_tuning_record.json"
    with progress_display() as bar:
        if bar is None:
            yield
            return
        task = bar.add_task("tune: records in the database", total=trials)
        stop = threading.Event()

        def poll() -> None:
            while not stop.wait(0.5):
                try:
                    count = sum(1 for line in records.open() if line.strip())
                except OSError:  # not written yet
                    continue
                bar.update(task, completed=min(count, trials))

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            yield
        finally:
            stop.set()
            poller.join()


def run_tune(args: argparse.Namespace) -> int:
    """tune the model's kernels with MetaSchedule (XGBoost cost model), resumable

    Tune MODEL's kernels into the database in --work-dir; a second run continues up to --trials in total.
    build/measure --work-dir apply it."""
    from ..deploy.targets import get_target
    from ..deploy.tune import tune

    if get_target(args.target).kind != "llvm" or get_target(args.target).device != "cpu":
        raise UserError(
            f"tune: target {args.target} is not a CPU target compiled by LLVM "
            "(host, x86-64, llvm-aarch64, android-arm64, llvm)"
        )

    with _tuning_progress(Path(args.work_dir), args.trials):
        result = tune(
            args.model,
            args.target,
            args.trials,
            args.work_dir,
            kernels=args.kernels,
            **rpc_device(args),
            builder_timeout=args.builder_timeout,
        )
    if args.json:
        print_json(result.summary())
        return 0
    rows = [
        ("kernels tuned", ", ".join(result.kernels)),
        ("trials this run", str(result.trials_run)),
        ("records in database", str(result.records)),
        ("database", f"{result.work_dir} (tuning logs in its logs/)"),
        ("runner", result.runner),
        ("time", f"{result.seconds:.1f} s"),
    ]
    console().print(key_value_table("tvm-memplan tune", rows))
    console().print(f"apply with: tvm-memplan build {args.model} -o OUT.so --work-dir {args.work_dir}")
    return 0
