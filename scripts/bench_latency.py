#!/usr/bin/env python3
"""onnxruntime, TVM as it ships, and tvm_memplan side by side: latency, compile time, memory.

Per model, in one run on one machine:
- ``onnxruntime``: the CPU execution provider with as many intra-op threads as TVM_NUM_THREADS;
- ``TVM``: TVM 0.27's own Relax pipeline (its kernels, unscheduled on CPU, and its planner);
- ``memplan``: ``tvm_memplan.pipeline`` with ``layout="nchw"`` (default CPU schedules, order search,
  in-place, arena; convolutions in NCHW);
- with ``--blocked``, ``memplan blocked``: the same with ``layout="blocked"`` (convolutions in NCHW[x]c,
  what the default ``layout="auto"`` runs on AVX2 and AVX-512);
- with ``--baseline DIR``, the artifacts an earlier checkout built (``tvm-memplan build MODEL --layout
  nchw -o DIR/STEM.memplan.so``, and ``--layout blocked -o DIR/STEM.memplan_blocked.so``, STEM the file name
  without ``.onnx``), so that a change is timed against the code before it in the same rounds;
- with ``--as-avx2`` on an AVX-512 machine, both sides on AVX2: the script runs with AVX-512 hidden from CPUID
  (``scripts/cpuid_without_avx512.c``), so that onnxruntime's MLAS picks its AVX2 kernels, as on an AVX2 CPU
  of the same microarchitecture, beside our kernels built for the AVX2 CPU ``--target`` names.
Latencies are measured in interleaved rounds (TVM, memplan, onnxruntime, then reversed) so that
drift on a shared machine hits all alike; each TVM round is appended to the results log, as
``tvm-memplan measure`` does. Compile time is ``tvm.compile`` from the imported Relax module:
TVM's default pipeline against ``tvm_memplan.pipeline`` with and without default schedules.

    python scripts/bench_latency.py                                   # zoo:mobilenet_v2, zoo:mcu_cnn here
    python scripts/bench_latency.py zoo:squeezenet1_0 --rounds 5 --repeat 10
    python scripts/bench_latency.py resnet50.onnx --blocked                  # NCHW and blocked layouts side by side
    python scripts/bench_latency.py resnet50.onnx --blocked --baseline before/   # and an earlier build of both
    python scripts/bench_latency.py resnet50.onnx --default-only --as-avx2 --target '{"kind":"llvm","mcpu":"skylake"}'
    python scripts/bench_latency.py zoo:mcu_cnn --rpc-tracker 127.0.0.1:9190 --rpc-key arm64-emu   # no onnxruntime
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tvm

import tvm_memplan
from tvm_memplan.deploy.build import TVM_STOCK, build_artifacts
from tvm_memplan.deploy.measure import Device, measure_artifact, reference_outputs
from tvm_memplan.deploy.results import DEFAULT_LOG, ResultsLog
from tvm_memplan.deploy.targets import get_target
from tvm_memplan.frontend import load_model, to_relax
from tvm_memplan.schedule.cpu import cpu_spec

TVM_PIPELINES = (TVM_STOCK, "memplan")
BLOCKED = "memplan_blocked"
DEFAULT = "memplan_default"
"""``--default-only``'s one pipeline: ``tvm_memplan.pipeline`` as it builds by default (``layout="auto"``)."""
AS_AVX2 = "TVM_MEMPLAN_AVX512_HIDDEN"
"""Set in the environment of the process ``--as-avx2`` starts with AVX-512 hidden from CPUID."""
EARLIER = {"memplan": "earlier_memplan", BLOCKED: "earlier_blocked"}
"""Our pipelines → the names of their ``--baseline`` artifacts' columns."""


def baseline_artifacts(directory: Path, model: str) -> dict[str, Path]:
    """The earlier build's artifacts of ``model`` in ``directory`` (those that exist), by column name."""
    stem = Path(model).name.removesuffix(".onnx").replace(":", "_")
    paths = {EARLIER[p]: directory / f"{stem}.{p}.so" for p in EARLIER}
    return {name: path for name, path in paths.items() if path.exists()}


def _spread(times: list[float]) -> tuple[float, float]:
    q25, median, q75 = np.percentile(times, [25, 50, 75])
    return float(median), float(q75 - q25)


def compile_seconds(model: str, target: tvm.target.Target, blocked: bool) -> dict[str, float]:
    """Seconds ``tvm.compile`` takes from the imported module, per pipeline."""
    pipelines = {
        "tvm": lambda: tvm.relax.get_default_pipeline(target),
        "memplan_no_schedule": lambda: tvm_memplan.pipeline(target, schedule="none", layout="nchw"),
        "memplan": lambda: tvm_memplan.pipeline(target, layout="nchw"),
    }
    if blocked:
        pipelines[BLOCKED] = lambda: tvm_memplan.pipeline(target, layout="blocked")
    seconds = {}
    for name, make in pipelines.items():
        mod = to_relax(load_model(model))
        started = time.perf_counter()
        with target:
            tvm.compile(mod, target, relax_pipeline=make())
        seconds[name] = time.perf_counter() - started
    return seconds


class OnnxRuntime:
    """onnxruntime on this CPU with TVM's thread count."""

    def __init__(self, model: str, threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            load_model(model).onnx_model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )

    def time(self, inputs: dict[str, np.ndarray], repeat: int) -> list[float]:
        self.session.run(None, inputs)  # warm-up
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            self.session.run(None, inputs)
            times.append((time.perf_counter() - started) * 1e3)
        return times


def bench(
    model: str,
    target: str,
    rounds: int,
    repeat: int,
    device: Device,
    log: ResultsLog,
    blocked: bool,
    baseline: Path | None = None,
    default_only: bool = False,
) -> dict:
    loaded = load_model(model)
    inputs = loaded.random_inputs(0)
    reference = reference_outputs(loaded, inputs)
    threads = int(os.environ.get("TVM_NUM_THREADS", "1"))
    ort = OnnxRuntime(model, threads) if device.name == "local" else None
    row: dict = {"model": model}
    if device.name == "local" and not default_only:
        row["compile_s"] = compile_seconds(model, get_target(target, None).tvm_target(), blocked)
    pipelines = (*TVM_PIPELINES, BLOCKED) if blocked else TVM_PIPELINES
    with tempfile.TemporaryDirectory() as scratch:
        if default_only:
            pipelines = (DEFAULT,)
            artifacts = {DEFAULT: build_artifacts(model, target, {"memplan": Path(scratch) / "default.so"})["memplan"]}
        else:
            artifacts = build_artifacts(
                model, target, {p: Path(scratch) / f"{p}.so" for p in TVM_PIPELINES}, layout="nchw"
            )
        if blocked:
            path = Path(scratch) / f"{BLOCKED}.so"
            artifacts[BLOCKED] = build_artifacts(model, target, {"memplan": path}, layout="blocked")["memplan"]
        if baseline is not None:
            earlier = baseline_artifacts(baseline, model)
            if not earlier:
                raise SystemExit(f"{baseline} has no artifacts of {model}")
            artifacts.update(earlier)
            pipelines = (*pipelines, *earlier)
        runs: dict[str, list] = {p: [] for p in pipelines}
        ort_times: list[float] = []
        for index in range(rounds):
            order = (*pipelines, "onnxruntime")
            for pipeline in order if index % 2 == 0 else order[::-1]:
                if pipeline == "onnxruntime":
                    if ort is not None:
                        ort_times += ort.time(inputs, repeat)
                    continue
                result = measure_artifact(device, artifacts[pipeline], inputs, reference, repeat, source=model)
                log.append(result.summary())
                runs[pipeline].append(result)
    for pipeline, results in runs.items():
        median, spread = _spread([ms for r in results for ms in r.repeats_ms])
        row[pipeline] = {
            "latency_ms": median,
            "spread_ms": spread,
            "requested_bytes": results[0].requested_bytes,
            "planned_bytes": results[0].planned_bytes,
            "correct": all(r.correct for r in results),
            "threads": results[0].tvm_num_threads,
        }
    if ort_times:
        median, spread = _spread(ort_times)
        row["onnxruntime"] = {"latency_ms": median, "spread_ms": spread}
    return row


def _mib(nbytes: int | None) -> str:
    return "unknown" if nbytes is None else f"{nbytes / 2**20:.3f}"


def _ms(entry: dict | None) -> str:
    return "—" if entry is None else f"{entry['latency_ms']:.2f} ({entry['spread_ms']:.2f})"


def _host_isa() -> str:
    """The widest x86 vector ISA CPUID reports to this process (what onnxruntime's MLAS dispatches to: it reads
    CPUID and offers no option to use a narrower one), or the machine name elsewhere. numpy reads the same CPUID
    bits at import, so a process under ``--as-avx2`` reports AVX2 here."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return platform.machine()
    try:  # numpy 2's module, then numpy 1's
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:
        from numpy.core._multiarray_umath import __cpu_features__ as features
    isa = "AVX-512" if features.get("AVX512F") else "AVX2" if features.get("AVX2") else platform.machine()
    return isa + (" (the CPU's AVX-512 hidden from CPUID by `--as-avx2`)" if os.environ.get(AS_AVX2) else "")


def _hide_avx512(argv: list[str]) -> None:
    """Runs this script again with AVX-512 hidden from CPUID (``scripts/cpuid_without_avx512.c`` preloaded),
    so that onnxruntime's MLAS runs its AVX2 kernels as on an AVX2 CPU; never returns. One-line error where
    there is no C compiler; the library itself exits 2 with one line where the machine has no CPUID faulting."""
    source = Path(__file__).with_name("cpuid_without_avx512.c")
    library = Path(tempfile.gettempdir()) / "tvm_memplan_cpuid_without_avx512.so"
    partial = library.with_name(f"{library.name}.{os.getpid()}")
    compiler = os.environ.get("CC", "cc")
    try:
        subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(partial), str(source)], check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        sys.exit(f"bench_latency.py: --as-avx2 needs a C compiler ({compiler}) to build {source.name}: {error}")
    partial.replace(library)
    preload = " ".join(filter(None, [str(library), os.environ.get("LD_PRELOAD")]))
    env = {**os.environ, "LD_PRELOAD": preload, AS_AVX2: "1"}
    os.execve(sys.executable, [sys.executable, *argv], env)


def _target_isa(target: str) -> str:
    """The vector width our kernels are built for on ``target`` (from its ``-mcpu``/``-mattr`` features)."""
    tvm_target = get_target(target, None).tvm_target()
    if tvm_target.kind.name != "llvm":
        return tvm_target.kind.name
    lanes = cpu_spec(tvm_target).lanes
    return {16: "AVX-512", 8: "AVX2"}.get(lanes, f"{lanes} float32 lanes") + f" ({lanes} float32 lanes)"


def _heading(command: str, title: str, isa: str) -> list[str]:
    """A table's first lines: the command that wrote it, its title with today's date, the ISA of each column."""
    heading = [f"## {title} ({datetime.date.today()})", "", f"ISA per column: {isa}", ""]
    return ([f"`{command}`", ""] if command else []) + heading


def _memory_cells(entry: dict) -> list[str]:
    """A build's requested and planned MiB, whether they are equal, and whether its outputs are correct."""
    return [
        _mib(entry["requested_bytes"]),
        _mib(entry["planned_bytes"]),
        "yes" if entry["requested_bytes"] == entry["planned_bytes"] else "NO",
        "yes" if entry["correct"] else "NO",
    ]


def default_markdown(rows: list[dict], device: str, target: str, rounds: int, repeat: int, command: str = "") -> str:
    """``--default-only``'s table: the default build against onnxruntime, and the median of their ratios."""
    threads = rows[0][DEFAULT]["threads"] or "unset (1 thread)"
    lines = _heading(
        command,
        "memplan's default build against onnxruntime",
        f"memplan kernels {_target_isa(target)}; onnxruntime {_host_isa()} (MLAS picks its kernels from CPUID).",
    )
    lines += [
        f"Device `{device}`, target `{target}` (this host's CPU: {tvm.target.Target.from_device('cpu')}), "
        f"TVM_NUM_THREADS={threads} "
        f"(onnxruntime's intra-op threads alike), host {platform.processor() or platform.machine()} with "
        f"{os.cpu_count()} cores; {rounds} interleaved rounds x {repeat} repeats each; latency is the median over all "
        "repeats (ms), spread the interquartile range. memplan = `tvm_memplan.pipeline` with its defaults "
        '(`layout="auto"`). Produced by `scripts/bench_latency.py --default-only`.',
        "",
        "| model | onnxruntime ms | memplan ms | memplan / onnxruntime | requested MiB | planned MiB "
        "| requested = plan | correct |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for row in rows:
        ours, ort = row[DEFAULT], row.get("onnxruntime")
        if ort:
            ratios.append(ours["latency_ms"] / ort["latency_ms"])
        cells = [
            row["model"],
            _ms(ort),
            _ms(ours),
            f"{ratios[-1]:.2f}x" if ort else "—",
            *_memory_cells(ours),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if ratios:
        lines += [
            "",
            f"Median memplan / onnxruntime over {len(ratios)} models: {float(np.median(ratios)):.2f}x; "
            f"worst {max(ratios):.2f}x.",
        ]
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict], device: str, target: str, rounds: int, repeat: int, command: str = "") -> str:
    threads = rows[0]["memplan"]["threads"] or "unset (1 thread)"
    cpu = platform.processor() or platform.machine()
    lines = _heading(
        command,
        "onnxruntime, TVM and memplan: latency, compile time and memory",
        f"TVM and memplan kernels {_target_isa(target)}; onnxruntime {_host_isa()} "
        "(the host's own: MLAS picks its kernels from CPUID and has no setting to narrow them).",
    )
    lines += [
        f"Device `{device}`, target `{target}` (this host's CPU: {tvm.target.Target.from_device('cpu')}), "
        f"TVM_NUM_THREADS={threads}, "
        f"host {cpu} with {os.cpu_count()} cores; {rounds} interleaved rounds x {repeat} repeats per pipeline; "
        "latency is "
        "the median over all repeats (ms), spread the interquartile range. TVM = TVM 0.27's own pipeline (unscheduled "
        'CPU kernels, its planner); memplan = `tvm_memplan.pipeline` with `layout="nchw"` (default CPU schedules, '
        "arena). Compile = seconds "
        "of `tvm.compile` from the imported module. Produced by `scripts/bench_latency.py`.",
        "",
        "| model | onnxruntime ms | TVM ms | memplan ms | memplan / onnxruntime | memplan / TVM "
        "| compile TVM s | compile memplan s (no schedules) | TVM requested MiB | memplan requested MiB "
        "| memplan planned MiB | requested = plan | correct |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        stock, memplan, ort = row[TVM_STOCK], row["memplan"], row.get("onnxruntime")
        compile_s = row.get("compile_s")
        cells = [
            row["model"],
            _ms(ort),
            _ms(stock),
            _ms(memplan),
            f"{memplan['latency_ms'] / ort['latency_ms']:.2f}x" if ort else "—",
            f"{memplan['latency_ms'] / stock['latency_ms']:.3f}",
            f"{compile_s['tvm']:.1f}" if compile_s else "—",
            f"{compile_s['memplan']:.1f} ({compile_s['memplan_no_schedule']:.1f})" if compile_s else "—",
            _mib(stock["requested_bytes"]),
            _mib(memplan["requested_bytes"]),
            _mib(memplan["planned_bytes"]),
            "yes" if memplan["requested_bytes"] == memplan["planned_bytes"] else "NO",
            "yes" if stock["correct"] and memplan["correct"] else "NO",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    blocked_rows = [row for row in rows if BLOCKED in row]
    if blocked_rows:
        lines += [
            "",
            'Blocked channel layouts (`layout="blocked"`: convolutions, their epilogues and pools in NCHW[x]c, x the '
            "target's float32 lanes), timed in the same interleaved rounds:",
            "",
            "| model | onnxruntime ms | memplan ms | memplan blocked ms | blocked / onnxruntime | blocked / memplan "
            "| compile memplan s | compile blocked s | blocked requested MiB | blocked planned MiB | requested = plan "
            "| correct |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
    for row in blocked_rows:
        memplan, blocked, ort = row["memplan"], row[BLOCKED], row.get("onnxruntime")
        compile_s = row.get("compile_s")
        cells = [
            row["model"],
            _ms(ort),
            _ms(memplan),
            _ms(blocked),
            f"{blocked['latency_ms'] / ort['latency_ms']:.2f}x" if ort else "—",
            f"{blocked['latency_ms'] / memplan['latency_ms']:.3f}",
            f"{compile_s['memplan']:.1f}" if compile_s else "—",
            f"{compile_s[BLOCKED]:.1f}" if compile_s else "—",
            *_memory_cells(blocked),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += _earlier_table([row for row in rows if any(name in row for name in EARLIER.values())])
    return "\n".join(lines) + "\n"


def _earlier_table(rows: list[dict]) -> list[str]:
    """Our pipelines against the ``--baseline`` build of the same pipelines, each over onnxruntime."""
    if not rows:
        return []
    lines = [
        "",
        "Against an earlier build (`--baseline`: artifacts built by an earlier checkout), timed in the same "
        "interleaved rounds; ratios are over onnxruntime's time in these rounds:",
        "",
        "| model | pipeline | onnxruntime ms | earlier ms | now ms | earlier / onnxruntime | now / onnxruntime "
        "| now / earlier | requested = plan (now) | correct (earlier, now) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ort = row.get("onnxruntime")
        for pipeline, name in EARLIER.items():
            if name not in row or pipeline not in row:
                continue
            earlier, now = row[name], row[pipeline]
            cells = [
                row["model"],
                "blocked" if pipeline == BLOCKED else "NCHW",
                _ms(ort),
                _ms(earlier),
                _ms(now),
                f"{earlier['latency_ms'] / ort['latency_ms']:.2f}x" if ort else "—",
                f"{now['latency_ms'] / ort['latency_ms']:.2f}x" if ort else "—",
                f"{now['latency_ms'] / earlier['latency_ms']:.3f}",
                "yes" if now["requested_bytes"] == now["planned_bytes"] else "NO",
                f"{'yes' if earlier['correct'] else 'NO'}, {'yes' if now['correct'] else 'NO'}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["zoo:mobilenet_v2", "zoo:mcu_cnn"])
    parser.add_argument("--target", default="host")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds per pipeline (default 4)")
    parser.add_argument("--repeat", type=int, default=5, help="timed repeats per round (default 5)")
    parser.add_argument("--rpc-tracker")
    parser.add_argument("--rpc-key")
    parser.add_argument("--out", default="results/latency.md", help="Markdown output (default results/latency.md)")
    parser.add_argument("--log", default=str(DEFAULT_LOG))
    parser.add_argument(
        "--blocked",
        action="store_true",
        help="also time memplan with blocked channel layouts (layout=blocked), in the same rounds",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="also time an earlier checkout's artifacts DIR/STEM.memplan.so (and .memplan_blocked.so) in the same "
        "rounds, STEM the model's file name without .onnx",
    )
    parser.add_argument(
        "--default-only",
        action="store_true",
        help="time only the default build (layout=auto) against onnxruntime: no TVM or NCHW columns, no compile times",
    )
    parser.add_argument(
        "--as-avx2",
        action="store_true",
        help="on an AVX-512 x86 machine, hide AVX-512 from CPUID (Linux CPUID faulting) so that onnxruntime runs "
        "its AVX2 kernels beside ours; needs --target naming an AVX2 CPU",
    )
    args = parser.parse_args()
    if args.default_only and (args.blocked or args.baseline):
        parser.error("--default-only goes without --blocked and --baseline")
    if args.as_avx2 and not _target_isa(args.target).startswith("AVX2"):
        parser.error(
            "--as-avx2 times AVX2 kernels on both sides: name an AVX2 CPU in --target, e.g. "
            """'{"kind":"llvm","mcpu":"skylake"}'"""
        )
    if args.as_avx2 and not os.environ.get(AS_AVX2):
        _hide_avx512(sys.argv)
    if args.as_avx2 and _host_isa().startswith("AVX-512"):
        sys.exit("bench_latency.py: --as-avx2: CPUID still reports AVX-512 to this process")

    if not args.rpc_tracker:
        os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    device = Device(args.rpc_tracker, args.rpc_key)
    log = ResultsLog(args.log)
    command = shlex.join(["python", *sys.argv])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for model in args.models:
        print(f"benchmarking {model} ...", file=sys.stderr, flush=True)
        rows.append(
            bench(
                model,
                args.target,
                args.rounds,
                args.repeat,
                device,
                log,
                args.blocked,
                args.baseline,
                args.default_only,
            )
        )
        table = default_markdown if args.default_only else markdown
        text = table(rows, device.name, args.target, args.rounds, args.repeat, command)
        # Rewritten after every model, atomically, so that a long run leaves the rows it finished.
        partial = out.with_name(out.name + ".partial")
        partial.write_text(text)
        partial.replace(out)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
