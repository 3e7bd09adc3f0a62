"""Where an int8 model's instructions go on an emulated Cortex-M, kernel by kernel, per multiply-add.

    python scripts/profile_mcu.py --out results/profile_mcu_int8_mobilenet_v2_035.md

The model is quantized as ``scripts/bench_mcu.py`` quantizes its int8 rows, written with ``build --emit-c``
and run once as ``model_profile.elf`` (``measure --per-kernel``: the harness reads the SysTick counter
after every kernel under ``qemu -icount``). Each kernel's instructions are set beside its multiply-adds
(the step table's FLOP count / 2) and the DSP floor of 0.5 instructions per MAC (one ``SMLAD`` does 2).
Needs gcc-arm-none-eabi, libnewlib-arm-none-eabi, qemu-system-arm.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from collections import defaultdict
from pathlib import Path

from bench_mcu import quantized

from tvm_memplan.deploy.emit_c import emit_c
from tvm_memplan.deploy.standalone import measure_c

SMLAD_FLOOR = 0.5
"""Instructions per multiply-add with every instruction an ``SMLAD`` (two 16-bit MACs)."""
REQUANTIZE = {
    "exact": (
        8,
        "float requantization as onnxruntime rounds, and the store: VMOV, VCVT, VMUL, VCVTR, VMOV, QADD, SSAT, STRB",
    ),
    "fixed": (3, "fixed-point requantization, and the store: SMMLAR, SSAT, STRB"),
}
"""Per ``--requantize``: instructions per output code of the requantization and its store, and which."""
DEFINITION = re.compile(r"_kernel_(\w+)\(void\* self_handle, void\* args, int32_t num_args, void\* result\) \{")
LAYER_CALL = re.compile(r"tvm_memplan_(pointwise|depthwise|window)_s8\(([^;]*)\);")


def outputs_per_kernel(kernels_c: str) -> dict[str, int]:
    """Each whole-layer C kernel's output codes, from the constant arguments of its call in ``kernels.c``."""
    outputs = {}
    starts = list(DEFINITION.finditer(kernels_c))
    for start, stop in zip(starts, [*starts[1:], None], strict=True):
        call = LAYER_CALL.search(kernels_c, start.end(), stop.start() if stop else len(kernels_c))
        if call is None:
            continue
        layer, args = call.group(1), call.group(2).split(",")
        first = 6 if layer == "pointwise" else 5  # the pointers before the integer arguments
        v = [int(a) for a in args[first : first + 6]]
        if layer == "pointwise":  # cin, cout, pixels
            outputs[start.group(1)] = v[1] * v[2]
        elif layer == "depthwise":  # planes, channels, h, w, oh, ow
            outputs[start.group(1)] = v[0] * v[4] * v[5]
        else:  # cin, h, w, cout, oh, ow
            outputs[start.group(1)] = v[3] * v[4] * v[5]
    return outputs


def agreement(result, requantize: str) -> str:
    """How the outputs compare with onnxruntime's run of the same QDQ file, by the issue's rule: the exact
    requantization within the measured optimized-vs-unoptimized spread of onnxruntime (at least 2 LSB, what
    ``measure`` checks); the fixed-point one within that spread as measured, in output LSB, with no floor."""
    spread = f"onnxruntime's own optimized vs unoptimized spread on the same input is {result.spread_lsb} LSB"
    if requantize == "exact":
        verdict = "agree" if result.correct else "DO NOT agree"
        diff = f"max abs diff {result.max_abs_diff:.1e}, {result.diff_lsb} LSB"
        return f"outputs {verdict} with onnxruntime ({diff}; {spread}, and the check allows at least 2 LSB)"
    within = result.correct and result.diff_lsb is not None and result.diff_lsb <= result.spread_lsb
    return (
        f"outputs {'within' if within else 'NOT within'} onnxruntime's spread: {result.diff_lsb} LSB from its default "
        f"run (max abs diff {result.max_abs_diff:.1e}); {spread}"
    )


def kind(kernel: str) -> str:
    """A kernel's family: its name without the number TVM adds to tell functions apart."""
    return re.sub(r"\d+$", "", kernel)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:mobilenet_v2?width=0.35&resolution=144")
    parser.add_argument("--cpu", default="cortex-m7")
    parser.add_argument("--out", type=Path, default=Path("results/profile_mcu_int8_mobilenet_v2_035.md"))
    parser.add_argument(
        "--requantize", choices=sorted(REQUANTIZE), default="exact", help="the C kernels' requantization (build's)"
    )
    args = parser.parse_args()
    per_code, named = REQUANTIZE[args.requantize]
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch) / "c"
        model_c = emit_c(quantized(args.model, Path(scratch)), directory, args.cpu, requantize=args.requantize).model
        result = measure_c(directory, f"qemu-{args.cpu}", timeout=3600, per_kernel=True)
        outputs = outputs_per_kernel((directory / "kernels.c").read_text())
    macs = {step["step"]: step["flops"] // 2 for step in model_c.steps}
    families: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])

    def floor(call: dict) -> int:
        """SMLAD and requantization floor of one call (0 for a kernel not on the whole-layer C kernels)."""
        codes = outputs.get(call["kernel"])
        return round(SMLAD_FLOOR * macs[call["step"]] + per_code * codes) if codes else 0

    for call in result.kernels:
        family = families[kind(call["kernel"])]
        family[0] += 1
        family[1] += call["instructions"]
        family[2] += macs[call["step"]]
        family[3] += floor(call)
    total = sum(call["instructions"] for call in result.kernels)
    total_macs = sum(macs.values())

    def per_mac(instructions: int, count: int) -> str:
        """A ratio to two places, or "-" where the denominator is 0."""
        return f"{instructions / count:.2f}" if count else "-"

    lines = [
        f"# Int8 {args.model.removeprefix('zoo:')} on the emulated {args.cpu}, kernel by kernel\n\n",
        f"Written by `python scripts/profile_mcu.py --out {args.out} --requantize {args.requantize}`. Instructions "
        "retired under "
        "`qemu -icount` between the counter reads after each kernel (`measure --per-kernel`); MACs from the step "
        f"table; floor: {SMLAD_FLOOR} instructions per MAC (every instruction an `SMLAD`, loads free) plus "
        f"{per_code} per output code ({named}), for the kernels on the whole-layer C kernels. Whole run: "
        f"{result.instructions / 1e6:,.1f} M instructions, {total_macs / 1e6:,.1f} M MACs, "
        f"{result.instructions / total_macs:.2f} instructions per MAC; {agreement(result, args.requantize)}.\n\n",
        "## By kernel family\n\n| kernels | calls | instructions (M) | share | MACs (M) | instructions / MAC "
        "| floor / MAC | instructions / floor |\n",
        "|---|---:|---:|---:|---:|---:|---:|---:|\n",
    ]
    for name, (calls, instructions, count, least) in sorted(families.items(), key=lambda item: -item[1][1]):
        lines.append(
            f"| {name} | {calls} | {instructions / 1e6:,.2f} | {100 * instructions / total:.1f} % | "
            f"{count / 1e6:,.2f} | {per_mac(instructions, count)} | {per_mac(least, count)} | "
            f"{per_mac(instructions, least)} |\n"
        )
    lines += [
        "\n## Every call\n\n| step | kernel | instructions (k) | MACs (k) | output codes (k) | instructions / MAC "
        "| floor / MAC | instructions / floor |\n",
        "|---:|---|---:|---:|---:|---:|---:|---:|\n",
    ]
    for call in result.kernels:
        count, least, codes = macs[call["step"]], floor(call), outputs.get(call["kernel"])
        lines.append(
            f"| {call['step']} | {call['kernel']} | {call['instructions'] / 1e3:,.1f} | {count / 1e3:,.1f} | "
            f"{f'{codes / 1e3:,.1f}' if codes else '-'} | {per_mac(call['instructions'], count)} | "
            f"{per_mac(least, count)} | {per_mac(call['instructions'], least)} |\n"
        )
    args.out.write_text("".join(lines))
    print("".join(lines[:20]))


if __name__ == "__main__":
    main()
