#!/usr/bin/env python3
"""One blocked convolution timed under the schedule's choices and the alternatives: register tiles, task orders.

    TVM_NUM_THREADS=2 python scripts/time_blocked_conv.py 64x56x56:64:3 512x7x7:2048:1 1024x14x14:2048:1s2 \\
        --tiles 4x4 2x14 2x8 --orders rows channels --out results/blocked_conv_variants.md

Each convolution (``CINxHxW:COUT:K[sSTRIDE]``, padding ``K // 2``, bias and ReLU as a network's) is a one-layer
ONNX model, planned and scheduled as ``tvm_memplan.pipeline`` builds it in the blocked layout for ``--target``;
``default`` is the schedule's own choice, each ``--tiles CxW`` forces the register tile (C channel blocks by W
output columns) and each ``--orders`` the tasks (``rows``: output rows outermost, each rereads the weights;
``channels``: channel tiles outermost, each rereads the input). Every variant is checked against the default's
output and timed in ``--repeat`` interleaved rounds (a machine whose speed drifts moves them all alike), two ways:
warm (20 calls on one set of arguments) and with cold weights (the weights rotated through ``--rotate-mib`` of
copies, as a network's weights come from memory while its activations come from the caches the layer before left
them in); each the best round. It is the tool
for a machine where the whole networks lose (``profile_kernels.py`` beside ``profile_onnxruntime.py`` names the
kernels): it shows whether a kernel is bound by its tile or by the bytes its task order rereads there.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import platform
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

SPEC = re.compile(r"^(\d+)x(\d+)x(\d+):(\d+):(\d+)(?:s(\d+))?$")


def conv_model(spec: str):
    """The one-layer model of ``spec``: Conv (padding K // 2) + bias, then ReLU, random weights, built by the
    zoo's :class:`~tvm_memplan.zoo.graph.GraphBuilder`."""
    from tvm_memplan.frontend import LoadedModel
    from tvm_memplan.zoo.graph import GraphBuilder

    match = SPEC.match(spec)
    if not match:
        raise SystemExit(f"time_blocked_conv.py: {spec!r} is not CINxHxW:COUT:K[sSTRIDE], e.g. 64x56x56:64:3")
    cin, height, width, cout, kernel = (int(g) for g in match.groups()[:5])
    builder = GraphBuilder(spec)
    x = builder.input((1, cin, height, width))
    y = builder.conv(x, cout, kernel, stride=int(match.group(6) or 1), bias=True, act="relu")
    return LoadedModel(spec, builder.finish(y))


@contextlib.contextmanager
def forced(tile: tuple[int, int] | None, order: str | None) -> Iterator[None]:
    """The blocked-convolution rule with its register tile and/or task order replaced while scheduling."""
    from tvm_memplan.schedule.cpu import blocked_conv

    saved = blocked_conv.register_tile, blocked_conv._weights_first
    if tile:
        blocked_conv.register_tile = lambda *args, **kwargs: tile
    if order:
        blocked_conv._weights_first = lambda block, rows: order == "channels"
    try:
        yield
    finally:
        blocked_conv.register_tile, blocked_conv._weights_first = saved


def conv_kernel(spec: str, target, tile: tuple[int, int] | None, order: str | None):
    """The scheduled blocked-convolution PrimFunc of ``spec``'s model under the forced choices."""
    import tvm
    from tvm import tirx

    from tvm_memplan.planner import plan_model
    from tvm_memplan.relax.pipeline import schedule_passes

    plan = plan_model(conv_model(spec), target, order="program", time_budget=1, layout="blocked")
    with forced(tile, order), plan.target:
        module = tvm.transform.Sequential(schedule_passes(plan.target, plan.options))(plan.stock_staged)
    (func,) = (
        f for gv, f in module.functions.items() if isinstance(f, tirx.PrimFunc) and "conv2d_nchwc" in gv.name_hint
    )
    return func, plan.target


class Variant:
    """One variant's built kernel on its arguments, with the weights' copies its cold runs rotate through."""

    def __init__(self, func, target, rotate_mib: float) -> None:
        import tvm

        self.func = func
        library = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
        dev = tvm.cpu()
        rng = np.random.default_rng(0)
        first = [rng.standard_normal([int(d) for d in p.shape]).astype("float32") for p in func.params]
        self.arguments = [tvm.runtime.tensor(a, dev) for a in first]
        self.function = library["main"]
        self.function(*self.arguments)
        self.output = self.arguments[-1].numpy()
        self.evaluator = library.time_evaluator("main", dev, number=20, repeat=1)
        # cold weights: a network's weights come from memory (100 MiB for ResNet-50), its activations from the
        # caches the layer before left them in, so only the weights (the 6-D parameter) are rotated
        self.weights = next(i for i, p in enumerate(func.params) if len(p.shape) == 6)
        copies = max(2, math.ceil(rotate_mib * 2**20 / first[self.weights].nbytes))
        self.copies = [tvm.runtime.tensor(first[self.weights], dev) for _ in range(copies)]
        self.warm, self.cold = [], []

    def time_round(self) -> None:
        """One warm measurement (20 calls on the same arguments) and one cold pass over the weights' copies."""
        self.warm.append(self.evaluator(*self.arguments).mean)
        arguments = list(self.arguments)
        start = time.perf_counter()
        for copy in self.copies:
            arguments[self.weights] = copy
            self.function(*arguments)
        self.cold.append((time.perf_counter() - start) / len(self.copies))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "convolutions", nargs="+", help="CINxHxW:COUT:K[sSTRIDE], e.g. 64x56x56:64:3 1024x14x14:2048:1s2"
    )
    parser.add_argument("--target", help="a TVM target this machine runs (default: this CPU)")
    parser.add_argument(
        "--tiles", nargs="*", default=[], help="register tiles to force, CxW (channel blocks x columns)"
    )
    parser.add_argument("--orders", nargs="*", default=[], choices=["rows", "channels"], help="task orders to force")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--rotate-mib", type=float, default=96.0, help="cold timings rotate the weights over this many MiB"
    )
    parser.add_argument("--out", type=Path, help="write the table here (default: print it)")
    args = parser.parse_args()
    import tvm

    from tvm_memplan.deploy.results import write_or_print
    from tvm_memplan.deploy.targets import get_target

    target = get_target(args.target).tvm_target() if args.target else tvm.target.Target.from_device("cpu")
    tiles = [tuple(int(n) for n in tile.split("x")) for tile in args.tiles]
    variants = [("default", None, None)]
    variants += [(f"tile {c}x{w}", (c, w), None) for c, w in tiles]
    variants += [(f"order {order}", None, order) for order in args.orders]
    lines = [
        f"## Blocked convolutions under forced choices ({datetime.date.today()})",
        "",
        f"Target `{target}`, TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS', 'unset')}, host "
        f"{platform.machine()} with {os.cpu_count()} cores; {args.repeat} interleaved rounds over the variants; warm: "
        "the best round's mean of 20 calls on one argument set; cold: the weights from memory, the best round's pass "
        f"over copies of them rotated through {args.rotate_mib:g} MiB (the activations warm). Every variant's "
        "output equals the default's. Produced by `scripts/time_blocked_conv.py`.",
        "",
        "| convolution | variant | tile (blocks x columns) | tasks | warm us | cold us | cold / default |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for spec in args.convolutions:
        built: dict[str, Variant] = {}
        for name, tile, order in variants:
            try:
                func, build_target = conv_kernel(spec, target, tile, order)
                built[name] = Variant(func, build_target, args.rotate_mib)
            except Exception as error:  # a forced tile the rule cannot apply: say so, keep going
                lines.append(
                    f"| {spec} | {name} | — | — | {type(error).__name__}: {str(error).splitlines()[0][:80]} | | |"
                )
                continue
            np.testing.assert_allclose(built[name].output, built["default"].output, rtol=1e-4, atol=1e-4)
        # interleaved rounds, so that a machine whose speed drifts moves every variant alike
        for _ in range(args.repeat):
            for variant in built.values():
                variant.time_round()
        default_cold = min(built["default"].cold) * 1e6
        for name, variant in built.items():
            script = variant.func.script()
            # the update's first two unrolled loops: its columns, then its channel blocks (a tail tile comes later)
            unrolled = [
                int(n)
                for loop, n in re.findall(r"for (\w+) in T\.unroll\(T\.int64\((\d+)\)\)", script)
                if not loop.endswith("_init")
            ]
            parallel = re.findall(r"for (\w+) in T\.parallel", script)
            tasks = parallel[-1] if parallel else "serial"
            shown = f"{unrolled[1]} x {unrolled[0]}" if len(unrolled) >= 2 else "?"
            warm, cold = min(variant.warm) * 1e6, min(variant.cold) * 1e6
            lines.append(
                f"| {spec} | {name} | {shown} | `{tasks}` | {warm:,.0f} | {cold:,.0f} | {cold / default_cold:.2f} |"
            )
            print(lines[-1], file=sys.stderr, flush=True)  # progress; the table itself goes to --out or stdout
    text = "\n".join(lines) + "\n"
    write_or_print(args.out, text)


if __name__ == "__main__":
    main()
