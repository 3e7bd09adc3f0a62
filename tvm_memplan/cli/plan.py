"""``tvm-memplan plan`` (a model) and ``tvm-memplan solve`` (a raw MiniMalloc CSV problem)."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from ..errors import UserError
from ..options import LAYOUTS, SCHEDULES
from ..planning import ProblemFormatError, plan_memory, read_minimalloc_csv, write_offsets_csv
from ..split.chain import FUSED_TILES
from .format import console, human_bytes, key_value_table, memory_profile, print_json, split_search_progress
from .vocabulary import (
    EMULATED_DEVICES,
    add_command,
    add_deprecated_alias,
    add_json,
    add_model_inputs,
    add_rpc_device,
    add_switch,
    add_target,
    model_spec_and_inputs,
    rpc_device,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    plan = add_command(subparsers, "plan", run_plan)
    plan.add_argument(
        "model", metavar="MODEL", help="ONNX file or zoo:NAME, e.g. zoo:mobilenet_v2?width=0.35&resolution=144"
    )
    add_target(plan)
    plan.add_argument(
        "--verify",
        action="store_true",
        help="build and run: compare with stock TVM and onnxruntime, trace the VM's allocations",
    )
    add_model_inputs(plan)
    plan.add_argument("--plot", metavar="FILE.png", help="draw the memory layout")
    add_json(plan)
    model_planner_options(plan)
    split = split_search_options(
        plan.add_argument_group("fine-grained splitting"),
        "acg: split channel chains found by the axis connection graph into tiles (default none)",
    )
    add_rpc_device(split, "to measure chain latencies on")

    solve = add_command(subparsers, "solve", run_solve)
    solve.add_argument("problem", metavar="PROBLEM.csv")
    solve.add_argument("-o", "--output", metavar="OFFSETS.csv", help="write id,lower,upper,size,offset")
    add_deprecated_alias(solve, "--out", "-o/--output", dest="output")
    solve.add_argument("--plot", metavar="FILE.png", help="draw the memory layout")
    add_json(solve)
    _planner_options(solve, default_alignment=1)


def split_search_options(group: argparse._ArgumentGroup, split_help: str) -> argparse._ArgumentGroup:
    """The split search's options (``plan`` and ``build`` take them alike); returns ``group``."""
    group.add_argument("--split", choices=["none", "acg"], default="none", help=split_help)
    group.add_argument(
        "--memory-limit",
        type=parse_bytes,
        metavar="BYTES",
        help="with --split acg: the fastest split plan that fits, e.g. 512K or 1.5M (latency budget ignored)",
    )
    group.add_argument(
        "--latency-budget",
        type=float,
        default=0.05,
        metavar="F",
        help="with --split acg: allowed slowdown as a fraction of the measured latency (default 0.05)",
    )
    group.add_argument(
        "--search-seconds",
        type=float,
        default=60.0,
        metavar="S",
        help="with --split acg: search time limit (default 60)",
    )
    group.add_argument(
        "--fused-tiles",
        choices=list(FUSED_TILES),
        default=None,
        help="with --split acg: run a split chain's tiles as one kernel (every stage of a tile before the next): "
        "off (one kernel per operator and tile), on, or auto (per chain, the faster as measured; the default for "
        "float models on llvm CPU targets, off for int8 models, other targets and --device)",
    )
    group.add_argument(
        "--device",
        choices=EMULATED_DEVICES,
        help="with --split acg: count each candidate's instructions on this emulated core (the model as standalone C "
        "under qemu-system-arm -icount; needs arm-none-eabi-gcc and qemu-system-arm; --target must be its core) "
        "instead of timing on this machine; the latency budget is then in instructions",
    )
    group.add_argument(
        "--floor-guided",
        action="store_true",
        help="with --split acg: compute the simulator's floor first (a fifth of --search-seconds) and time the "
        "moves of its plan before the others (SqueezeNet in NCHW16c: 4.5x-4.95x against 2.7x; MobileNetV2: 2.14x "
        "against 4.04x, results/bench_split_floor_guided.md)",
    )
    group.add_argument(
        "--refresh-confirmations",
        action="store_true",
        help="with --split acg: time the whole model again instead of reusing the cache's whole-model times "
        "(the unsplit model's, the split plans' confirmations); without it they are timed again only when "
        "the unsplit model timed now is over twice as fast or as slow as when they were measured",
    )
    group.add_argument(
        "--split-cache",
        metavar="FILE",
        help="latency measurements to reuse and extend "
        "(default chain_latency.jsonl in the user cache: $XDG_CACHE_HOME/tvm_memplan, else ~/.cache/tvm_memplan)",
    )
    return group


def _planner_options(parser: argparse.ArgumentParser, default_alignment: int = 64) -> None:
    parser.add_argument(
        "--alignment",
        type=int,
        default=default_alignment,
        help=f"offset alignment in bytes (default {default_alignment})",
    )
    parser.add_argument(
        "--time-budget",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds the search may spend once the greedy orderings miss the lower bound (default 10)",
    )


def model_planner_options(parser: argparse.ArgumentParser, groups: bool = True) -> None:
    """Options of every command that plans a model (plan, build, measure; bench takes its own ``--groups``)."""
    _planner_options(parser)
    if groups:
        parser.add_argument(
            "--groups",
            metavar="G",
            help="layer grouping: seq, a group count per layer, "
            "or auto; tensors a group uses never share memory (default: off)",
        )
    add_switch(parser, "--inplace", None, "in-place kernels and concat elimination (default on)")
    parser.add_argument(
        "--order",
        choices=["program", "dfs", "bfs", "search"],
        default="search",
        help="execution order: as imported, TVM's depth-/breadth-first TopologicalSort, or searched (default)",
    )
    parser.add_argument(
        "--order-seconds", type=float, default=10.0, metavar="S", help="time budget of the order search (default 10)"
    )
    parser.add_argument(
        "--schedule",
        choices=list(SCHEDULES),
        default="default",
        help="kernel schedules: tvm_memplan's defaults (CPU: every kernel; GPU: convolutions and pools, "
        "the rest dlight's), or none (TVM's own: plain loops on CPU, dlight on GPU; for comparison)",
    )
    parser.add_argument(
        "--layout",
        choices=list(LAYOUTS),
        default="auto",
        help="activation layout on llvm targets: blocked (convolutions, their epilogues and pools in NCHW[x]c, "
        "x the vector lanes: 16 with AVX-512, 8 with AVX2, 4 with NEON), nchw (as imported), or auto (default: blocked "
        "where the target has AVX2 or AVX-512, else nchw)",
    )


def model_planner_kwargs(args: argparse.Namespace) -> dict:
    return {
        "alignment": args.alignment,
        "time_budget": args.time_budget,
        "inplace": args.inplace,
        "order": args.order,
        "order_seconds": args.order_seconds,
        "schedule": args.schedule,
        "layout": args.layout,
        "groups": getattr(args, "groups", None),
    }


def parse_bytes(text: str) -> int:
    """``524288``, ``512K``, ``1.5M``, ``2MiB`` → bytes (K = 1024)."""
    units = {
        "": 1,
        "K": 1 << 10,
        "KB": 1 << 10,
        "KIB": 1 << 10,
        "M": 1 << 20,
        "MB": 1 << 20,
        "MIB": 1 << 20,
        "G": 1 << 30,
        "GB": 1 << 30,
        "GIB": 1 << 30,
    }
    stripped = text.strip().upper()
    number = stripped.rstrip("KMGIB")
    unit = stripped[len(number) :]
    try:
        value = float(number) * units[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r} (e.g. 524288, 512K, 1.5M)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"byte count must be positive: {text!r}")
    return int(value)


def _target_arg(text: str):
    """The TVM target of a device name or TVM target (``host`` stays this machine's CPU as TVM detects it)."""
    from ..deploy.targets import get_target

    return text if text == "host" else get_target(text).tvm_target()


def run_plan(args: argparse.Namespace) -> int:
    """plan a model's intermediate tensors into one arena and compare with TVM's planner

    Plan MODEL (an ONNX file or zoo:NAME[?k=v&...]) and report naive, TVM default, lower-bound and arena bytes."""
    from ..frontend import example_binding, is_dynamic, load_model
    from ..planner import plan_model
    from ..relax.pipeline import resolve_target
    from ..verify import target_device, verify_plan

    if args.inputs and not args.verify:
        raise UserError("--inputs are run by --verify: add --verify")
    if args.verify:  # before planning: a model can take minutes to compile for a device that is not here
        target_device(resolve_target(_target_arg(args.target)))
    spec, inputs = model_spec_and_inputs(args.model, args.input_shapes, args.inputs)
    model = load_model(spec)
    options = model_planner_kwargs(args)
    split = _search_split(args, model, args.memory_limit) if args.split == "acg" else None
    plan = plan_model(model, _target_arg(args.target), prepare=split.prepare() if split else None, **options)
    if split is not None and args.memory_limit is not None:
        plan, split = _fit_planned_arena(args, model, plan, split)
    verified = None
    verify_result = None
    if args.verify:
        verify_result = verify_plan(plan, inputs=inputs)
        verified = verify_result.ok
    main = plan.main
    layouts = main.layouts()
    if args.plot and layouts:
        from ..plot import plot_layout

        problem, offsets, arena = max(layouts, key=lambda layout: layout[2])
        plot_layout(problem, offsets, args.plot, title=f"{model.name}: arena {human_bytes(arena)}", arena_bytes=arena)

    bound = plan.total("lower_bound_bytes")
    arena = plan.total("arena_bytes")
    dynamic = [(name, shape) for name, shape, _ in model.input_specs() if is_dynamic(shape)]
    summary = {
        "model": model.name,
        "target": str(plan.target.kind.name),
        "tensors": plan.total("tensors"),
        "naive_bytes": plan.total("naive_bytes"),
        "tvm_default_bytes": plan.tvm_default_bytes,
        "lower_bound_bytes": bound,
        "program_order_lower_bound_bytes": plan.program_order_lower_bound_bytes,
        "arena_bytes": arena,
        "arena_over_bound": round(arena / bound, 4) if bound else 1.0,
        "plan_seconds": round(plan.total("plan_seconds"), 4),
        "order": plan.options.order if plan.options.groups is None else "layers",
        "order_strategy": ", ".join(sorted({r.strategy for r in plan.order_reports})) or None,
        "order_optimal": bool(plan.order_reports) and all(r.optimal for r in plan.order_reports),
        "order_seconds": round(sum(r.seconds for r in plan.order_reports), 3),
        "inplace": plan.options.inplace,
        "concats_removed": plan.total("concats_removed"),
        "concats_kept": {f"{r.function}.{k}": v for r in plan.reports for k, v in r.concats_kept.items()},
        "inplace_ops": plan.total("inplace_ops"),
        "removable_ops": plan.total("removable_ops"),
        "optimal": all(r.optimal for r in plan.reports),
        "allocators": sorted({a for r in plan.reports for a in r.allocators}),
        "functions": [r.function for r in plan.reports],
        "unplanned": {f"{r.function}.{k}": v for r in plan.reports for k, v in r.unplanned.items()},
        "dynamic_inputs": {name: [str(d) for d in shape] for name, shape in dynamic},
        "input_shapes_hint": ",".join(example_binding(name, shape) for name, shape in dynamic),
        "verified": verified,
        "layout": _layout_used(plan),
    }
    if plan.options.groups is not None:
        summary.update(_groups_summary(plan))
    if split is not None:
        summary.update(split_summary(split))
    if verify_result is not None:
        summary["verify"] = {
            "device": verify_result.device,
            "identical_to_stock": verify_result.identical_to_stock,
            "max_abs_diff_vs_onnxruntime": verify_result.max_abs_diff_vs_onnxruntime,
            "max_lsb_diff_vs_onnxruntime": verify_result.max_lsb_diff_vs_onnxruntime,
            "tolerance_lsb": verify_result.tolerance_lsb,
            "vm_storage_bytes": verify_result.trace_bytes,
            "planned_storage_bytes": verify_result.expected_trace_bytes,
            "zero_offset_calls": verify_result.zero_offset_calls,
            "problems": verify_result.problems,
        }
    if args.plot:
        summary["plot"] = str(args.plot)
    if args.json:
        print_json(summary)
    else:
        _print_plan_report(summary, layouts)
    return 0 if verified in (None, True) else 1


def unplanned_lines(unplanned: dict[str, str], listed: int = 3) -> list[str]:
    """One line per tensor TVM's planner keeps, or one per reason where more than ``listed`` share it
    (a dynamic-batch model would otherwise print a line for every tensor)."""
    by_reason: dict[str, list[str]] = {}
    for name, reason in unplanned.items():
        by_reason.setdefault(reason, []).append(name)
    lines = []
    for reason, names in by_reason.items():
        if len(names) <= listed:
            lines += [f"unplanned {name}: {reason}" for name in names]
        else:
            lines.append(f"unplanned {len(names)} tensors ({names[0]}, ..., {names[-1]}): {reason}")
    return lines


def _fit_planned_arena(args: argparse.Namespace, model, plan, split, attempts: int = 2):
    """The search fits the simulator's peak under ``--memory-limit``; the planner's arena can
    come out larger (alignment, a fusion the simulator models differently). Search again under a
    limit lowered by the overshoot, and say so in one line when the planned arena still misses."""
    from ..planner import plan_model

    limit = args.memory_limit
    for _ in range(attempts):
        arena = plan.total("arena_bytes")
        if arena <= args.memory_limit:
            return plan, split
        limit = int(limit * args.memory_limit / arena)
        try:
            split = _search_split(args, model, limit)
        except UserError as exc:  # say why the limit it names is below the one asked for
            raise UserError(
                f"{exc} (searched under {limit:,} bytes: the plan that fit {args.memory_limit:,} bytes as simulated "
                f"planned an arena of {arena:,})"
            ) from None
        plan = plan_model(model, _target_arg(args.target), prepare=split.prepare(), **model_planner_kwargs(args))
    arena = plan.total("arena_bytes")
    if arena > args.memory_limit:
        raise UserError(
            f"{model.name}: the split plan's simulated peak fits {args.memory_limit:,} bytes but the planned "
            f"arena is {arena:,} bytes; nothing found fits in the planner"
        )
    return plan, split


def _search_split(args: argparse.Namespace, model, memory_limit: int | None):
    from ..deploy.measure import Device

    device = Device(**rpc_device(args))
    return run_split_search(args, model, args.target, memory_limit, model_planner_kwargs(args), device)


def run_split_search(
    args: argparse.Namespace,
    model,
    target: str,
    memory_limit: int | None,
    plan_options,
    device=None,
    io_in_arena: bool = False,
):
    """``--split acg`` as a command's options ask for it (``plan``, ``build``), with its progress display;
    latencies measured on ``device`` (default: here) for ``target``, cached in ``--split-cache`` (default:
    the user's cache); ``io_in_arena`` counts the model's inputs as arena tensors."""
    from ..deploy.chain_latency import default_cache
    from ..deploy.split import default_fused_tiles, search_split

    mcu_device = getattr(args, "device", None)
    if mcu_device is not None:
        _check_split_device(args, mcu_device)

    with split_search_progress(args.search_seconds) as progress:
        return search_split(
            model,
            target,
            device,
            budget=args.latency_budget,
            seconds=args.search_seconds,
            memory_limit=memory_limit,
            schedule=args.schedule,
            progress=progress,
            cache=Path(args.split_cache) if args.split_cache else default_cache(),
            fused_tiles=args.fused_tiles or default_fused_tiles(model, target, mcu_device),
            plan_options=plan_options,
            io_in_arena=io_in_arena,
            mcu_device=mcu_device,
            spec=args.model,
            refresh_confirmations=getattr(args, "refresh_confirmations", False),
            floor_guided=getattr(args, "floor_guided", False),
            emit_options={
                "kernel_checks": getattr(args, "kernel_checks", True),
                "requantize": getattr(args, "requantize", "exact"),
            },
        )


def _check_split_device(args: argparse.Namespace, device: str) -> None:
    """``--device qemu-cortex-*`` goes with ``--target`` of its core, alone, and with the arm tools."""
    from ..deploy.chain_latency import DEVICE_CORES, require_arm_tools

    if args.split != "acg":
        raise UserError(f"--device {device} measures the split search's candidates: give --split acg")
    if DEVICE_CORES[device] != args.target:
        raise UserError(
            f"--device {device} counts instructions of {DEVICE_CORES[device]}: give --target "
            f"{DEVICE_CORES[device]} (not {args.target})"
        )
    if getattr(args, "rpc_tracker", None):
        raise UserError(f"--device {device} runs on this machine's emulator: drop --rpc-tracker and --rpc-key")
    require_arm_tools(device)


def split_summary(split) -> dict:
    """The split search's part of ``--json``. Latencies carry their unit in their names: ``latency_before_ms``
    when measured in milliseconds, ``latency_before_instructions`` when counted on an emulated core
    (``--device qemu-cortex-m7``), as ``latency_unit`` says."""
    result = split.result
    unit = split.unit
    return {
        "split": "acg",
        "split_candidates": len(split.chains),
        "split_subgraphs": [
            {
                "chain": c.chain.name,
                "bindings": list(c.chain.bindings),
                "parts": c.parts,
                "kind": c.chain.kind,
                "fused": c.fused,
                "tiles": c.variant,
            }
            for c in split.choices
        ],
        "split_reason": result.stopped if split.chains else "no chain to split in the model: plan unchanged",
        "split_advice": smaller_plan_advice(split),
        "peak_before_bytes": result.original.peak_bytes,
        "peak_after_bytes": result.best.peak_bytes,
        "peak_floor_bytes": split.floor.peak_bytes if split.floor is not None else None,
        f"latency_before_{unit}": _latency(split.latency_before_ms, unit),
        f"latency_after_{unit}": _latency(split.latency_after_ms, unit),
        f"latency_estimated_{unit}": _latency(result.best.latency_ms, unit),
        "latency_unit": unit,
        "bottleneck": list(result.bottleneck.live[:6]),
        "bottleneck_described": split.bottleneck,
        "pareto_front": [
            {
                "peak_bytes": p.peak_bytes,
                f"latency_{unit}": _latency(p.latency_ms, unit),
                "parts": {c.chain.name: c.parts for c in p.choices},
            }
            for p in result.front
        ],
        "search_seconds": round(result.seconds, 2),
        "plans_simulated": result.evaluated,
        "splits_not_timed": result.pruned,
        "latency_cache_hits": split.cache_hits,
        "whole_model_times_remeasured": split.remeasured,
        "latency_measurements": split.cache_misses,
    }


def smaller_plan_advice(split) -> str | None:
    """One line when the search found a smaller plan than it kept (it missed the latency budget): the
    smallest point of the front, its estimated cost, and the options that take it. In a blocked layout
    the unsplit model is fast and each tile's fixed cost weighs more (MobileNetV2-0.35 in NCHW16c: every
    split missed 5 %, results/bench_split_blocked_idle.md), so NCHW is named too. None otherwise."""
    from ..deploy.split import smaller_plan_options, smallest_point

    result = split.result
    if split.budget is None or not result.front:
        return None
    smallest = smallest_point(result)
    if smallest.peak_bytes >= result.best.peak_bytes:
        return None
    original = result.original
    cost = smallest.latency_ms / original.latency_ms - 1
    reduction = original.peak_bytes / result.best.peak_bytes
    kept = "kept unsplit" if not result.best.choices else f"kept a plan {reduction:.2f}x lower"
    over = (
        f"over the {split.budget:.0%} latency budget"
        if cost > split.budget
        else f"within the {split.budget:.0%} budget by its chains, not as a whole model"
    )
    # not --memory-limit: it bounds the planned arena, which can exceed the simulated peak (NCHW16c's mcu_cnn:
    # 80 KiB planned against 40 KiB simulated), so the smallest point's peak is no limit that takes it
    # the next hundredth above the cost (0.115 -> 0.12; a cost of 0.2 less a rounding error -> 0.21, not 0.20)
    takes = [f"--latency-budget {math.floor(cost * 100 + 1e-6) / 100 + 0.01:.2f}"] if cost > split.budget else []
    takes += smaller_plan_options(result, split.block, split.fusable)
    return (
        f"{kept}: the smallest plan found peaks at {human_bytes(smallest.peak_bytes)} simulated "
        f"({original.peak_bytes / smallest.peak_bytes:.2f}x lower) for {cost:+.1%} (estimated), {over}"
        + ("; for a smaller plan try " + ", or ".join(takes) if takes else "")
    )


def _latency(value: float, unit: str) -> float | int:
    """Milliseconds to 4 decimals; instruction counts as the whole numbers they are."""
    return round(value, 4) if unit == "ms" else int(round(value))


def _layout_used(plan) -> str:
    """The activation layout the plan runs in (a split plan's too: its tiles are blocked like the rest)."""
    from ..relax.layout import layout_block

    block = layout_block(plan.target, plan.options.layout)
    return f"blocked (NCHW{block}c)" if block is not None else "nchw"


def _print_plan_report(summary: dict, layouts) -> None:
    out = console()
    default = summary["tvm_default_bytes"]
    arena = summary["arena_bytes"]
    bound = summary["lower_bound_bytes"]
    rows = [
        ("model", summary["model"]),
        ("target", summary["target"]),
        ("layout", summary["layout"]),
        ("planned tensors", f"{summary['tensors']:,}"),
        ("naive (no reuse)", human_bytes(summary["naive_bytes"])),
        ("TVM default (StaticPlanBlockMemory)", human_bytes(default)),
        ("lower bound, program order", human_bytes(summary["program_order_lower_bound_bytes"])),
        (
            "lower bound, order used",
            human_bytes(bound)
            + f"  (order {summary['order']}"
            + (f": {summary['order_strategy']}" if summary["order_strategy"] else "")
            + (", proved optimal" if summary["order_optimal"] else "")
            + ")",
        ),
        ("memplan arena", human_bytes(arena)),
        ("arena / lower bound", f"{summary['arena_over_bound']:.3f}" + ("  (optimal)" if summary["optimal"] else "")),
        ("arena / TVM default", f"{arena / default:.3f}" if default else "-"),
        (
            "aliasing",
            f"{summary['inplace_ops']} in-place kernels, {summary['concats_removed']} concats removed, "
            f"{summary['removable_ops']} views"
            if summary["inplace"]
            else "off",
        ),
        (
            "planning time",
            f"{summary['plan_seconds'] * 1000:,.1f} ms"
            + (f"  ({', '.join(summary['allocators'])})" if summary["allocators"] else ""),
        ),
    ]
    if summary["verified"] is not None:
        verify = summary["verify"]
        status = "PASS" if summary["verified"] else "FAIL"
        diff = verify["max_abs_diff_vs_onnxruntime"]
        rows.append(
            (
                "verified",
                f"{status} on {verify['device']}: identical to stock TVM={verify['identical_to_stock']}, "
                f"max |diff| vs onnxruntime={diff:.2g}"
                if diff is not None
                else f"{status} on {verify['device']}",
            )
        )
        rows.append(("VM storage requests", ", ".join(human_bytes(b) for b in verify["vm_storage_bytes"])))
    if "groups" in summary:
        rows += _groups_rows(summary)
    if "split" in summary:
        rows += _split_rows(summary)
    out.print(key_value_table("tvm-memplan plan", rows))
    if "split" in summary and summary["pareto_front"]:
        out.print()
        out.print(_front_table(summary))
    if layouts:
        problem, _, arena_bytes = max(layouts, key=lambda layout: layout[2])
        out.print()
        out.print(memory_profile(problem, arena_bytes))
    for line in unplanned_lines(summary["unplanned"]):
        out.print(f"  {line}")
    if summary["input_shapes_hint"]:
        out.print(
            f"  [yellow]note[/yellow]: tensors whose shapes depend on the model's dynamic dimensions are left to "
            f"TVM's planner; bind them to plan everything: --input-shapes {summary['input_shapes_hint']}"
        )
    for name, reason in summary["concats_kept"].items():
        out.print(f"  concat kept {name}: {reason}")
    if summary["verified"] is False:
        for problem_text in summary["verify"]["problems"]:
            out.print(f"  [red]problem[/red]: {problem_text}")
    if "plot" in summary:
        out.print(f"layout plot written to {summary['plot']}")


def _groups_summary(plan) -> dict:
    """Layer grouping's part of the report: layers, groups and the F-predicate's price."""
    unconstrained = plan.total("unconstrained_arena_bytes")
    arena = plan.total("arena_bytes")
    return {
        "groups": plan.options.groups,
        "layers": plan.total("layers"),
        "group_count": plan.total("groups"),
        "kernels": plan.total("kernels"),
        "unconstrained_arena_bytes": unconstrained,
        "arena_over_unconstrained": round(arena / unconstrained, 4) if unconstrained else 1.0,
    }


def _groups_rows(summary: dict) -> list[tuple[str, str]]:
    return [
        (
            "layer grouping",
            f"groups={summary['groups']}: {summary['layers']} layers, {summary['group_count']} groups, "
            f"{summary['kernels']} kernels",
        ),
        (
            "arena without the F-predicate",
            human_bytes(summary["unconstrained_arena_bytes"]) + "  (same layer-wise order)",
        ),
        ("arena / unconstrained", f"{summary['arena_over_unconstrained']:.3f}"),
    ]


_HOW_TILES_RUN = {"fused": " (one kernel)", "fused, line buffer": " (one kernel, line buffer)"}


def _split_rows(summary: dict) -> list[tuple[str, str]]:
    before, after = summary["peak_before_bytes"], summary["peak_after_bytes"]
    unit = summary["latency_unit"]
    counts = "latencies" if unit == "ms" else "instruction counts"
    was, now = summary[f"latency_before_{unit}"], summary[f"latency_after_{unit}"]
    chosen = (
        ", ".join(
            f"{s['chain']} x{s['parts']}{_HOW_TILES_RUN.get(s.get('tiles'), '')}" for s in summary["split_subgraphs"]
        )
        or "none"
    )
    return [
        ("split (axis connection graph)", f"{summary['split_candidates']} candidate chains; split: {chosen}"),
        ("simulated peak", f"{human_bytes(before)} -> {human_bytes(after)}  ({before / after:.2f}x)" if after else "-"),
        *(
            [("simulated floor", f"{human_bytes(floor)}  ({before / floor:.2f}x), latency ignored")]
            if (floor := summary.get("peak_floor_bytes"))
            else []
        ),
        (
            "latency (measured)" if unit == "ms" else "instructions (emulated core)",
            (f"{was:.3f} ms -> {now:.3f} ms  " if unit == "ms" else f"{was:,} -> {now:,}  ")
            + f"({now / was - 1:+.1%})",
        ),
        (
            "split search",
            f"{summary['search_seconds']:.1f} s, {summary['plans_simulated']:,} plans simulated, "
            f"{summary['latency_measurements']} {counts} measured, {summary['latency_cache_hits']} from the cache"
            + (
                f" ({summary['whole_model_times_remeasured']} cached whole-model times timed again)"
                if summary.get("whole_model_times_remeasured")
                else ""
            )
            + f"; stopped: {summary['split_reason']}",
        ),
        ("bottleneck now", "; ".join(summary["bottleneck_described"]) or "-"),
        *([("smaller plan", summary["split_advice"])] if summary.get("split_advice") else []),
    ]


def _front_table(summary: dict):
    from rich.table import Table

    unit = summary["latency_unit"]
    table = Table(title=f"split Pareto front (simulated peak vs estimated {'latency' if unit == 'ms' else unit})")
    for column in ("peak", "latency ms" if unit == "ms" else unit, "chains (parts)"):
        table.add_column(column)
    for point in summary["pareto_front"]:
        parts = ", ".join(f"{k} x{v}" for k, v in point["parts"].items()) or "unsplit"
        latency = point[f"latency_{unit}"]
        table.add_row(human_bytes(point["peak_bytes"]), f"{latency:.3f}" if unit == "ms" else f"{latency:,}", parts)
    return table


def run_solve(args: argparse.Namespace) -> int:
    """plan a raw problem in MiniMalloc's CSV format (id,lower,upper,size)

    Place every buffer of PROBLEM.csv (half-open lifetimes [lower, upper)) at an offset."""
    try:
        problem = read_minimalloc_csv(args.problem, alignment=args.alignment)
    except ProblemFormatError as exc:
        raise UserError(str(exc)) from None
    started = time.monotonic()
    plan = plan_memory(problem, time_budget=args.time_budget)
    seconds = time.monotonic() - started
    if args.output:
        write_offsets_csv(args.output, problem, plan.offsets)
    if args.plot:
        from ..plot import plot_layout

        plot_layout(problem, plan.offsets, args.plot, title=Path(args.problem).name, arena_bytes=plan.arena_bytes)
    bound = problem.lower_bound()
    summary = {
        "problem": str(args.problem),
        "buffers": len(problem),
        "arena_bytes": plan.arena_bytes,
        "lower_bound_bytes": bound,
        "arena_over_bound": round(plan.arena_bytes / bound, 4) if bound else 1.0,
        "seconds": round(seconds, 3),
        "allocator": plan.allocator,
        "optimal": plan.optimal,
        "tried": plan.tried,
    }
    if args.json:
        print_json(summary)
        return 0
    rows = [
        ("problem", summary["problem"]),
        ("buffers", f"{len(problem):,}"),
        ("lower bound", f"{bound:,}"),
        ("arena", f"{plan.arena_bytes:,}"),
        ("arena / lower bound", f"{summary['arena_over_bound']:.3f}" + ("  (optimal)" if plan.optimal else "")),
        ("time", f"{seconds:.2f} s ({plan.allocator})"),
    ]
    out = console()
    out.print(key_value_table("tvm-memplan solve", rows))
    out.print(memory_profile(problem, plan.arena_bytes))
    if args.output:
        out.print(f"offsets written to {args.output}")
    return 0
