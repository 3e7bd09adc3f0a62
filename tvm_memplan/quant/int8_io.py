"""A QDQ model that takes and gives int8 codes, as TensorFlow Lite Micro's fully integer models do
(``inference_input_type = tf.int8``): the caller quantizes its input with the scale and zero point the
model states, so the input buffer holds 1 byte per element instead of 4, and reads int8 codes back.

:func:`with_int8_io` drops the QuantizeLinear that reads each float graph input and the
DequantizeLinear that writes each graph output. The graph is otherwise unchanged, so onnxruntime's
run of it is the reference for the integer build.
"""

from __future__ import annotations

import onnx
from onnx import numpy_helper

from ..errors import UserError


def _per_tensor(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto]) -> onnx.TensorProto | None:
    """The zero point of a per-tensor QuantizeLinear/DequantizeLinear, or None."""
    if len(node.input) < 3 or node.input[1] not in constants or node.input[2] not in constants:
        return None
    scale, zero_point = constants[node.input[1]], constants[node.input[2]]
    return zero_point if numpy_helper.to_array(scale).size == 1 else None


def _rename(model: onnx.ModelProto, old: str, new: str) -> None:
    for node in model.graph.node:
        node.input[:] = [new if name == old else name for name in node.input]
        node.output[:] = [new if name == old else name for name in node.output]


def with_int8_io(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (QDQ) with integer inputs and outputs (see the module docstring); a one-line UserError
    for a graph input not read by per-tensor QuantizeLinear nodes alone, or an output not written by
    a per-tensor DequantizeLinear."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    constants = {init.name: init for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = node.attribute[0].t
    for value in graph.input:
        if value.name in constants:
            continue
        readers = [node for node in graph.node if value.name in node.input]
        points = [_per_tensor(n, constants) if n.op_type == "QuantizeLinear" else None for n in readers]
        if not readers or any(p is None for p in points):
            raise UserError(f"--int8-io: input {value.name!r} is not read by per-tensor QuantizeLinear nodes alone")
        values = {tuple(numpy_helper.to_array(constants[n.input[k]]).item() for k in (1, 2)) for n in readers}
        if len(values) != 1:
            raise UserError(f"--int8-io: input {value.name!r} is quantized with more than one scale")
        for node in readers:
            graph.node.remove(node)
            _rename(model, node.output[0], value.name)
        value.type.tensor_type.elem_type = points[0].data_type
    for value in graph.output:
        writer = next((node for node in graph.node if value.name in node.output), None)
        point = _per_tensor(writer, constants) if writer is not None and writer.op_type == "DequantizeLinear" else None
        if point is None or writer.input[0] in constants or any(v.name == writer.input[0] for v in graph.input):
            raise UserError(f"--int8-io: output {value.name!r} is not written by a per-tensor DequantizeLinear")
        graph.node.remove(writer)
        _rename(model, writer.input[0], value.name)
        value.type.tensor_type.elem_type = point.data_type
    kept = {o.name for o in graph.output} | {i.name for i in graph.input}
    stale = [v for v in graph.value_info if v.name in kept]  # the float types the graph edges had
    for value in stale:
        graph.value_info.remove(value)
    onnx.checker.check_model(model)
    return model
