"""An int8 model split on an emulated Cortex-M against its unsplit build, and the simulator's splitting floor.

    python scripts/bench_mcu_split.py exports/mobilenet_v2.torchscript.onnx \\
        --out results/bench_mcu_split_mobilenet_v2_224.md --split-cache split-cache.jsonl

The float ONNX model is quantized to int8 QDQ as ``scripts/bench_mcu.py`` quantizes its int8 rows, with int8
codes in and out (``--int8-io``) and TVM's argument checks left out (``--no-kernel-checks``). Then:

- **Builds** (``build --target cortex-m7 --emit-c`` run under ``qemu-system-arm -icount``): unsplit, and split by
  ``--split acg --device qemu-cortex-m7`` within a latency budget in instructions (``--budget``, default 5 %),
  each with the input image outside the arena (MCUNetV2's figure, "input excluded") and inside it
  (``--io-in-arena``, planned with its lifetime). Arena, SRAM, instructions, and agreement with onnxruntime.
- **Floor**: the lowest peak the split search's simulator reaches with no latency budget (greedy descent over
  every spatial chain, as the search moves), with the tensors live at that peak; then the same descent with
  the limits that hold the floor raised (longer chains, more row tiles), simulated only, to show what would
  lower it. ``--floor-only`` skips the builds (no arm toolchain needed), ``--no-floor`` the floor.

``--memory-limit KIB`` searches the plan with the fewest instructions whose simulated peak fits instead (what it
costs to reach the floor).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_mcu import kib, quantized  # noqa: E402

from tvm_memplan.deploy.chain_latency import DEFAULT_CACHE  # noqa: E402
from tvm_memplan.deploy.emit_c import emit_c, int8_io_spec  # noqa: E402
from tvm_memplan.deploy.split import search_split  # noqa: E402
from tvm_memplan.deploy.standalone import measure_c  # noqa: E402
from tvm_memplan.frontend import load_model, to_relax  # noqa: E402
from tvm_memplan.planning import DEFAULT_ALIGNMENT  # noqa: E402
from tvm_memplan.relax.split import describe_tensors, find_chains, in_order, memory_order, normalize, program_of  # noqa: E402
from tvm_memplan.relax.split import spatial_chains as spatial_module  # noqa: E402
from tvm_memplan.relax.split.spatial_chains import LINE_BUFFER_WINDOWS  # noqa: E402
from tvm_memplan.split.chain import LINE_BUFFER_PARTS, SPATIAL_PARTS, SpatialChain, SplitChoice  # noqa: E402
from tvm_memplan.split.search import search  # noqa: E402
from tvm_memplan.split.simulate import Peak, peak, split_program  # noqa: E402

SEARCHED_WINDOWS = spatial_module.SPATIAL_WINDOWS
"""The search's chain limit for tiles that recompute their halos."""
MCUNETV2_KB = 172
"""MCUNetV2's patch-based peak for MobileNetV2 @ 224 int8, input image excluded (kB, its paper's Table 1)."""


@dataclass
class Floor:
    windows: int
    tiles: int
    line_buffer: bool
    peak_bytes: int
    peak_with_input_bytes: int
    chains: list[str]
    live: list[tuple[str, int, str]]
    """(tensor, bytes, described) live at the floor's peak, largest first."""
    stopped: str
    unsplit_bytes: int


@contextmanager
def tile_limit(tiles: int):
    """Spatial chains cut into up to ``tiles`` row tiles that recompute their halos."""
    saved = SpatialChain.max_parts
    SpatialChain.max_parts = tiles
    try:
        yield
    finally:
        SpatialChain.max_parts = saved


def simulated_module(spec: str):
    """The model as the split search simulates it: normalized, in the planner's memory order."""
    mod = normalize(to_relax(load_model(spec)))
    return in_order(mod, tuple(memory_order(mod, 10.0, DEFAULT_ALIGNMENT)))


class _LatencyFree:
    """The floor's measurer: every split costs nothing. Spatial tiles recompute their halos or, with
    ``line_buffer``, keep a rolling line buffer, recomputing halos only within the host's limits (as the
    device search offers them: ``DeviceInstructions.splits``)."""

    def __init__(self, line_buffer: bool) -> None:
        self.line_buffer = line_buffer

    def splits(self, chain, parts: int) -> list[SplitChoice]:
        if not (self.line_buffer and isinstance(chain, SpatialChain)):
            return [SplitChoice(chain, parts)]
        windows = sum(op.window is not None for op in chain.ops)
        recomputed = [SplitChoice(chain, parts)] if windows <= SEARCHED_WINDOWS and parts <= SPATIAL_PARTS else []
        return recomputed + ([SplitChoice(chain, parts, rolling=True)] if chain.has_halo(parts) else [])

    def split_delta(self, choice: SplitChoice) -> float:
        return 0.0


def floor(mod, windows: int, tiles: int, seconds: float, line_buffer: bool = False) -> Floor:
    """The lowest simulated peak of a greedy descent that takes every move lowering the peak (latency free),
    input excluded; and the same plan's peak with the input planned in the arena."""
    with tile_limit(SPATIAL_PARTS if line_buffer else tiles):
        chains = find_chains(mod, None, windows)
        if line_buffer:  # as the device search finds them (search_split)
            chains = [replace(c, line_buffer_parts=tiles) if isinstance(c, SpatialChain) else c for c in chains]
        program = program_of(mod, DEFAULT_ALIGNMENT)
        result = search(program, chains, 1.0, _LatencyFree(line_buffer), budget=float("inf"), seconds=seconds)
    choices = list(result.best.choices)
    split = split_program(program, choices)
    at: Peak = peak(split)
    with_input = peak(split_program(program_of(mod, DEFAULT_ALIGNMENT, inputs_in_arena=True), choices)).bytes
    live = [(name, split.sizes[name], describe_tensors(mod, [name])[0]) for name in at.live]
    chains_split = [f"{c.chain.name} x{c.parts}{', line buffer' if c.rolling else ''}" for c in choices]
    return Floor(
        windows,
        tiles,
        line_buffer,
        at.bytes,
        with_input,
        chains_split,
        live,
        result.stopped,
        result.original.peak_bytes,
    )


def holders(live: list[tuple[str, int, str]], total: int, shown: int = 4) -> str:
    """The largest tensors live at a peak, and how many more small ones (a chain's gathered tiles)."""
    parts = [f"{described} {size / 1024:,.1f} KiB ({size / total:.0%})" for _, size, described in live[:shown]]
    rest = live[shown:]
    if rest:
        parts.append(f"{len(rest)} more ({sum(s for _, s, _ in rest) / 1024:,.1f} KiB)")
    return "; ".join(parts)


def floor_section(spec: str, seconds: float, model_name: str) -> str:
    searched = (LINE_BUFFER_WINDOWS, LINE_BUFFER_PARTS, True)
    recomputed = (SEARCHED_WINDOWS, SPATIAL_PARTS, False)
    variants = [searched, recomputed, (recomputed[0], 64, False), (9, SPATIAL_PARTS, False), (9, 64, False)]
    floors = []
    mod = simulated_module(spec)
    for windows, tiles, line_buffer in variants:
        started = time.monotonic()
        floors.append(floor(mod, windows, tiles, seconds, line_buffer))
        print(
            f"floor, chains of <= {windows} windows in <= {tiles} tiles{', line buffer' if line_buffer else ''}: "
            f"{floors[-1].peak_bytes:,} bytes ({time.monotonic() - started:.0f} s)",
            flush=True,
        )
    lowest = floors[0]
    lines = [
        "## The splitting floor (simulator)\n\n",
        f"The lowest simulated peak of {model_name} (int8) that splitting reaches: a greedy descent over every "
        "spatial chain the axis connection graph finds, taking every move that lowers the peak whatever it costs "
        "(the split search's moves with no latency budget). The first row is what `--split acg --device "
        f"qemu-cortex-m*` can reach: chains of up to {LINE_BUFFER_WINDOWS} convolutions or pools in up to "
        f"{LINE_BUFFER_PARTS} row tiles that keep a rolling line buffer (per kernel: each tile computes only the rows "
        "its previous tile did not, the rows the next tile reads again are copied to the top of its buffer), or, "
        f"within {SEARCHED_WINDOWS} windows and {SPATIAL_PARTS} tiles, tiles that recompute their "
        "halos. The other rows are tiles that recompute their halos only, as the search had them before the line "
        "buffer (the second row) and with those limits raised in the simulator (not built, not measured). Input "
        f"excluded: the input image outside the arena (MCUNetV2's {MCUNETV2_KB} kB figure); included: the same plan "
        "with the input planned in the arena with its lifetime (a descent that counts the input from the start may "
        f"find a lower one). Unsplit, the simulated peak is {kib(floors[0].unsplit_bytes)} KiB.\n\n",
        "| chain windows ≤ | row tiles ≤ | halos | floor, input excluded (KiB) | input included (KiB) | chains split "
        "| live at the peak |\n",
        "|---:|---:|---|---:|---:|---|---|\n",
    ]
    for f in floors:
        lines.append(
            f"| {f.windows} | {f.tiles} | {'line buffer or recomputed' if f.line_buffer else 'recomputed'} | "
            f"{kib(f.peak_bytes)}{' (time limit)' if 'time' in f.stopped else ''} | "
            f"{kib(f.peak_with_input_bytes)} | "
            f"{', '.join(f.chains) or 'none'} | {holders(f.live, f.peak_bytes)} |\n"
        )
    target = MCUNETV2_KB * 1000
    lines.append(
        f"\nThe first row's floor is {lowest.peak_bytes:,} bytes, "
        + (f"within MCUNetV2's {target:,}" if lowest.peak_bytes <= target else f"above MCUNetV2's {target:,}")
        + f". What holds it: {holders(lowest.live, lowest.peak_bytes, 6)}.\n"
    )
    whole = [(n, s, d) for n, s, d in lowest.live if not d.startswith("tile ")]
    for _, size, described in whole:
        lines.append(
            f"- {described}: {size:,} bytes ({size / lowest.peak_bytes:.0%} of the peak), a whole tensor between "
            "two chains: the chain that writes it and the chain that reads it each stop at the window limit.\n"
        )
    if any(d.startswith("tile ") for _, _, d in lowest.live):
        lines.append(
            "- Tiles: at the peak each chain's tile buffers hold the rows one tile computes and those it kept; "
            "more tiles (rows permitting: a tile is at least one row of the chain's last tensor) or a chain "
            "ending earlier would thin them.\n"
        )
    if any("depthwise" in d for _, _, d in lowest.live):
        lines.append(
            "- An in-place depthwise convolution (each output row over input rows no later row reads, as "
            "TinyEngine's kernels write it) would drop the depthwise tile beside its input tile at the peak.\n"
        )
    return "".join(lines)


def build(source: str, directory: Path, core: str, io_in_arena: bool, prepare=None):
    emitted = emit_c(source, directory, core, io_in_arena=io_in_arena, kernel_checks=False, prepare=prepare).model
    return emitted, measure_c(directory, f"qemu-{core}", timeout=3600)


def builds_section(source: str, scratch: Path, args: argparse.Namespace, model_name: str) -> str:
    core = args.core
    rows = {}
    for io in (False, True):
        rows[("unsplit", io)] = build(source, scratch / f"unsplit-{io}", core, io)
        print(f"unsplit, input in arena {io}: {rows[('unsplit', io)][1].instructions:,} instructions", flush=True)
    started = time.monotonic()
    outcome = search_split(
        load_model(source),
        "c",
        budget=args.budget,
        memory_limit=args.memory_limit * 1024 if args.memory_limit else None,
        seconds=args.search_seconds,
        mcu_device=f"qemu-{core}",
        spec=source,
        emit_options={"kernel_checks": False},
        cache=args.split_cache or DEFAULT_CACHE,
    )
    search_wall = time.monotonic() - started
    print(f"split search: {outcome.result.stopped} ({search_wall:.0f} s)", flush=True)
    for io in (False, True):
        rows[("split", io)] = build(source, scratch / f"split-{io}", core, io, prepare=outcome.prepare())
    table = [
        "## Builds on the emulated core\n\n",
        "| build | input | arena (KiB) | = plan | kernel scratch | stack | SRAM (KiB) | flash (KiB) "
        "| instructions (M) | vs unsplit | max abs diff vs onnxruntime |\n",
        "|---|---|---:|:---:|---:|---:|---:|---:|---:|---:|---:|\n",
    ]
    for (kind, io), (emitted, result) in rows.items():
        unsplit = rows[("unsplit", io)][1].instructions
        agreement = f"{result.max_abs_diff:.1e} (≤ {result.tolerance:.1e})" if result.correct else f"NO: {result.error}"
        table.append(
            "| "
            + " | ".join(
                [
                    kind,
                    "in arena" if io else "excluded",
                    kib(result.arena_bytes),
                    "yes" if result.arena_bytes == emitted.arena_bytes else "NO",
                    kib(emitted.workspace_bytes),
                    kib(result.stack_bytes),
                    kib(result.sram_bytes),
                    kib(result.flash_bytes),
                    f"{result.instructions / 1e6:,.1f}",
                    f"{result.instructions / unsplit - 1:+.1%}" if kind == "split" else "-",
                    agreement,
                ]
            )
            + " |\n"
        )
    result = outcome.result
    chosen = ", ".join(f"{c.chain.name} x{c.parts}" for c in outcome.choices) or "none (kept unsplit)"
    split_arena = rows[("split", False)][1].arena_bytes
    target = MCUNETV2_KB * 1000
    table.append(
        f"\nSplit search (`--split acg --device qemu-{core} "
        + (f"--memory-limit {args.memory_limit}K`: the fewest instructions that fit" if args.memory_limit else "")
        + (f"--latency-budget {args.budget}`" if not args.memory_limit else "")
        + f", `--search-seconds {args.search_seconds:g}`): "
        f"{chosen}; simulated peak {kib(result.original.peak_bytes)} -> "
        f"{kib(result.best.peak_bytes)} KiB; {outcome.cache_misses} programs measured on the core, "
        f"{outcome.cache_hits} from the cache; {search_wall:.0f} s; stopped: {result.stopped}. "
        f"MCUNetV2's {MCUNETV2_KB} kB ({target:,} bytes, input excluded): "
        + ("met" if split_arena <= target else f"not met ({split_arena:,} bytes)")
        + ".\n\n"
    )
    return "".join(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a float ONNX model (or a zoo: spec)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--core", default="cortex-m7", choices=["cortex-m4", "cortex-m7", "cortex-m55"])
    parser.add_argument("--budget", type=float, default=0.05, help="the split search's latency budget (fraction)")
    parser.add_argument("--search-seconds", type=float, default=600.0, help="the device split search's time limit")
    parser.add_argument("--floor-seconds", type=float, default=600.0, help="time limit of each floor descent")
    parser.add_argument("--split-cache", type=Path, help="device measurements to reuse (default: the user's)")
    parser.add_argument(
        "--memory-limit",
        type=int,
        metavar="KIB",
        help="search the plan with the fewest instructions whose simulated peak fits (input excluded), not the budget",
    )
    parser.add_argument("--floor-only", action="store_true", help="only the simulator's floor (no builds)")
    parser.add_argument("--no-floor", action="store_true", help="only the builds (no floor section)")
    args = parser.parse_args()
    name = Path(args.model).name if not args.model.startswith("zoo:") else args.model.removeprefix("zoo:")
    command = " ".join(["python scripts/bench_mcu_split.py", *sys.argv[1:]])
    with tempfile.TemporaryDirectory(prefix="bench-mcu-split-") as scratch:
        source = int8_io_spec(quantized(args.model, Path(scratch)), Path(scratch))
        sections = [] if args.floor_only else [builds_section(source, Path(scratch), args, name)]
        if not args.no_floor:
            sections.append(floor_section(source, args.floor_seconds, name))
    header = (
        f"# {name} int8 split on the emulated {args.core}, and its splitting floor\n\n"
        "KiB = 1024 bytes. The model quantized to int8 QDQ as `scripts/bench_mcu.py` quantizes its int8 rows "
        "(random normal calibration), int8 codes in and out (`--int8-io`), `--no-kernel-checks`. Arena = "
        "`memplan_arena` in the linked ELF (`= plan`: equal to the planned arena); SRAM = .data + .bss + measured "
        "stack (with the harness's input/output buffers where the input is excluded from the arena); "
        "instructions retired under `qemu-system-arm -icount shift=0`; `vs unsplit`: over the unsplit build "
        "with the same input placement, in the same run.\n\n"
        f"Written by `{command}`.\n\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_suffix(".tmp")
    partial.write_text(header + "".join(sections))
    partial.replace(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
