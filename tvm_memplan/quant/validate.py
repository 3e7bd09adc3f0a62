"""Quantized ONNX models tvm_memplan cannot lower, rejected with one line that says how to re-export.

tvm_memplan lowers the QDQ format (QuantizeLinear/DequantizeLinear around float ops, per-tensor or
per-channel, int8/uint8), what ``onnxruntime.quantization.quantize_static(quant_format=QDQ)`` and
PyTorch's exporters write. Three other encodings are refused before import:

* the QOperator format (QLinearConv, QLinearMatMul, QGemm, ...) and dynamic quantization
  (ConvInteger, MatMulInteger, DynamicQuantizeLinear): TVM 0.27's frontend has no QLinearConv, and
  integer ops whose scales are computed at run time have no static requantization;
* QDQ with float8 or 4-bit types;
* blocked quantization (the ``block_size`` attribute of opset 21): one scale per block of a row.
"""

from __future__ import annotations

import onnx

from ..errors import UserError

REEXPORT = (
    "re-export it in the QDQ format with int8/uint8 per-tensor or per-channel scales: "
    "onnxruntime.quantization.quantize_static(..., quant_format=QuantFormat.QDQ) "
    "or tvm-memplan quantize MODEL.onnx --int8"
)

QOPERATOR_OPS = {
    "QLinearConv",
    "QLinearMatMul",
    "ConvInteger",
    "MatMulInteger",
    "DynamicQuantizeLinear",
    # onnxruntime's contrib (com.microsoft) QOperator kernels
    "QGemm",
    "QLinearAdd",
    "QLinearMul",
    "QLinearAveragePool",
    "QLinearGlobalAveragePool",
    "QLinearConcat",
    "QLinearSigmoid",
    "QLinearLeakyRelu",
    "QLinearSoftmax",
    "QLinearReduceMean",
    "QLinearWhere",
    "QAttention",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
    "QLinearConvTranspose",
    "MatMulInteger16",
}

_SUPPORTED_TYPES = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT32}
"""Element types of QDQ integers (int32: biases)."""


def _type_name(elem_type: int) -> str:
    return onnx.TensorProto.DataType.Name(elem_type)


def unlowerable_quantization(model: onnx.ModelProto) -> str | None:
    """Why ``model`` is a quantized model tvm_memplan cannot take (one phrase), or None."""
    elem_types = {init.name: init.data_type for init in model.graph.initializer}
    for value in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        if value.type.HasField("tensor_type"):
            elem_types.setdefault(value.name, value.type.tensor_type.elem_type)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            elem_types[node.output[0]] = node.attribute[0].t.data_type
    for node in model.graph.node:
        label = f"{node.op_type} (node {node.name or node.output[0]!r})"
        if node.op_type in QOPERATOR_OPS:
            return f"{label} is a QOperator-format or dynamically quantized operator"
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("block_size", 0):
            return f"{label} uses blocked quantization (block_size={attrs['block_size']})"
        integer = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if node.op_type == "DequantizeLinear":
            integer = node.input[0]
        types = [elem_types.get(integer)] if integer else []
        if attrs.get("output_dtype"):
            types.append(attrs["output_dtype"])
        for elem_type in types:
            if elem_type is not None and elem_type not in _SUPPORTED_TYPES:
                return f"{label} quantizes to {_type_name(elem_type)}"
    return None


def check_quantization(model: onnx.ModelProto, name: str) -> None:
    """Raise a one-line :class:`UserError` for a quantized model tvm_memplan cannot lower."""
    problem = unlowerable_quantization(model)
    if problem:
        raise UserError(f"{name}: {problem}; {REEXPORT}")
