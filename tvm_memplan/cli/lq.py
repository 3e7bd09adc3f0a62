"""``tvm-memplan quantize`` and ``tvm-memplan lq-bench``: LQ-Nets low-bit dense layers."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UserError
from .format import progress_display
from .vocabulary import add_command, add_deprecated_alias, add_json, add_switch, add_target

if TYPE_CHECKING:
    import tvm

    from ..lq.calibrate import LayerReport

TARGETS = ("host", "x86-64", "llvm-aarch64")
"""The targets quantize builds for: this CPU, any x86-64 CPU, or arm64 Linux (cross-compiled)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    quantize = add_command(subparsers, "quantize", run_quantize)
    quantize.add_argument("model", type=Path, help="ONNX model")
    quantize.add_argument(
        "--calib", type=Path, required=True, help=".npz with one (samples, ...) array per model input"
    )
    quantize.add_argument("--wbits", type=int, default=2, help="weight bits, 1-4 (default 2)")
    quantize.add_argument("--abits", type=int, default=2, help="activation bits, 1-4 (default 2)")
    add_switch(
        quantize, "--finetune", True, "fit each layer on what the quantized upstream layers produce (default on)"
    )
    add_switch(
        quantize,
        "--layer-check",
        True,
        "give a layer whose output error exceeds its limit one more bit, up to 4, else leave it in float (default on)",
    )
    quantize.add_argument(
        "--act-codes",
        choices=("auto", "pm1", "01"),
        default="auto",
        help="activation codes: {0,1} for non-negative inputs and ±1 otherwise (auto, default), or forced",
    )
    quantize.add_argument(
        "--keep-first-last", action="store_true", help="leave the first and last dense layer in float"
    )
    quantize.add_argument(
        "--edge-bits",
        type=int,
        default=4,
        choices=range(0, 5),
        metavar="K",
        help="at least K bits for the first and last dense layer (default 4; 0: the same as the others)",
    )
    quantize.add_argument("--batch", type=int, default=1, help="batch size for a dynamic batch dimension (default 1)")
    add_target(quantize, note=f"quantize builds for {', '.join(TARGETS)} (cross-compiled)")
    quantize.add_argument(
        "--trials",
        type=int,
        default=0,
        metavar="N",
        help="MetaSchedule trials per LQ kernel (default 0: the hand schedule)",
    )
    add_deprecated_alias(quantize, "--tune-trials", "--trials", dest="trials", convert=int)
    quantize.add_argument(
        "--work-dir",
        type=Path,
        default=Path("lq_tuning"),
        metavar="DIR",
        help="MetaSchedule database and tuning logs, with --trials (default lq_tuning)",
    )
    add_deprecated_alias(quantize, "--tune-dir", "--work-dir", dest="work_dir", convert=Path)
    quantize.add_argument(
        "-o", "--output", type=Path, required=True, help="library to write (.so); the report goes next to it (.json)"
    )
    add_json(quantize, "print the report (the JSON written next to the library) instead of the layer summary")
    int8 = quantize.add_argument_group("int8 (QDQ) instead of LQ low-bit codes")
    int8.add_argument(
        "--int8",
        action="store_true",
        help="write OUTPUT.onnx quantized by onnxruntime's quantize_static (QDQ, "
        "int8 weights per channel, MinMax on --calib) for plan/build/measure; the LQ options are ignored",
    )
    int8.add_argument(
        "--activations", choices=("int8", "uint8"), default="int8", help="with --int8: activation type (default int8)"
    )
    int8.add_argument(
        "--per-tensor", action="store_true", help="with --int8: one weight scale per tensor, not per channel"
    )

    bench = add_command(subparsers, "lq-bench", run_bench)
    bench.add_argument("--json", action="store_true", help='print {"rows": [...], "kernels": [...]} as JSON')
    bench.add_argument("--finetune", action="store_true", help="use the fine-tuning calibration mode")
    bench.add_argument("--seed", type=int, default=0, help="training seed (default 0)")
    bench.add_argument("--epochs", type=int, default=60, help="training epochs (default 60)")
    bench.add_argument(
        "--hidden", type=int, default=512, help="hidden units of the MLP (default 512, as in the quantizer thesis)"
    )
    bench.add_argument(
        "--settings",
        default="32/32,4/4,3/3,2/2,1/1,1/2,2/1",
        help="comma-separated WBITS/ABITS rows; 32/32 is the float model (default: %(default)s)",
    )
    bench.add_argument("--no-kernels", action="store_true", help="skip the kernel timings")
    bench.add_argument("--no-accuracy", action="store_true", help="skip the accuracy table")
    bench.add_argument("--quick", action="store_true", help="fewer timing repeats")
    bench.add_argument(
        "--isa",
        choices=("native", "avx2"),
        default="native",
        help="kernels for this CPU (default), or AVX2 kernels on an AVX-512 CPU (set OPENBLAS_CORETYPE=Haswell "
        "for an AVX2 numpy baseline too)",
    )
    bench.add_argument(
        "--cache-dir",
        type=Path,
        help="where the trained MLP is cached (default: the user cache, $XDG_CACHE_HOME/tvm_memplan)",
    )


def _target(name: str) -> tvm.target.Target:
    import tvm

    from ..lq.calibrate import default_target
    from ..lq.cross import arm64_target

    if name == "llvm-aarch64":
        return arm64_target()
    if name == "x86-64":
        return tvm.target.Target({"kind": "llvm", "mcpu": "x86-64", "num-cores": os.cpu_count() or 1})
    if name == "host":
        return default_target()
    raise UserError(f"quantize: target {name} is not one of {', '.join(TARGETS)}")


def load_onnx_module(path: Path, batch: int) -> tvm.IRModule:
    """ONNX file → Relax module with a static batch; malformed files become one-line errors."""
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    if not path.is_file():
        raise UserError(f"model not found: {path}")
    if batch < 1:
        raise UserError(f"--batch must be at least 1, got {batch}")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as exc:  # onnx raises several unrelated exception types
        raise UserError(
            f"cannot read ONNX model {path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from exc
    initializers = {init.name for init in model.graph.initializer}
    shapes = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = []
        for index, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                dims.append(dim.dim_value)
            elif index == 0:
                dims.append(batch)
            else:
                raise UserError(f"input {value.name} has a dynamic dimension {index}; only the batch may be dynamic")
        shapes[value.name] = dims
    try:
        return from_onnx(model, shape_dict=shapes)
    except Exception as exc:  # the importer raises on unsupported operators
        first = str(exc).strip().splitlines()
        raise UserError(f"cannot import {path}: {first[-1] if first else type(exc).__name__}") from exc


def _run_int8(args: argparse.Namespace, arrays: dict) -> int:
    from ..quant.calibrate import quantize_int8

    output = args.output if args.output.suffix == ".onnx" else args.output.with_suffix(".onnx")
    with progress_display(counted=False) as bar:
        if bar is not None:  # onnxruntime's calibration reports nothing until it ends: a spinner with the time
            bar.add_task("quantize --int8: calibrating with onnxruntime", total=None)
        report = quantize_int8(args.model, output, arrays, activation=args.activations, per_channel=not args.per_tensor)
    if args.json:
        print(json.dumps({"output": str(output), **dataclasses.asdict(report)}, indent=2))
        return 0
    print(
        f"wrote {output}: {report.quantized_nodes} QuantizeLinear nodes, calibrated on {report.samples} sample(s); "
        f"weights {report.weight_bytes_float:,} -> {report.weight_bytes_int8:,} bytes"
    )
    return 0


def run_quantize(args: argparse.Namespace) -> int:
    """quantize the dense layers of an ONNX model to learned low-bit codes and compile it

    Calibrate LQ-Nets quantizers (QEM) on real data, replace dense/Gemm/MatMul layers with bitserial popcount
    kernels, compile, and write the library plus a JSON report. By default each layer is fine-tuned on the quantized
    upstream path, the first and last layer get at least 4 bits, and a layer whose calibration error exceeds its
    limit is widened (or left in float); the printout lists each layer's bits, error and reason."""
    from ..lq.calibrate import LQConfig, build, load_npz, quantize_module
    from ..lq.quantizer import check_bits

    if args.int8:
        return _run_int8(args, load_npz(args.calib))

    check_bits(args.wbits, "--wbits")
    check_bits(args.abits, "--abits")
    if args.trials < 0:
        raise UserError(f"--trials must be >= 0, got {args.trials}")
    if args.trials and args.target != "host":
        raise UserError("--trials measures kernels on this machine: use it with --target host")
    if args.trials:
        from ..deploy.tune import require_cost_model

        require_cost_model()  # fail now, not after calibration
    target = _target(args.target)
    calib = load_npz(args.calib)
    mod = load_onnx_module(args.model, args.batch)
    config = LQConfig(
        args.wbits,
        args.abits,
        act_codes=args.act_codes,
        finetune=args.finetune,
        keep_first_last=args.keep_first_last,
        check_layers=args.layer_check,
        edge_bits=args.edge_bits,
        tune_trials=args.trials,
        tune_dir=str(args.work_dir),
    )
    # Calibration runs the model here, so it is always built for this machine.
    fit_target = target if args.target == "host" else _target("host")
    library = args.output if args.output.suffix else args.output.with_suffix(".so")
    with progress_display() as bar:
        task = bar.add_task("quantize: calibrating", total=None) if bar is not None else None

        fitted = {"layers": 0}

        def step(description: str, done: int, layers: int) -> None:
            """Each layer's fit, then compiling and linking: layers + 2 steps."""
            fitted["layers"] = layers
            if bar is not None:
                bar.update(task, description=f"quantize: {description}", completed=done, total=layers + 2)

        result = quantize_module(
            mod,
            calib,
            config,
            fit_target,
            progress=lambda name, done, layers: step(f"calibrating {name}", done, layers),
        )
        step("compiling", fitted["layers"], fitted["layers"])
        if args.target != "host":
            from ..lq.calibrate import apply_layers

            module = apply_layers(mod, result.layers, target, config)
        else:
            module = result.module
        library.parent.mkdir(parents=True, exist_ok=True)
        executable = build(module, target)
        step("linking", fitted["layers"] + 1, fitted["layers"])
        if args.target == "llvm-aarch64":
            import tvm

            executable.export_library(str(library), fcompile=tvm.support.cc.cross_compiler("aarch64-linux-gnu-g++"))
        else:
            executable.export_library(str(library))
    report = result.as_json(config)
    report.update({"model": str(args.model), "library": str(library), "target": str(target)})
    report_path = library.with_suffix(".json")
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report | {"report": str(report_path)}, indent=2))
        return 0
    print(layer_summary(result.report, args.wbits, args.abits, result.float_bytes, result.lq_bytes))
    print(f"wrote {library} and {report_path}")
    return 0


def layer_summary(report: list[LayerReport], wbits: int, abits: int, float_bytes: int, lq_bytes: int) -> str:
    """Each dense layer's bits, calibration output error against its limit, and why it is in float or wider."""
    converted = sum(1 for layer in report if layer.status == "lq")
    lines = [
        f"{converted}/{len(report)} dense layers quantized (asked W{wbits}A{abits}); "
        f"parameters {float_bytes:,} -> {lq_bytes:,} bytes",
    ]
    for layer in report:
        shape = f"{layer.n}->{layer.o}"
        if layer.status == "lq":
            error = f"output error {layer.output_rel_error:.3f} (limit {layer.error_limit:.3f})"
            note = f"; {layer.reason}" if layer.reason else ""
            lines.append(f"  {layer.name} ({shape}) W{layer.wbits}A{layer.abits}, {error}{note}")
        else:
            lines.append(f"  {layer.name} ({shape}) left in float: {layer.reason}")
    return "\n".join(lines)


def parse_settings(text: str) -> list[tuple[int, int]]:
    """ "32/32,2/2,1/1" → [(32, 32), (2, 2), (1, 1)]; 32/32 is float, other widths must be 1-4."""
    from ..lq.quantizer import check_bits

    settings = []
    for item in text.split(","):
        parts = item.strip().split("/")
        try:
            wbits, abits = (int(p) for p in parts)
        except ValueError:
            raise UserError(f"--settings entries look like 2/2, got {item.strip()!r}") from None
        if (wbits, abits) != (32, 32):
            check_bits(wbits, "weight bits")
            check_bits(abits, "activation bits")
        settings.append((wbits, abits))
    return settings


def run_bench(args: argparse.Namespace) -> int:
    """reproduce the LQ table on real digits: accuracy, size, latency, kernel speed

    Train a 784-512-10 tanh MLP on scikit-learn's digits (upsampled to 28x28), quantize it at several bit widths,
    and time the LQ kernels against scheduled fp32 TVM and numpy. Set TVM_NUM_THREADS (e.g. 2) for timings; without
    it TVM runs one thread."""
    # TVM's pool runs one thread unless told otherwise.
    os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    from ..lq import bench
    from ..lq.machine import isa_target
    from ..lq.timing import Timing
    from ..paths import cache_dir

    timing = Timing(number=3, repeat=3, min_repeat_ms=20) if args.quick else Timing()
    if args.epochs < 1 or args.hidden < 1:
        raise UserError("--epochs and --hidden must be at least 1")
    settings = parse_settings(args.settings)
    with progress_display() as bar:
        task = bar.add_task("lq-bench", total=None) if bar is not None else None

        def progress(phase: str, done: int, phases: int) -> None:
            if bar is not None:
                bar.update(task, description=f"lq-bench: {phase}", completed=done, total=phases)

        result = bench.run(
            accuracy=not args.no_accuracy,
            kernel=not args.no_kernels,
            seed=args.seed,
            epochs=args.epochs,
            hidden=args.hidden,
            finetune=args.finetune,
            settings=settings,
            cache_dir=args.cache_dir or cache_dir(),
            timing=timing,
            target=isa_target(args.isa),
            progress=progress,
        )
    if args.json:
        print(json.dumps({"rows": result["rows"], "kernels": result["kernels"]}, indent=2))
        return 0
    from .format import console

    out = console()
    out.print(bench.markdown(result))
    return 0
