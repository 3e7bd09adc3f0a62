"""Memory and cost of whole models as standalone C on emulated Cortex-M cores, as a Markdown table.

    python scripts/bench_mcu.py --out results/bench_mcu.md

Each row is ``build --target CPU --emit-c`` then ``measure DIR --device qemu-CPU``: the arena is the
size of ``memplan_arena`` in the linked ELF, SRAM is ``.data + .bss`` plus the measured stack
high-water mark, flash is ``.text + .rodata + .data``, instructions are counted under
``qemu -icount``. Split rows first run the fine-grained split search (``--split acg``) with the
SRAM budget as its memory limit. Int8 rows quantize the float model first (``tvm-memplan quantize
--int8``: onnxruntime's ``quantize_static``, QDQ, per-channel int8 weights, int8 activations, MinMax
on random normal calibration inputs) and are checked against onnxruntime's run of the same QDQ file
within its own optimized-vs-unoptimized spread (at least 2 LSB; rows built with ``--requantize fixed``, the
fixed-point requantization, within that spread as measured, in LSB); their instructions are also given
as a ratio to the float row of the same model and core, measured in the same run. ``--model PATH``
adds a float ONNX file (a torchvision export, say) with the rows MobileNetV2-0.35 @ 144 has on the
Cortex-M7: float32, int8, int8 as firmware, split for the firmware, the fixed-point requantization.
Needs gcc-arm-none-eabi, libnewlib-arm-none-eabi, qemu-system-arm.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from tvm_memplan.deploy.chain_latency import DEFAULT_CACHE
from tvm_memplan.deploy.emit_c import emit_c, int8_io_spec
from tvm_memplan.deploy.split import search_split
from tvm_memplan.deploy.standalone import measure_c
from tvm_memplan.frontend import load_model

SRAM_LIMIT = 512 * 1024
FLASH_LIMIT = 2 * 1024 * 1024
"""STM32F767 (seed 003): 512 KiB SRAM, 2 MiB flash."""
RESERVE = 16 * 1024
"""SRAM left to kernel scratch, stack and runtime when a split plan is searched for the arena."""
SPLIT_LIMIT = SRAM_LIMIT - RESERVE
INT8_SPLIT_LIMIT = 132 * 1024
"""The int8 split row's search limit: the simulated peak with the int8 input in the arena (``--io-in-arena``
counts it until the first chain's last tile has read it), leaving SRAM to kernel scratch and stack below
the 148 KB issue 26 asks for. At 128 KiB the search kept a plan 5.2 % above the unsplit instructions; 132 KiB (and
136 KiB, which kept the same plan) lets a cheaper one fit, and the arena with scratch and stack stays under 148 KB
(the row's SRAM column checks it)."""
FIRMWARE = {"io_in_arena": True, "int8_io": True, "kernel_checks": False}
"""The int8 rows as firmware ships them (``--io-in-arena --int8-io --no-kernel-checks``): inputs and outputs in
the arena, int8 codes in and out, TVM's argument checks and their messages left out."""
SPLIT_DEVICE = {"io_in_arena": True, "int8_io": True, "kernel_checks": False, "split_device": "qemu-cortex-m7"}
"""The int8 split row: firmware's options, its split search counting instructions on the emulated M7."""
FIXED = {"requantize": "fixed"}
"""``--requantize fixed``: the C kernels' fixed-point requantization, checked by the issue's rule for it: the
outputs within onnxruntime's own optimized-vs-unoptimized spread on the same input, in LSB, with no floor."""
ROWS = [
    ("zoo:mcu_cnn", "cortex-m7", None, False, {}),
    ("zoo:mcu_cnn", "cortex-m7", None, True, {}),
    ("zoo:mcu_cnn", "cortex-m4", None, False, {}),
    ("zoo:mcu_cnn", "cortex-m55", None, False, {}),
    ("zoo:mobilenet_v2?width=0.35&resolution=96", "cortex-m7", None, False, {}),
    ("zoo:mobilenet_v2?width=0.35&resolution=144", "cortex-m7", None, False, {}),
    ("zoo:mobilenet_v2?width=0.35&resolution=144", "cortex-m7", SPLIT_LIMIT, False, {}),
    ("zoo:mobilenet_v2?width=0.35&resolution=144", "cortex-m7", None, True, {}),
    ("zoo:mobilenet_v2?width=0.35&resolution=144", "cortex-m7", None, True, FIRMWARE),
    ("zoo:mobilenet_v2?width=0.35&resolution=144", "cortex-m7", INT8_SPLIT_LIMIT, True, SPLIT_DEVICE),
    ("zoo:mobilenet_v2?width=0.35&resolution=144", "cortex-m7", None, True, FIXED),
    ("zoo:mobilenet_v2?width=0.35&resolution=144", "cortex-m7", None, True, {**FIRMWARE, **FIXED}),
]
"""(model, core, memory limit of the split search or None for no split, int8, :func:`emit_c` options)."""
MODEL_ROWS = [
    (None, False, {}),
    (None, True, {}),
    (None, True, FIRMWARE),
    (INT8_SPLIT_LIMIT, True, SPLIT_DEVICE),
    (None, True, FIXED),
]
"""Each ``--model``'s rows on the Cortex-M7, as MobileNetV2-0.35 @ 144's: float32, int8, int8 as firmware ships it
and split for the firmware (its search counting instructions on the core), int8 with the fixed-point requantization."""
PUBLISHED = (
    "Published int8 figures for comparison (not measured here: other chips, kernels and time, not instructions): "
    "MobileNetV2-w0.35 on an STM32H743 (512 KB SRAM, 2 MB flash), TinyEngine 295 kB peak SRAM and 124 ms, X-CUBE-AI "
    "7.3 296 kB and 118 ms, as TinyEngine's README (https://github.com/mit-han-lab/tinyengine) gives them; the "
    "`published` column repeats them on the int8 rows of that network."
)
PUBLISHED_SRAM = "TinyEngine 295 kB, 124 ms; X-CUBE-AI 7.3 296 kB, 118 ms"
"""The published int8 peak SRAM and latency of MobileNetV2-w0.35 on an STM32H743 (:data:`PUBLISHED`)."""


def published(spec: str, int8: bool) -> str:
    """The published figures for an int8 row of MobileNetV2-w0.35 (the zoo model or its export), else ``-``."""
    name = Path(spec).name
    width_035 = "mobilenet_v2?width=0.35" in spec or name.startswith("mobilenet_v2_035")
    return PUBLISHED_SRAM if int8 and width_035 else "-"


FLAGS = {
    "io_in_arena": ("--io-in-arena", False),
    "int8_io": ("--int8-io", False),
    "kernel_checks": ("--no-kernel-checks", True),
    "split_device": ("--device qemu-cortex-m7", None),
    "requantize": ("--requantize fixed", "exact"),
}
"""A row's :func:`emit_c` options as ``build`` flags in the model column, where not at their default."""


def kib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 1024:,.1f}"


def quantized(spec: str, scratch: Path) -> str:
    """``spec`` quantized to int8 QDQ in ``scratch`` (random normal calibration, as ``quantize --int8``)."""
    import onnx

    from tvm_memplan.quant.calibrate import quantize_int8

    model = load_model(spec)
    source, target = scratch / f"float-{abs(hash(spec))}.onnx", scratch / f"{model.name.split('?')[0]}.int8.onnx"
    onnx.save(model.onnx_model, str(source))
    rng = np.random.default_rng(0)
    calib = {name: rng.standard_normal((8, *shape[1:])).astype(dtype) for name, shape, dtype in model.input_specs()}
    quantize_int8(source, target, calib)
    return str(target)


def measure_row(
    spec: str,
    cpu: str,
    split_limit: int | None,
    int8: bool,
    standalone: dict,
    scratch: Path,
    search_seconds: float,
    split_cache: Path | None = None,
):
    options = {key: value for key, value in standalone.items() if key not in ("int8_io", "split_device")}
    directory = scratch / f"{cpu}-{abs(hash((spec, split_limit, int8, tuple(standalone.items()))))}"
    source = quantized(spec, scratch) if int8 else spec
    if standalone.get("int8_io"):  # the split search, the build and the check take the graph with int8 I/O
        source = int8_io_spec(source, directory)
    if split_limit is not None:
        # latencies of the split candidates: the same C kernels timed on this machine, or with split_device
        # the instructions of the standalone C on the emulated core (build --split acg --device qemu-cortex-m7)
        outcome = search_split(
            load_model(source),
            "c",
            memory_limit=split_limit,
            seconds=search_seconds,
            io_in_arena=standalone.get("io_in_arena", False),
            mcu_device=standalone.get("split_device"),
            spec=source,
            emit_options={k: standalone[k] for k in ("kernel_checks", "requantize") if k in standalone},
            cache=split_cache or DEFAULT_CACHE,
        )
        print(
            f"split search ({outcome.unit}): "
            + (", ".join(f"{c.chain.name} x{c.parts}" for c in outcome.choices) or "unsplit")
            + f"; {outcome.latency_before_ms:,.4g} -> {outcome.latency_after_ms:,.4g}, "
            f"{outcome.cache_misses} measured, {outcome.cache_hits} cached; {outcome.result.stopped}",
            flush=True,
        )
        options["prepare"] = outcome.prepare()
    emitted = emit_c(source, directory, cpu, **options).model
    return emitted, measure_c(directory, f"qemu-{cpu}", timeout=3600)


def row(
    spec: str,
    cpu: str,
    split_limit: int | None,
    int8: bool,
    standalone: dict,
    emitted,
    result,
    float_instructions: int | None,
    unsplit_instructions: int | None = None,
) -> str:
    io_bytes = sum(int(np.prod(t["shape"])) * np.dtype(t["dtype"]).itemsize for t in emitted.inputs + emitted.outputs)
    # inputs and outputs in the arena are part of it (and of SRAM) already: nothing to take off
    without_io = result.sram_bytes - (0 if emitted.io_in_arena else io_bytes)
    name = spec.removeprefix("zoo:") if spec.startswith("zoo:") else Path(spec).name
    ratio = f"{result.instructions / float_instructions:.2f}" if int8 and float_instructions else "-"
    if standalone.get("requantize", "exact") != "exact":  # the rule: onnxruntime's own spread, no floor
        within = result.correct and result.diff_lsb is not None and result.diff_lsb <= result.spread_lsb
        agreement = f"{result.diff_lsb} LSB (≤ {result.spread_lsb} LSB)" + ("" if within else " NO")
    elif not result.correct:
        agreement = "NO"
    else:
        agreement = f"{result.max_abs_diff:.1e}" + (f" (≤ {result.tolerance:.1e})" if result.tolerance else "")
    flags = [flag for key, (flag, default) in FLAGS.items() if standalone.get(key, default) != default]
    cells = [
        name + (f" + split ≤ {split_limit // 1024} KiB" if split_limit else "") + "".join(f" {f}" for f in flags),
        "int8" if int8 else "float32",
        cpu,
        kib(result.arena_bytes),
        "yes" if result.arena_bytes == emitted.arena_bytes else "NO",
        kib(emitted.tvm_default_bytes),
        kib(emitted.naive_bytes),
        kib(emitted.workspace_bytes),
        kib(result.stack_bytes),
        f"{kib(io_bytes)} in arena" if emitted.io_in_arena else kib(io_bytes),
        kib(result.sram_bytes),
        kib(without_io),
        kib(result.flash_bytes),
        kib(emitted.weight_bytes),
        kib(result.flash_bytes - emitted.weight_bytes),
        f"{result.instructions / 1e6:,.1f}",
        f"{result.instructions / unsplit_instructions - 1:+.1%}" if split_limit and unsplit_instructions else "-",
        ratio,
        agreement,
        "yes" if without_io <= SRAM_LIMIT else "no",
        "yes" if result.flash_bytes <= FLASH_LIMIT else "no",
        published(spec, int8),
    ]
    return "| " + " | ".join(cells) + " |\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/bench_mcu.md"))
    parser.add_argument("--search-seconds", type=float, default=60.0, help="split search time limit")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="PATH",
        help="a float ONNX model to add as float and int8 rows on the Cortex-M7 (repeatable)",
    )
    parser.add_argument(
        "--rows",
        default=None,
        metavar="N,N,...",
        help="only these rows of the table (1-based, in ROWS order then --model's); an int8 row's ratio needs its "
        "float row among them",
    )
    parser.add_argument(
        "--int8-split-limit",
        type=int,
        default=INT8_SPLIT_LIMIT // 1024,
        metavar="KIB",
        help=f"the int8 split row's search limit in KiB (default {INT8_SPLIT_LIMIT // 1024})",
    )
    parser.add_argument("--split-cache", type=Path, help="split search measurements to reuse (default: the user's)")
    args = parser.parse_args()
    int8_limit = args.int8_split_limit * 1024
    rows = [(s, c, int8_limit if lim == INT8_SPLIT_LIMIT and q else lim, q, o) for s, c, lim, q, o in ROWS]
    rows += [
        (path, "cortex-m7", int8_limit if lim == INT8_SPLIT_LIMIT else lim, q, o)
        for path in args.model
        for lim, q, o in MODEL_ROWS
    ]
    chosen = "" if int8_limit == INT8_SPLIT_LIMIT else f" --int8-split-limit {args.int8_split_limit}"
    if args.rows:
        try:
            picked = [int(item) for item in args.rows.split(",")]
        except ValueError:
            parser.error(f"--rows takes comma-separated row numbers, not {args.rows!r}")
        if not all(1 <= item <= len(rows) for item in picked):
            parser.error(f"--rows: the table has rows 1 to {len(rows)}")
        chosen += f" --rows {args.rows}"
        rows = [rows[item - 1] for item in picked]
    models = "".join(f" --model exports/{Path(path).name}" for path in args.model)
    exported = (
        " (`exports/` written by `python scripts/export_torch.py --out exports/`: random weights)" if models else ""
    )
    header = (
        "# Whole models as standalone C on emulated Cortex-M (qemu-system-arm)\n\n"
        "KiB unless noted; batch 1; float32 rows: float32 weights and activations; int8 rows: the model quantized "
        "to int8 QDQ (per-channel int8 weights, int32 biases, int8 activations; float input and output, "
        "quantized and dequantized inside the first and last kernels). `arena` is `memplan_arena` in the linked ELF "
        "(`= plan`: equal to the planned arena byte for byte); TVM default = StaticPlanBlockMemory on the same "
        "kernels; naive = every intermediate in its own buffer. SRAM = .data + .bss + measured stack "
        "high-water; it includes the harness's input/output buffers (`I/O`), which the model's caller owns, "
        "so `SRAM - I/O` is what the model itself needs. Flash = .text + .rodata + .data image; "
        "`code` = flash - weights (kernels, runtime, tables). "
        "Rows marked `--io-in-arena` hold the model's inputs and outputs in the arena, planned with their lifetimes "
        "(`I/O ... in arena`): their SRAM is all the model needs, its I/O included; `--int8-io`: int8 codes in and "
        "out (the caller quantizes with the scale and zero point in model.h), checked against onnxruntime's run of "
        "that graph; `--no-kernel-checks`: TVM's per-call argument checks and their messages left out. "
        "Instructions: retired under `-icount shift=0` (SysTick, calibrated). Split rows: `--split acg` searched "
        f"for an arena of at most {SPLIT_LIMIT // 1024} KiB ({RESERVE // 1024} KiB left to kernel scratch and stack), "
        f"the int8 one for a simulated peak of {int8_limit // 1024} KiB, its input included; the float rows' "
        "chains are timed with the same C on this machine; the row marked `--device qemu-cortex-m7` searched with "
        "each candidate's instructions counted on the emulated M7 (the whole standalone C with and without the "
        "split, `-icount`), its latency budget in instructions. `vs unsplit`: a split row's instructions over the "
        "unsplit row of the same model, dtype and options in the same run. "
        f"`fits` compares with an STM32F767 (seed 003): {SRAM_LIMIT // 1024} KiB SRAM (`SRAM - I/O`), "
        f"{FLASH_LIMIT // 1024 // 1024} MiB flash. `max abs diff`: largest absolute difference to onnxruntime "
        "(int8 rows: to onnxruntime's run of the same QDQ file, with the allowed difference in brackets: onnxruntime's "
        "own optimized-vs-unoptimized spread on the same input, at least 2 LSB; `--requantize fixed` rows: in output "
        "LSB against that spread without the floor, `NO` beyond it). "
        "`int8 / float`: the int8 row's instructions over the float row's of the same model and core.\n\n"
        f"Written by `python scripts/bench_mcu.py --out results/bench_mcu.md{models}{chosen}`{exported}"
        + (" (only these rows of the table)" if chosen else "")
        + ".\n\n"
        "| model | dtype | core | arena | = plan | TVM default | naive | kernel scratch | stack | I/O | SRAM "
        "| SRAM - I/O "
        "| flash | weights | code | instructions (M) | vs unsplit | int8 / float | max abs diff | fits SRAM "
        "| fits flash | published (STM32H743) |\n"
        "|---|---|---|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|:---:|---|\n"
    )
    lines = [header]
    float_instructions: dict[tuple[str, str], int] = {}
    unsplit: dict[tuple, int] = {}

    def same_build(spec: str, cpu: str, int8: bool, standalone: dict) -> tuple:
        return (spec, cpu, int8, tuple(sorted((k, v) for k, v in standalone.items() if k != "split_device")))

    with tempfile.TemporaryDirectory(prefix="bench-mcu-") as scratch:
        for spec, cpu, split_limit, int8, standalone in rows:
            emitted, result = measure_row(
                spec, cpu, split_limit, int8, standalone, Path(scratch), args.search_seconds, args.split_cache
            )
            if not int8 and split_limit is None:
                float_instructions[(spec, cpu)] = result.instructions
            if split_limit is None:
                unsplit[same_build(spec, cpu, int8, standalone)] = result.instructions
            figures = (
                emitted,
                result,
                float_instructions.get((spec, cpu)),
                unsplit.get(same_build(spec, cpu, int8, standalone)),
            )
            lines.append(row(spec, cpu, split_limit, int8, standalone, *figures))
            print(lines[-1], end="", flush=True)
    lines.append(f"\n{PUBLISHED}\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
