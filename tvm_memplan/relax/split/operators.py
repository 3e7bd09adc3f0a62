"""What the splitter knows about Relax operators and tensor shapes: which operators keep channels
or rows apart, and the axes of the tensors it tiles."""

from __future__ import annotations

import tvm
from tvm import relax

from ...split.simulate import blocked_bytes
from ..ir_utils import op_name, static_shape, top_level_bindings

CHANNEL = 1
"""The channel axis of NCHW tensors (and the sequence axis of ``(1, sequence, features)`` ones)."""
ROWS = 2
"""The H axis of NCHW tensors."""
CONV = "relax.nn.conv2d"
CONCAT = "relax.concat"
POOLS = {"relax.nn.max_pool2d", "relax.nn.avg_pool2d"}
ELEMENTWISE_MATH = {
    "relax.add",
    "relax.subtract",
    "relax.multiply",
    "relax.divide",
    "relax.maximum",
    "relax.minimum",
    "relax.nn.relu",
    "relax.nn.silu",
    "relax.nn.gelu",
    "relax.nn.leakyrelu",
    "relax.sigmoid",
    "relax.tanh",
    "relax.clip",
    "relax.exp",
    "relax.sqrt",
}
"""Elementwise operators that keep both channels and rows apart."""
PER_CHANNEL_OPS = ELEMENTWISE_MATH | POOLS
ELEMENTWISE_PER_CHANNEL = PER_CHANNEL_OPS - POOLS
ROW_OPS = ELEMENTWISE_MATH | {"relax.nn.gelu_tanh", "relax.erf", "relax.power"}
ROW_GUARDS = {"relax.isnan", "relax.isinf", "relax.isfinite", "relax.logical_not", "relax.where"}
"""Elementwise selections exporters put after a softmax (``where(isnan(p), 0, p)``): row-wise,
but left out of the simulator's fusion (boolean tensors)."""
ELEMENTWISE = (PER_CHANNEL_OPS | ROW_OPS) - POOLS
QUANTIZE = "relax.quantize"
DEQUANTIZE = "relax.dequantize"
QDQ_OPS = {QUANTIZE, DEQUANTIZE}
"""A QDQ model's (de)quantization of activations: elementwise with a per-tensor scale; ``LowerQDQ`` folds
each into the integer kernel that reads or writes the int8 tensor."""


LAYOUT_FOLLOWERS = PER_CHANNEL_OPS | ROW_OPS | QDQ_OPS | {CONCAT, "relax.mean", "relax.nn.adaptive_avg_pool2d"}
"""Operators that carry a convolution's blocked layout on to their output (Relax's ``ConvertLayout``
infers their layout from their inputs'); any other operator reads NCHW."""


def blocked_tensors(func: relax.Function) -> frozenset[relax.Var]:
    """The 4-D tensors a blocked build holds in NCHW[x]c: convolutions' outputs and what follows them
    through :data:`LAYOUT_FOLLOWERS`, as ``ConvertLayout`` carries a convolution's layout. A
    transformer's 4-D attention tensors, or anything after a reshape or a matmul, stay NCHW."""
    blocked: set[relax.Var] = set()
    for binding in top_level_bindings(func):
        var, value = binding.var, binding.value
        shape = static_shape(var.ty)
        if shape is None or len(shape) != 4:
            continue
        if isinstance(value, relax.Var):
            if value in blocked:
                blocked.add(var)
            continue
        op = op_name(value)
        if op == CONV or (op in LAYOUT_FOLLOWERS and any(v in blocked for v in relax.analysis.free_vars(value))):
            blocked.add(var)
    return frozenset(blocked)


def nbytes(var: relax.Expr, block: int | None = None) -> int:
    """Bytes of a statically shaped tensor (0 otherwise), as the simulator counts them: in a blocked
    layout of ``block`` channels a block, its channels rounded up to whole blocks
    (:func:`~tvm_memplan.split.simulate.blocked_bytes`)."""
    shape = static_shape(var.ty)
    return blocked_bytes(shape, tvm.runtime.DataType(str(var.ty.dtype)).bits // 8, block) if shape else 0


def channels(var: relax.Expr) -> int | None:
    """Channels of a batch-1 4-D tensor."""
    shape = static_shape(var.ty)
    return shape[CHANNEL] if shape is not None and len(shape) == 4 and shape[0] == 1 else None


def sequence_rows(var: relax.Expr) -> int | None:
    """Rows of a ``(1, sequence, features)`` tensor."""
    shape = static_shape(var.ty)
    return shape[1] if shape is not None and len(shape) == 3 and shape[0] == 1 else None


def nchw(arg: relax.Expr) -> tuple[int, ...] | None:
    """The shape of a batch-1 4-D tensor."""
    shape = static_shape(arg.ty) if isinstance(arg.ty, relax.TensorType) else None
    return tuple(shape) if shape is not None and len(shape) == 4 and shape[0] == 1 else None


def padding(attrs) -> list[int]:
    """A convolution's or pool's padding as (top, left, bottom, right)."""
    pads = [int(x) for x in attrs.padding]
    return pads * 2 if len(pads) == 2 else pads
