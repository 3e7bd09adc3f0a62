"""Arena sizes and planning times of the offset planners, as Markdown tables.

    python scripts/bench_memory.py --zoo --minimalloc ../shared/benchmarks/minimalloc-challenging \
        --seconds 60 --out results/bench_memory.md

One section per benchmark family; each is a function returning Markdown so more families (the
model zoo) can join ``main`` without touching the others. Memory is deterministic, so

    python scripts/bench_memory.py --zoo --check results/README.md

plans the zoo again and fails (exit 1) when a row of the published zoo tables differs from what the
code gives now (every column but the planning time); CI runs it.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import time
from pathlib import Path

from tvm_memplan.planning import (
    Operator,
    Problem,
    plan_memory,
    problem_from_graph,
    read_minimalloc_csv,
    validate_offsets,
)
from tvm_memplan.planning.allocators import CanonicalSearch, greedy_allocators
from tvm_memplan.planning.order import OrderGraph, search_order

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


PLAN_SECONDS_COLUMN = -1
"""The first zoo table's last column, planning time: the only one that is not deterministic."""


def zoo_table(names: list[str], seconds: float) -> str:
    """Two tables over zoo models at their published input sizes.

    The foundation planner (program order, no aliasing): naive bytes, TVM's
    StaticPlanBlockMemory on the same module, the liveness lower bound, the arena, and every
    heap algorithm on the same problem side by side. Then the defaults (in-place kernels and
    concat elimination on, execution order searched) against that arena. Models are planned in NCHW
    (``layout="nchw"``), so that the tables do not depend on the machine's vector width.
    """
    from tvm_memplan import zoo
    from tvm_memplan.frontend import LoadedModel
    from tvm_memplan.planner import plan_model

    mib = 1 << 20
    planners = [*greedy_allocators(), CanonicalSearch()]
    first = [
        "### Model zoo: the arena planner against TVM (program order, no aliasing)\n",
        "MiB, batch 1, float32, published input sizes; ratios to the lower bound per heap algorithm.\n",
        "| model | tensors | naive | TVM default | lower bound | arena | arena / bound | arena / TVM default | "
        + " | ".join(p.name for p in planners)
        + " | plan s |",
        "|---|" + "---:|" * (8 + len(planners)),
    ]
    second = [
        "\n### Model zoo: below the bound (in-place, concat elimination, order search)\n",
        "Defaults of `tvm_memplan.pipeline` against the arena above; the bound is for the order used, "
        "with aliased tensors counted once.\n",
        "| model | program-order arena | memplan arena | change | bound (order used) | arena / bound | order found by "
        "| concats removed | in-place kernels | views | memplan / TVM default |",
        "|---|" + "---:|" * 5 + "---|" + "---:|" * 4,
    ]
    for name in names:
        model = LoadedModel(name, zoo.build(name))
        # NCHW: the tables are the same on every machine (the blocked layout pads channels to the host's block)
        base = plan_model(model, inplace=False, order="program", time_budget=seconds, layout="nchw")
        problem = base.main.layouts()[0][0]
        bound = problem.lower_bound()
        cells = []
        for planner in planners:
            plan = planner.allocate(problem, time.monotonic() + seconds)
            validate_offsets(problem, plan.offsets, plan.arena_bytes)
            cells.append(f"{plan.arena_bytes / bound:.3f}")
        arena, lower = base.total("arena_bytes"), base.total("lower_bound_bytes")
        first.append(
            f"| {name} | {base.total('tensors')} | {base.total('naive_bytes') / mib:.2f} | "
            f"{base.tvm_default_bytes / mib:.2f} "
            f"| {lower / mib:.2f} | {arena / mib:.2f} | {arena / lower:.3f} | {arena / base.tvm_default_bytes:.3f} | "
            + " | ".join(cells)
            + f" | {base.total('plan_seconds'):.2f} |"
        )
        best = plan_model(model, time_budget=seconds, layout="nchw")
        new, new_bound = best.total("arena_bytes"), best.total("lower_bound_bytes")
        strategy = ", ".join(sorted({r.strategy for r in best.order_reports}))
        proved = " (proved optimal)" if best.order_reports and all(r.optimal for r in best.order_reports) else ""
        second.append(
            f"| {name} | {arena / mib:.2f} | {new / mib:.2f} | {new / arena - 1:+.1%} | {new_bound / mib:.2f} "
            f"| {new / new_bound:.3f} | {strategy}{proved} | {best.total('concats_removed')} "
            f"| {best.total('inplace_ops')} | {best.total('removable_ops')} | {new / best.tvm_default_bytes:.3f} |"
        )
        print(f"{name}: arena {arena / lower:.3f} x bound, memplan {new / arena - 1:+.1%}", file=sys.stderr, flush=True)
    return "\n".join(first) + "\n" + "\n".join(second) + "\n"


def nn_like_graph(num_operators: int, seed: int = 0, branchy: bool = False) -> tuple[list[Operator], dict[int, int]]:
    """A CNN-like operator chain with random skip connections and mixed tensor sizes.

    ``branchy``: each operator reads one or two of the last 16 tensors instead of its
    predecessor, so many orders are valid (the order search's stress case, like NAS cells).
    """
    rng = random.Random(seed)
    operators, sizes = [], {}
    for i in range(num_operators):
        if i == 0:
            reads: tuple = ("input",)
        elif branchy:
            reads = tuple(sorted(rng.sample(range(max(0, i - 16), i), min(i, rng.randint(1, 2)))))
        else:
            reads = (i - 1,)
            if i > 2 and rng.random() < 0.3:
                reads += (rng.randrange(max(0, i - 12), i - 1),)
        operators.append(Operator(i, reads, (i,)))
        sizes[i] = 64 * rng.choice([16, 64, 256, 1024, 4096])
    return operators, sizes


def scaling_table(counts: list[int], repeats: int = 5) -> str:
    """Planning time against graph size: the greedy path (three best-fit orderings, validated)
    and the execution-order search under its default 10 s budget."""
    rows = [
        "### Scaling: planning time against graph size\n",
        f"Greedy path: synthetic CNN-like chains with random skip connections, median of {repeats} runs. "
        "Order search: branchy graphs (each operator reads one or two of the 16 latest tensors), 10 s budget.\n",
        "| operators | greedy path s | arena / bound | order search s | order peak / program peak | order strategy |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for count in counts:
        operators, sizes = nn_like_graph(count)
        problem = problem_from_graph(operators, sizes)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            plan = plan_memory(problem, allocators=greedy_allocators())
            times.append(time.perf_counter() - started)
        graph = OrderGraph.from_operators(*nn_like_graph(count, branchy=True))
        order = search_order(graph, time_budget=10.0)
        rows.append(
            f"| {count} | {statistics.median(times):.3f} | {plan.arena_bytes / problem.lower_bound():.3f} "
            f"| {order.seconds:.2f} | {order.peak / order.program_peak:.3f} | {order.strategy} |"
        )
        print(
            f"{count} operators: greedy {statistics.median(times):.3f} s, order {order.seconds:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    return "\n".join(rows) + "\n"


def table_rows(markdown: str, first_cells: set[str]) -> list[list[str]]:
    """The cells of every Markdown table row whose first cell is one of ``first_cells``."""
    rows = []
    for line in markdown.splitlines():
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if cells[0] in first_cells:
                rows.append(cells)
    return rows


def stale_rows(document: str, generated: str, names: list[str]) -> list[str]:
    """Rows of ``generated``'s zoo tables that ``document`` does not hold (planning time aside)."""

    def comparable(cells: list[str]) -> tuple[str, ...]:
        first_table = len(cells) > 11  # the first table has the heap columns and the planning time
        return tuple(cells[:PLAN_SECONDS_COLUMN] if first_table else cells)

    have = {comparable(cells) for cells in table_rows(document, set(names))}
    return [" | ".join(cells) for cells in table_rows(generated, set(names)) if comparable(cells) not in have]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minimalloc", type=Path, help="folder of MiniMalloc CSV instances")
    parser.add_argument("--instances", nargs="*", help="instance names to keep (e.g. A B); default all")
    parser.add_argument("--seconds", type=float, default=60.0, help="planning budget per instance")
    parser.add_argument("--zoo", nargs="*", metavar="MODEL", help="zoo models to plan (no names: all of them)")
    parser.add_argument(
        "--scaling",
        nargs="*",
        type=int,
        metavar="N",
        help="planning time on synthetic graphs of N operators (default 150 300 600 1200)",
    )
    parser.add_argument("--out", type=Path, help="Markdown file to write (default: print)")
    parser.add_argument(
        "--check",
        type=Path,
        metavar="FILE",
        help="with --zoo: exit 1 when FILE's zoo tables differ from what the code plans now",
    )
    args = parser.parse_args(argv)
    if args.check is not None:
        from tvm_memplan import zoo

        if args.zoo is None:
            parser.error("--check compares the zoo tables: give --zoo")
        names = args.zoo or zoo.names()
        stale = stale_rows(args.check.read_text(), zoo_table(names, args.seconds), names)
        for row in stale:
            print(f"{args.check}: stale or missing row, the code now gives: | {row} |", file=sys.stderr)
        sys.exit(1 if stale else 0)
    sections = []
    if args.zoo is not None:
        from tvm_memplan import zoo

        sections.append(zoo_table(args.zoo or zoo.names(), args.seconds))
    if args.minimalloc:
        sections.append(minimalloc_table(args.minimalloc, args.seconds, args.instances))
    if args.scaling is not None:
        sections.append(scaling_table(args.scaling or [150, 300, 600, 1200]))
    if not sections:
        parser.error("nothing to benchmark: give --zoo, --minimalloc and/or --scaling")
    report = "# Memory planning benchmark\n\n" + "\n".join(sections)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        partial = args.out.with_suffix(args.out.suffix + ".partial")
        partial.write_text(report)
        partial.replace(args.out)  # atomic: a crash never leaves half a table
    else:
        print(report)


if __name__ == "__main__":
    main()
