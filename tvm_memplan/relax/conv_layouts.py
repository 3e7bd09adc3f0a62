"""The blocked channel layouts (NCHW[x]c) a convolution takes: one rule for the layout pass that converts it
(:func:`~tvm_memplan.relax.layout.BlockedLayout`) and the split simulator that sizes what it reads."""

from __future__ import annotations

import tvm
from tvm import relax

from .ir_utils import static_shape

CONV2D = "relax.nn.conv2d"


def is_conv2d(call: relax.Call) -> bool:
    return isinstance(call.op, tvm.ir.Op) and call.op.name == CONV2D


def is_depthwise(call: relax.Call) -> bool:
    """One input channel a group: every output channel reads its own input channel."""
    data, kernel = (static_shape(arg.ty) for arg in call.args[:2])
    if data is None or kernel is None:
        return False
    return int(call.attrs.groups) == data[1] == kernel[0] and kernel[1] == 1


def conv2d_layouts(call: relax.Call, block: int) -> list[str] | None:
    """The data, kernel (and output) layouts of an NCHW/OIHW convolution in the blocked layout of ``block``
    channels (None for any other call): depthwise convolutions keep one weight per channel (``OIHW[x]o``),
    the others take ``OIHW[x]i[x]o``; a convolution whose input channels do not fill a block (a stem's 3,
    which :func:`~.channel_pad.PadChannels` leaves) reads ``NCHW1c``, a view of NCHW, with weights
    ``OIHW1i[x]o``, and writes ``NCHW[x]c``, as MLAS's NCHW-input convolution does."""
    if not is_conv2d(call) or str(call.attrs.data_layout) != "NCHW" or str(call.attrs.kernel_layout) != "OIHW":
        return None
    if is_depthwise(call):
        return [f"NCHW{block}c", f"OIHW{block}o"]
    data = static_shape(call.args[0].ty)
    if data is not None and data[1] % block and int(call.attrs.groups) == 1:
        return ["NCHW1c", f"OIHW1i{block}o", f"NCHW{block}c"]
    return [f"NCHW{block}c", f"OIHW{block}i{block}o"]
