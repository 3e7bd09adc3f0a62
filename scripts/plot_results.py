"""Charts of the result tables in ``results/`` and the memory-layout picture of the README.

    python scripts/plot_results.py --out results/figures

Reads the Markdown tables the benchmark scripts wrote (nothing is measured here) and draws:

- ``memory.png``: per zoo model, what TVM's StaticPlanBlockMemory allocates, the arena at the liveness
  bound in program order, and tvm_memplan's default arena (in-place, concat elimination, order search),
  from ``results/bench_memory.md``;
- ``latency.png``: onnxruntime, TVM as it ships and tvm_memplan per zoo model, from
  ``results/bench_latency.md`` (log scale: TVM's unscheduled loops are 20-100x slower);
- ``parity.png``: tvm_memplan's latency over onnxruntime's per torchvision and transformers export on each
  AVX-512 machine measured (:data:`PARITY_RUNS`: ``results/bench_latency_all_exports.md``,
  ``results/bench_latency_xeon_emeraldrapids.md``), with the 1.0x and 1.3x lines;
- ``parity_avx2.png``: the same for our AVX2 kernels (:data:`AVX2_PARITY_RUNS`), against onnxruntime's AVX-512
  kernels and, with AVX-512 hidden from CPUID, its AVX2 ones;
- ``memory_layout_mobilenet_v2.png``: the arena of MobileNetV2 (``--layout-model``; the same picture as
  ``tvm-memplan plan zoo:mobilenet_v2 --plot FILE``), planned now.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

RESULTS = Path(__file__).resolve().parents[1] / "results"


def tables(markdown: str, header_start: str) -> list[list[dict[str, str]]]:
    """The rows of every Markdown table whose header line starts with ``header_start``, in the file's order."""
    lines = markdown.splitlines()
    found = []
    for start in (i for i, line in enumerate(lines) if line.startswith(header_start)):
        header = [cell.strip() for cell in lines[start].strip().strip("|").split("|")]
        rows = []
        for line in lines[start + 2 :]:
            if not line.startswith("|"):
                break
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            rows.append(dict(zip(header, cells, strict=True)))
        found.append(rows)
    return found


def table(markdown: str, header_start: str) -> list[dict[str, str]]:
    """The rows of the first Markdown table whose header line starts with ``header_start``."""
    return tables(markdown, header_start)[0]


def _first_number(cell: str) -> float:
    return float(re.match(r"[-+]?[\d.]+", cell).group(0))


def memory_chart(bench_memory: Path, out: Path) -> Path:
    text = bench_memory.read_text()
    program = {r["model"]: r for r in table(text, "| model | tensors |")}
    memplan = {r["model"]: r for r in table(text, "| model | program-order arena |")}
    models = [m for m in program if m in memplan and float(program[m]["TVM default"]) >= 0.01]
    series = {
        "TVM default (StaticPlanBlockMemory)": [float(program[m]["TVM default"]) for m in models],
        "arena at the bound, program order": [float(program[m]["arena"]) for m in models],
        "tvm_memplan (in-place, concats, order)": [float(memplan[m]["memplan arena"]) for m in models],
    }
    return _bars(models, series, "MiB (batch 1, float32)", "Activation memory of the zoo models", out)


def latency_chart(bench_latency: Path, out: Path) -> Path:
    rows = table(bench_latency.read_text(), "| model | onnxruntime ms |")
    models = [r["model"].removeprefix("zoo:") for r in rows]
    series = {
        "onnxruntime": [_first_number(r["onnxruntime ms"]) for r in rows],
        "TVM 0.27 as it ships": [_first_number(r["TVM ms"]) for r in rows],
        "tvm_memplan": [_first_number(r["memplan ms"]) for r in rows],
    }
    return _bars(models, series, "ms (median, 2 threads, log scale)", "Latency on the CPU", out, log=True)


PARITY_RUNS = (
    ("bench_latency_all_exports.md", 0, "AMD Zen 5"),
    ("bench_latency_xeon_emeraldrapids.md", 0, "Intel Xeon (Emerald Rapids), run 1"),
    ("bench_latency_xeon_emeraldrapids.md", 1, "Intel Xeon (Emerald Rapids), run 2"),
    ("bench_latency_xeon_emeraldrapids.md", 3, "Intel Xeon (Emerald Rapids), run 3"),
)
"""The AVX-512 runs the parity chart draws: (file, which of its latency tables, label); the first table of
``bench_latency_all_exports.md`` is its newest run."""
AVX2_PARITY_RUNS = (
    ("bench_latency_all_exports_avx2.md", 0, "AMD Zen 5, onnxruntime on AVX-512"),
    ("bench_latency_xeon_emeraldrapids.md", 2, "Intel Xeon, onnxruntime on AVX-512"),
    ("bench_latency_xeon_emeraldrapids.md", 4, "Intel Xeon, onnxruntime on AVX2 (--as-avx2)"),
)
"""The runs of our AVX2 kernels the AVX2 parity chart draws: against onnxruntime's AVX-512 kernels (what MLAS picks
on an AVX-512 CPU) and against its AVX2 ones (``bench_latency.py --as-avx2``)."""


def parity_chart(results: Path, out: Path, runs_drawn=PARITY_RUNS, isa: str = "AVX-512") -> Path:
    """memplan / onnxruntime per torchvision and transformers export in each run of ``runs_drawn``
    (:data:`PARITY_RUNS`, :data:`AVX2_PARITY_RUNS`), with issue 22's bars (every model within 1.3x, the median at
    most 1.0x) as lines."""
    runs = {}
    for name, index, label in runs_drawn:
        rows = tables((results / name).read_text(), "| model | onnxruntime ms |")[index]
        runs[label] = {r["model"].removesuffix(".onnx").removesuffix(".torchscript"): r for r in rows}
    models = [m for m in next(iter(runs.values())) if all(m in rows for rows in runs.values())]
    series = {label: [_first_number(rows[m]["memplan / onnxruntime"]) for m in models] for label, rows in runs.items()}
    lines = {"onnxruntime (1.0x)": 1.0, "the 1.3x bar": 1.3}
    title = f"tvm_memplan / onnxruntime, our {isa} kernels, 2 threads (lower is faster)"
    return _bars(models, series, "latency ratio", title, out, lines=lines)


def _bars(
    models: list[str],
    series: dict[str, list[float]],
    ylabel: str,
    title: str,
    out: Path,
    log: bool = False,
    lines: dict[str, float] | None = None,
) -> Path:
    fig, ax = plt.subplots(figsize=(11, 4.5), dpi=110)
    width = 0.8 / len(series)
    for index, (label, values) in enumerate(series.items()):
        ax.bar([x + index * width for x in range(len(models))], values, width, label=label)
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(models))], models, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    for style, (label, value) in zip(("-", "--"), (lines or {}).items(), strict=False):
        ax.axhline(value, color="gray", linestyle=style, linewidth=1, label=label)
    if lines:  # room above the bars and lines for the legend
        ax.set_ylim(0, 1.4 * max([*lines.values(), *(v for values in series.values() for v in values)]))
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def layout_picture(model_spec: str, out: Path) -> Path:
    from tvm_memplan.frontend import load_model
    from tvm_memplan.planner import plan_model
    from tvm_memplan.plot import plot_layout

    plan = plan_model(load_model(model_spec))
    problem, offsets, arena = max(plan.main.layouts(), key=lambda layout: layout[2])
    return plot_layout(
        problem, offsets, out, title=f"{model_spec}: arena {arena / (1 << 20):.2f} MiB", arena_bytes=arena
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the result tables")
    parser.add_argument("--out", type=Path, default=RESULTS / "figures", help="folder for the PNG files")
    parser.add_argument("--layout-model", default="zoo:mobilenet_v2", help="model of the memory-layout picture")
    args = parser.parse_args(argv)
    slug = re.sub(r"\W+", "_", args.layout_model.removeprefix("zoo:"))
    written = [
        memory_chart(args.results / "bench_memory.md", args.out / "memory.png"),
        latency_chart(args.results / "bench_latency.md", args.out / "latency.png"),
        parity_chart(args.results, args.out / "parity.png"),
        parity_chart(args.results, args.out / "parity_avx2.png", AVX2_PARITY_RUNS, "AVX2"),
        layout_picture(args.layout_model, args.out / f"memory_layout_{slug}.png"),
    ]
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
