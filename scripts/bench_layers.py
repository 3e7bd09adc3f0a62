#!/usr/bin/env python3
"""Layer grouping (seed 000) on its five networks: seed 000's table 1, measured here on CPU.

Per network, in one run on one machine, through ``tvm_memplan.deploy.groups.bench_groups``:
TVM's planner and the ungrouped memplan pipeline (order search, in-place, arena), then every
group setting (layer-wise order, the F-predicate in the arena; ``seq`` = one kernel a group,
the seed's "layer-wise" row). Each build is checked bit-identical to the ungrouped build and
the VM's storage requests against the plan. Builds are timed in interleaved rounds (forward,
then reversed) so that drift on a shared machine hits all alike; latency is the median over all
repeats, spread the interquartile range. "Launches" are the kernel launches the VM made in one
call, traced on the device: on a GPU target a group whose kernels were fused is one launch; on CPU
every kernel is its own, and "groups" is what one launch per group would be.

    TVM_NUM_THREADS=2 python scripts/bench_layers.py                      # the five networks, published sizes
    TVM_NUM_THREADS=2 python scripts/bench_layers.py --resolution 96 --models googlenet
    python scripts/bench_layers.py --target vulkan --resolution 32 --models googlenet --append
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path

from tvm_memplan import zoo
from tvm_memplan.deploy.groups import GroupBench, bench_groups, parse_group_settings

SEED_NETWORKS = ("resnext50_32x4d", "googlenet", "mobilenet_v2", "xception", "inception_v3")
LIMIT = 1.05
"""Issue 11: with one group per layer the arena stays within 5 % of the unconstrained arena."""


def spec(name: str, resolution: int | None) -> str:
    return zoo.format_spec(name, {"resolution": resolution} if resolution else None)


def mib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:.2f}"


def table(bench: GroupBench) -> list[str]:
    lines = [
        f"### {bench.model}",
        "",
        f"No planning (every tensor its own memory) {mib(bench.naive_bytes)} MiB; TVM default "
        f"{mib(bench.tvm_default_bytes)} MiB.",
        "",
        "| setting | latency ms (IQR) | arena MiB | arena without F MiB | launches (traced) | groups | layers | "
        "identical | VM = plan |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in bench.rows:
        setting = f"groups={r.groups}" if r.groups is not None else f"{r.pipeline}, ungrouped"
        lines.append(
            f"| {setting} | {r.latency_ms:.2f} ({r.latency_spread_ms:.2f}) | {mib(r.arena_bytes)} | "
            f"{mib(r.unconstrained_arena_bytes)} "
            f"| {r.launches} | {r.group_launches if r.group_launches is not None else '-'} | "
            f"{r.layers if r.layers is not None else '-'} "
            f"| {'yes' if r.identical else 'NO'} | "
            f"{'-' if r.requested_equals_plan is None else ('yes' if r.requested_equals_plan else 'NO')} |"
        )
    return lines


def summary(benches: list[GroupBench]) -> list[str]:
    """The 5 % check of issue 11 per network, against both meanings of "unconstrained"."""
    lines = [
        "### g = 1 against the unconstrained arena",
        "",
        "| network | g=1 arena MiB | same order without F MiB | ratio | memplan ungrouped MiB | ratio | within 5 % of "
        "both |",
        "|---|---|---|---|---|---|---|",
    ]
    for bench in benches:
        one = next((r for r in bench.rows if r.groups == 1), None)
        ungrouped = next(r for r in bench.rows if r.groups is None and r.pipeline == "memplan")
        if one is None:
            continue
        same = one.arena_bytes / one.unconstrained_arena_bytes
        default = one.arena_bytes / ungrouped.arena_bytes
        lines.append(
            f"| {bench.model} | {mib(one.arena_bytes)} | {mib(one.unconstrained_arena_bytes)} | {same:.3f} "
            f"| {mib(ungrouped.arena_bytes)} | {default:.3f} | {'yes' if max(same, default) <= LIMIT else 'NO'} |"
        )
    return lines


def device_note(target: str, machine: str) -> str:
    """The device a GPU target ran on here, and whether it is a software one (Mesa's lavapipe, PoCL's CPU device)."""
    import tvm

    from tvm_memplan.deploy.targets import get_target

    name = tvm.device(get_target(target).device, 0).device_name
    software = any(word in name for word in ("llvmpipe", "pthread", "cpu"))
    note = (
        f"a software device: its kernels run on this machine's CPU, {machine}; latencies say nothing about a GPU"
        if software
        else machine
    )
    return f"target `{target}` on {name} ({note})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(SEED_NETWORKS), choices=zoo.names())
    parser.add_argument("--groups", default="seq,1,2", help="settings to compare (default seq,1,2, the seed's)")
    parser.add_argument(
        "--resolution", type=int, help="input size for every network (default: each one's published size)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="timed repeats per build and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds over all builds of a network")
    parser.add_argument("--time-budget", type=float, default=2.0, help="allocator search seconds per arena")
    parser.add_argument(
        "--target", default="host", help="deploy target run on this machine (default host; vulkan, opencl, ...)"
    )
    parser.add_argument("--out", type=Path, default=Path("results/bench_layers.md"))
    parser.add_argument(
        "--append", action="store_true", help="add this run's section to --out instead of replacing the file"
    )
    args = parser.parse_args(argv)
    settings = parse_group_settings(args.groups)
    benches = []
    for name in args.models:
        print(f"{name} ...", file=sys.stderr, flush=True)
        benches.append(
            bench_groups(
                spec(name, args.resolution),
                settings,
                target=args.target,
                repeat=args.repeat,
                rounds=args.rounds,
                time_budget=args.time_budget,
            )
        )
        print("\n".join(table(benches[-1])), file=sys.stderr)
    threads = os.environ.get("TVM_NUM_THREADS", "unset (one thread)")
    size = f"{args.resolution}x{args.resolution} inputs" if args.resolution else "published input sizes"
    machine = f"{platform.machine()} with {os.cpu_count()} cores (shared with other jobs: latencies are noisy)"
    where = (
        f"CPU `host`, TVM_NUM_THREADS={threads}, {machine}"
        if args.target == "host"
        else device_note(args.target, machine)
    )
    lines = [
        f"## Layer grouping on seed 000's networks, {args.target} ({datetime.date.today().isoformat()})",
        "",
        f"{where}, {size}, batch 1, float32, {args.rounds} interleaved rounds x {args.repeat} repeats per build "
        f"(latency: median over all repeats, IQR in brackets). "
        f"Produced by `python scripts/bench_layers.py {' '.join(argv if argv is not None else sys.argv[1:])}`.",
        "",
    ]
    for bench in benches:
        lines += table(bench) + [""]
    lines += summary(benches)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    before = args.out.read_text() + "\n" if args.append and args.out.exists() else ""
    args.out.write_text(before + "\n".join(lines) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
