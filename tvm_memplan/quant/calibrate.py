"""``tvm-memplan quantize --int8``: a float ONNX model to a QDQ int8 one with onnxruntime's static quantizer.

No quantizer of tvm_memplan's own: onnxruntime's ``quant_pre_process`` (shape inference, graph
cleanup) then ``quantize_static`` in the QDQ format, per-channel int8 weights, int8 (or uint8)
activations, MinMax calibration on the user's samples. The result is what :mod:`.lower` lowers.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from ..errors import UserError


@dataclass
class Int8Report:
    """What the quantizer did."""

    samples: int
    quantized_nodes: int
    """QuantizeLinear nodes in the result (activations and the input)."""
    weight_bytes_float: int
    weight_bytes_int8: int


def calibration_batches(model: onnx.ModelProto, arrays: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Split ``arrays`` (one ``(samples, ...)`` array per model input, by name; a lone array feeds a
    lone input whatever its name) into one feed per sample, shaped like the model's static inputs."""
    initializers = {init.name for init in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    if len(inputs) == 1 and len(arrays) == 1:
        arrays = {inputs[0].name: next(iter(arrays.values()))}
    missing = [value.name for value in inputs if value.name not in arrays]
    if missing:
        raise UserError(f"calibration data has no array for input(s) {', '.join(missing)} (it has {', '.join(arrays)})")
    feeds: dict[str, list[np.ndarray]] = {}
    for value in inputs:
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in value.type.tensor_type.shape.dim]
        if not dims or not all(d > 0 for d in dims):
            raise UserError(
                f"input {value.name!r} has a dynamic shape; export the model with static shapes to quantize it"
            )
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        array = np.asarray(arrays[value.name])
        if tuple(array.shape) == tuple(dims):
            array = array[None]
        if tuple(array.shape[1:]) == tuple(dims[1:]) and dims[0] == 1:
            samples = [array[i : i + 1] for i in range(array.shape[0])]
        elif tuple(array.shape[1:]) == tuple(dims):
            samples = list(array)
        else:
            raise UserError(
                f"calibration array for {value.name!r} has shape {array.shape}; "
                f"expected (samples, {', '.join(map(str, dims[1:] if dims[0] == 1 else dims))})"
            )
        feeds[value.name] = [s.astype(dtype) for s in samples]
    counts = {len(v) for v in feeds.values()}
    if len(counts) != 1:
        raise UserError(f"calibration arrays hold different sample counts: {sorted(counts)}")
    count = counts.pop()
    return [{name: samples[i] for name, samples in feeds.items()} for i in range(count)]


def _weight_bytes(model: onnx.ModelProto) -> int:
    return sum(
        int(np.prod(init.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
        for init in model.graph.initializer
    )


def quantize_int8(
    source: Path, output: Path, arrays: dict[str, np.ndarray], activation: str = "int8", per_channel: bool = True
) -> Int8Report:
    """Quantize the float model ``source`` to ``output`` (QDQ, written atomically)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from ..frontend import load_model
    from .validate import unlowerable_quantization

    model = load_model(str(source)).onnx_model
    if any(
        node.op_type in ("QuantizeLinear", "DequantizeLinear") for node in model.graph.node
    ) or unlowerable_quantization(model):
        raise UserError(f"{source} is already quantized; --int8 takes a float model")
    batches = calibration_batches(model, arrays)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(batches)

        def get_next(self):
            return next(self.feeds, None)

    output.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer logs "please consider pre-processing" on every call
    try:
        with tempfile.TemporaryDirectory(prefix="tvm-memplan-int8-") as tmp:
            prepared = Path(tmp) / "prepared.onnx"
            try:
                quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
            except Exception:  # noqa: BLE001 - pre-processing is an optimization; quantize the model as given
                onnx.save(model, str(prepared))
            partial = output.with_name(f".{output.name}.{os.getpid()}.tmp")
            try:
                quantize_static(
                    str(prepared),
                    str(partial),
                    Reader(),
                    quant_format=QuantFormat.QDQ,
                    per_channel=per_channel,
                    activation_type=QuantType.QInt8 if activation == "int8" else QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                )
                quantized = onnx.load(str(partial))
                os.replace(partial, output)
            except UserError:
                raise
            except Exception as exc:  # noqa: BLE001 - onnxruntime's quantizer raises many types
                lines = [line for line in str(exc).splitlines() if line.strip()]
                last = lines[-1] if lines else type(exc).__name__
                raise UserError(f"onnxruntime's quantizer failed: {last}") from None
            finally:
                partial.unlink(missing_ok=True)
    finally:
        root.setLevel(level)
    return Int8Report(
        samples=len(batches),
        quantized_nodes=sum(node.op_type == "QuantizeLinear" for node in quantized.graph.node),
        weight_bytes_float=_weight_bytes(model),
        weight_bytes_int8=_weight_bytes(quantized),
    )
