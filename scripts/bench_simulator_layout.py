"""The split search's simulated peaks beside the planner's arenas in the blocked layout the model is built in.

    python scripts/bench_simulator_layout.py zoo:mcu_cnn exports/mobilenet_v2_035.torchscript.onnx \\
        --out results/simulator_blocked.md

Per model, built in ``--layout blocked`` on this machine's ``host`` target: the simulator's peak sized as NCHW
(``block=None``, the sizes the search used before it knew the layout) and sized in the layout's blocks (channels
rounded up to whole blocks), beside the planned arena, for the unsplit model and for the ``--splits`` single-chain
splits of least simulated peak. Bytes only: nothing is timed, so machine load does not move the figures.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tvm_memplan.deploy.split import split_rewriter
from tvm_memplan.frontend import load_model, to_relax
from tvm_memplan.planner import plan_model
from tvm_memplan.relax.layout import layout_block
from tvm_memplan.relax.pipeline import resolve_target
from tvm_memplan.relax.split import find_chains, in_order, memory_order, normalize, program_of
from tvm_memplan.split.chain import in_channel_blocks
from tvm_memplan.split.simulate import SplitChoice, peak, split_program


def rows(spec: str, splits: int, order_seconds: float) -> list[str]:
    model = load_model(spec)
    block = layout_block(resolve_target("host"), "blocked")
    mod = normalize(to_relax(model))
    order = tuple(memory_order(mod, order_seconds, block=block))
    mod = in_order(mod, order)
    options = {"layout": "blocked", "order_seconds": order_seconds}

    def row(what: str, choices: list[SplitChoice], nchw_sized: int, blocked_sized: int) -> str:
        arena = plan_model(model, "host", prepare=split_rewriter(order, choices), **options).total("arena_bytes")
        ratio = arena / blocked_sized
        return f"| {model.name} | {what} | {nchw_sized:,} | {blocked_sized:,} | {arena:,} | {ratio:.3f} |"

    nchw_program, program = program_of(mod), program_of(mod, block=block)
    out = [row(f"unsplit (NCHW{block}c)", [], peak(nchw_program).bytes, peak(program).bytes)]
    nchw_chains = {c.name: c for c in in_channel_blocks(find_chains(mod), block)}
    chains = [c for c in in_channel_blocks(find_chains(mod, block), block) if c.name in nchw_chains]
    candidates = sorted(
        (peak(split_program(program, [SplitChoice(c, p)])).bytes, c.name, p) for c in chains for p in (2, 4)
    )
    by_name = {c.name: c for c in chains}
    for simulated, name, parts in candidates[:splits]:
        nchw_sized = peak(split_program(nchw_program, [SplitChoice(nchw_chains[name], parts)])).bytes
        out.append(row(f"{name} in {parts}", [SplitChoice(by_name[name], parts)], nchw_sized, simulated))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="zoo:NAME or an ONNX file")
    parser.add_argument("--out", type=Path, required=True, help="the Markdown table to write")
    parser.add_argument("--splits", type=int, default=3, help="single-chain splits per model (least simulated peak)")
    parser.add_argument("--order-seconds", type=float, default=2.0)
    args = parser.parse_args()
    lines = [
        "| model | plan | simulated, NCHW sizes (B) | simulated, blocked sizes (B) | planned arena (B) "
        "| planned / simulated |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for spec in args.models:
        lines += rows(spec, args.splits, args.order_seconds)
    args.out.write_text(__doc__.split("\n\n")[0] + "\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
