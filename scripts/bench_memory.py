"""Arena sizes and planning times of the offset planners, as Markdown tables.

    python scripts/bench_memory.py --minimalloc /work/shared/benchmarks/minimalloc-challenging \
        --seconds 60 --out results/bench_memory.md

One section per benchmark family; each is a function returning Markdown so more families (the
model zoo) can join ``main`` without touching the others.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

from tvm_memplan.planning import Problem, plan_memory, read_minimalloc_csv

GREEDY_SIZE = "greedy-size"
SEARCH = "search-minimalloc"


def capacity_of(path: Path, problem: Problem) -> int:
    """The known-feasible capacity in a MiniMalloc file name (``A.1048576.csv``), else the lower bound."""
    match = re.search(r"\.(\d+)\.csv$", path.name)
    return int(match.group(1)) if match else problem.lower_bound()


def minimalloc_table(directory: Path, seconds: float, instances: list[str] | None = None) -> str:
    """Plan every MiniMalloc CSV in ``directory`` with ``plan_memory`` and tabulate each planner.

    Arenas are shown against the instance's known-feasible capacity (1.000 = as good as
    MiniMalloc's reference). The driver runs the greedies, then the search while they miss the
    lower bound; a planner it did not need shows "-".
    """
    paths = sorted(p for p in directory.glob("*.csv") if instances is None or p.name.split(".")[0] in instances)
    if not paths:
        raise SystemExit(f"no MiniMalloc CSV files in {directory}")
    header = (
        f"### MiniMalloc challenging instances ({seconds:g} s budget a instance)\n\n"
        "Arena / capacity (lower is better; 1.000 matches the known-feasible capacity) and seconds.\n\n"
        "| instance | buffers | lower bound | greedy-size | s | best greedy | s | search | s | driver | s | optimal |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|\n"
    )
    rows, driver_ratios = [], []
    for path in paths:
        problem = read_minimalloc_csv(path)
        capacity = capacity_of(path, problem)
        plan = plan_memory(problem, time_budget=seconds)
        greedy = {name: arena for name, arena in plan.tried.items() if name.startswith("greedy")}
        greedy_seconds = sum(t for name, t in plan.tried_seconds.items() if name.startswith("greedy"))
        ratio = plan.arena_bytes / capacity
        driver_ratios.append(ratio)
        cells = [
            path.name.split(".")[0],
            str(len(problem)),
            f"{problem.lower_bound() / capacity:.3f}",
            f"{plan.tried[GREEDY_SIZE] / capacity:.3f}",
            f"{plan.tried_seconds[GREEDY_SIZE]:.2f}",
            f"{min(greedy.values()) / capacity:.3f}",
            f"{greedy_seconds:.2f}",
            f"{plan.tried[SEARCH] / capacity:.3f}" if SEARCH in plan.tried else "-",
            f"{plan.tried_seconds[SEARCH]:.1f}" if SEARCH in plan.tried else "-",
            f"{ratio:.3f}",
            f"{plan.seconds:.1f}",
            "yes" if plan.optimal else "",
        ]
        rows.append("| " + " | ".join(cells) + " |\n")
        print(f"{cells[0]}: {ratio:.3f} in {plan.seconds:.1f} s via {plan.allocator}", file=sys.stderr, flush=True)
    summary = (
        f"\nDriver: worst {max(driver_ratios):.3f}, median {statistics.median(driver_ratios):.3f}, "
        f"{sum(r <= 1.0 for r in driver_ratios)} of {len(driver_ratios)} at or below the capacity.\n"
    )
    return header + "".join(rows) + summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minimalloc", type=Path, help="folder of MiniMalloc CSV instances")
    parser.add_argument("--instances", nargs="*", help="instance names to keep (e.g. A B); default all")
    parser.add_argument("--seconds", type=float, default=60.0, help="planning budget per instance")
    parser.add_argument("--out", type=Path, help="Markdown file to write (default: print)")
    args = parser.parse_args(argv)
    sections = []
    if args.minimalloc:
        sections.append(minimalloc_table(args.minimalloc, args.seconds, args.instances))
    # A zoo_table(models, seconds) -> str section for the model zoo's arenas appends here.
    if not sections:
        parser.error("nothing to benchmark: give --minimalloc")
    report = "# Memory planning benchmark\n\n" + "\n".join(sections)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
    else:
        print(report)


if __name__ == "__main__":
    main()
