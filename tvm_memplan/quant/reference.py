"""onnxruntime as the reference of an int8 model: its outputs' LSB and its own run-to-run spread.

onnxruntime's runs of one QDQ file disagree with each other: its default session fuses the QDQ
groups into integer operators (QLinearConv, QGemm, ...), its unoptimized session computes in float
between explicit QuantizeLinear/DequantizeLinear nodes. An int8 network compiled by tvm_memplan is
compared with the default run, within that spread measured in output LSB (at least
:data:`MIN_TOLERANCE_LSB`).

The default session fuses only the groups its selectors match; the rest run as float ops between
DequantizeLinear and QuantizeLinear. Its Conv selector wants the same activation type in and out,
and on x86 uint8: int8 tensors read by one DequantizeLinear are turned into uint8, but a conv
output that SiLU reads twice (Sigmoid and Mul) stays int8, so that conv runs in float (54 of the
81 convs of a TorchScript EfficientNet-B0 export with int8 activations, onnxruntime 1.32; with uint8
activations all 81 are QLinearConv). A float conv's float32 sum can land on the other side of a
rounding tie for an output within ~1e-5 LSB of one (the integer kernel's value is the correctly
rounded one unless MLAS's float32 requantization, which it copies, lands on the tie itself): 1 LSB
on about ten of EfficientNet-B0's 6.7 million conv outputs per input, which later layers carry on
and amplify. onnxruntime's unoptimized
run, all float, differs from its default one the same way at the groups that the default run fuses.
:func:`top_class_agreement` therefore also reports how close the default run's top two classes
were wherever a run's top class differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

MIN_TOLERANCE_LSB = 2
"""The smallest tolerance in output LSB: one LSB of a requantized kernel, one more of rounding ties."""


def output_scales(model: onnx.ModelProto) -> list[float | None]:
    """Per graph output: the per-tensor scale of the DequantizeLinear producing it (through
    Identity nodes), 1 for integer codes a QuantizeLinear produces, else None."""
    constants = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    producers = {out: node for node in model.graph.node for out in node.output}
    scales: list[float | None] = []
    for output in model.graph.output:
        node = producers.get(output.name)
        while node is not None and node.op_type == "Identity":
            node = producers.get(node.input[0])
        if node is not None and node.op_type == "QuantizeLinear":  # integer codes (--int8-io): an LSB is a code
            scales.append(1.0)
            continue
        scale = constants.get(node.input[1]) if node is not None and node.op_type == "DequantizeLinear" else None
        scales.append(float(scale.reshape(())) if scale is not None and scale.size == 1 else None)
    return scales


def is_quantized(model: onnx.ModelProto) -> bool:
    """Whether ``model`` has QuantizeLinear/DequantizeLinear nodes (a QDQ model)."""
    return any(node.op_type in ("QuantizeLinear", "DequantizeLinear") for node in model.graph.node)


def run_onnxruntime(model: onnx.ModelProto, inputs: dict[str, np.ndarray], optimized: bool = True) -> list[np.ndarray]:
    """One onnxruntime CPU run, with all graph optimizations (fused integer kernels) or none."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def lsb_difference(a: np.ndarray, b: np.ndarray, scale: float) -> int:
    """The largest difference between two dequantized outputs, in output LSB."""
    if not a.size:
        return 0
    return int(np.max(np.rint(np.abs(a.astype(np.float64) - b.astype(np.float64)) / scale)))


@dataclass
class Tolerance:
    """How far an output may be from onnxruntime's default run."""

    scale: float
    """The output's LSB (its DequantizeLinear scale)."""
    lsb: int
    """Allowed difference in LSB: onnxruntime's optimized/unoptimized spread, at least :data:`MIN_TOLERANCE_LSB`."""
    spread_lsb: int
    """onnxruntime's own spread on these inputs."""

    @property
    def atol(self) -> float:
        return self.lsb * self.scale * (1 + 1e-6)


def tolerances(
    model: onnx.ModelProto, inputs: dict[str, np.ndarray], reference: list[np.ndarray]
) -> list[Tolerance | None]:
    """Per output of a QDQ model, the LSB tolerance against ``reference`` (onnxruntime's default
    run on ``inputs``); None for an output that is not dequantized per tensor."""
    unoptimized = run_onnxruntime(model, inputs, optimized=False)
    result: list[Tolerance | None] = []
    for scale, fused, plain in zip(output_scales(model), reference, unoptimized, strict=True):
        if scale is None:
            result.append(None)
            continue
        spread = lsb_difference(fused, plain, scale)
        result.append(Tolerance(scale, max(MIN_TOLERANCE_LSB, spread), spread))
    return result


@dataclass
class TopClassAgreement:
    """On the same inputs, how often a run's top class (argmax of the first output) is onnxruntime's
    default run's, beside how often onnxruntime's own unoptimized run's is. Random-weight networks
    have near ties, so even onnxruntime's two runs disagree now and then: the rule is that ours
    agrees at least as often as onnxruntime's unoptimized run does."""

    inputs: int
    ours: int
    unoptimized: int
    ours_margins_lsb: list[int] = field(default_factory=list)
    """Where our top class differs: the default run's value of its top class minus its value of ours,
    in output LSB (0: a tie the default run broke by class index)."""
    unoptimized_margins_lsb: list[int] = field(default_factory=list)
    """The same for onnxruntime's unoptimized run."""

    @property
    def ok(self) -> bool:
        return self.ours >= self.unoptimized

    def __str__(self) -> str:
        return f"{self.ours}/{self.unoptimized} of {self.inputs}"


def top_class_agreement(
    ours: Sequence[np.ndarray],
    default: Sequence[np.ndarray],
    unoptimized: Sequence[np.ndarray],
    scale: float | None = None,
) -> TopClassAgreement:
    """Count top-class agreements with onnxruntime's ``default`` run, one first output per input
    (batch 1: the argmax of the whole output); with the output's ``scale``, also the default run's
    margins (in LSB) where they differ."""
    if not len(ours) == len(default) == len(unoptimized):
        raise ValueError("one output per input from each run")

    def top(output: np.ndarray) -> int:
        return int(np.argmax(output))

    def margins(runs: Sequence[np.ndarray]) -> list[int]:
        if scale is None:
            return []
        return [
            int(np.rint((np.max(r) - r.reshape(-1)[top(a)]) / scale))
            for a, r in zip(runs, default, strict=True)
            if top(a) != top(r)
        ]

    return TopClassAgreement(
        inputs=len(default),
        ours=sum(top(a) == top(r) for a, r in zip(ours, default, strict=True)),
        unoptimized=sum(top(u) == top(r) for u, r in zip(unoptimized, default, strict=True)),
        ours_margins_lsb=margins(ours),
        unoptimized_margins_lsb=margins(unoptimized),
    )
