"""``tvm-memplan compare-groups MODEL --groups seq,1,2,4,8``: layer-grouping settings side by side
(docs/design.md, "Layer grouping").

Formerly ``bench``, which still works with a deprecation note."""

from __future__ import annotations

import argparse

from rich.table import Table

from .format import console, human_bytes, print_json, progress_display
from .plan import model_planner_kwargs, model_planner_options
from .vocabulary import add_command, add_json, add_repeats, add_rpc_device, add_target, deprecation_note


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..deploy.groups import DEFAULT_SETTINGS

    bench = add_command(subparsers, "compare-groups", run_bench, aliases=["bench"])
    bench.add_argument("model", metavar="MODEL", help="ONNX file or zoo:NAME[?k=v&...]")
    bench.add_argument(
        "--groups",
        dest="group_settings",
        default=DEFAULT_SETTINGS,
        metavar="LIST",
        help=f"comma-separated settings: seq, group counts, auto (default {DEFAULT_SETTINGS})",
    )
    add_target(bench)
    add_rpc_device(bench)
    add_repeats(bench, per=" per setting and round")
    bench.add_argument("--rounds", type=int, default=1, help="interleaved rounds over all builds (default 1)")
    add_json(bench, 'print {"rows": [...], ...} instead of the table')
    model_planner_options(bench, groups=False)


def run_bench(args: argparse.Namespace) -> int:
    """layer-grouping settings side by side: latency, arena and launches per setting ('bench' is deprecated)

    Plan, build, check and time MODEL ungrouped (TVM's planner, memplan) and with each layer-grouping setting, on
    this machine or a device from an RPC tracker, in one run."""
    from ..deploy.groups import bench_groups, parse_group_settings

    if args.command == "bench":
        deprecation_note("tvm-memplan bench", "tvm-memplan compare-groups")
    settings = parse_group_settings(args.group_settings)
    options = model_planner_kwargs(args)
    options.pop("groups")
    with progress_display() as bar:
        current: dict[str, int] = {}

        def progress(pipeline: str, step: str, done: int, total: int) -> None:
            if bar is None:
                return
            if done == 1:  # each build's measurement starts with its upload
                current["task"] = bar.add_task(pipeline, total=total)
            bar.update(current["task"], completed=done, description=f"{pipeline}: {step}")

        result = bench_groups(
            args.model,
            settings,
            args.target,
            args.rpc_tracker,
            args.rpc_key,
            args.repeat,
            args.min_repeat_ms,
            progress,
            args.rounds,
            **options,
        )
    if args.json:
        print_json(result.summary())
    else:
        _print_bench(result)
    return 0 if all(r.correct and r.identical for r in result.rows) else 1


def _print_bench(result) -> None:
    threads = f", TVM_NUM_THREADS={result.tvm_num_threads}" if result.tvm_num_threads else ""
    table = Table(title=f"{result.model} on {result.device} ({result.target}{threads})", title_justify="left")
    for column in (
        "setting",
        "latency",
        "IQR",
        "arena",
        "no F-predicate",
        "launches",
        "fused launches",
        "layers",
        "identical",
        "VM = plan",
    ):
        table.add_column(column, justify="left" if column == "setting" else "right")
    for r in result.rows:
        setting = f"groups={r.groups}" if r.groups is not None else f"{r.pipeline} (ungrouped)"
        table.add_row(
            setting,
            f"{r.latency_ms:.3f} ms",
            f"{r.latency_spread_ms:.3f} ms",
            human_bytes(r.arena_bytes),
            human_bytes(r.unconstrained_arena_bytes) if r.unconstrained_arena_bytes is not None else "-",
            str(r.launches),
            str(r.group_launches) if r.group_launches is not None else "-",
            str(r.layers) if r.layers is not None else "-",
            "yes" if r.identical else "NO",
            "-" if r.requested_equals_plan is None else ("yes" if r.requested_equals_plan else "NO"),
        )
    out = console()
    out.print(table)
    out.print(
        f"no planning (every tensor its own memory): {human_bytes(result.naive_bytes)}; "
        f"TVM default: {human_bytes(result.tvm_default_bytes)}"
    )
    choice = result.choice()
    out.print(
        f"measured choice: groups={choice}"
        if choice is not None
        else "measured choice: ungrouped (no setting beat it by more than the spreads)"
    )
