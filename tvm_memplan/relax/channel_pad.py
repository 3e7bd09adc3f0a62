"""Channels padded to whole blocks, so that convolutions with 24, 40 or 58 channels stay in NCHW[x]c.

``ConvertLayout`` converts a convolution to ``NCHW{x}c`` only where its channels divide into blocks
of ``x``; MnasNet (24, 40), ShuffleNetV2 (58, 116, 232) and the squeeze-and-excitation convolutions
of EfficientNet-B0 (4 to 28) left the blocked region and came back through ``layout_transform``.
Like MLAS's NCHWc convolutions and oneDNN's blocked formats, :func:`PadChannels` rounds such
channel counts up to a whole number of blocks: a convolution's weights get zero rows for the
padded output channels and zero columns for padded input channels, and its bias zero entries, so
the real channels are computed exactly and padded channels hold finite values (0, then what the
channel-wise ops between two convolutions make of it: sigmoid(0) = 0.5) that the next
convolution's zero weights ignore. Only channel-wise ops (activations, bias and residual adds,
broadcast multiplies, pools, spatial means) carry a padded tensor; any other use (concat, split,
reshape, dense, the function's outputs) reads the real channels through a ``strided_slice``.
A convolution whose input is not padded gets it padded with zeros (``nn.pad``) where that at most
doubles its input; a stem's 3 input channels stay as they are and only its outputs are padded.
Given the target's :class:`~tvm_memplan.schedule.cpu.CpuSpec`, a convolution whose output blocks no register tile
of several blocks divides gets one block more where the register-tile cycle model says so
(:func:`~tvm_memplan.schedule.cpu.blocked_conv.tile_padded_blocks`: SqueezeNet's 1000 classes, 125 blocks of 8).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..schedule.cpu.blocked_conv import tile_padded_blocks
from ..schedule.cpu.spec import CpuSpec

UNARY_OPS = frozenset({"relax.nn.relu", "relax.sigmoid", "relax.nn.silu", "relax.tanh", "relax.negative"})
"""Channel-wise ops finite on every finite input."""
BINARY_OPS = frozenset({"relax.add", "relax.subtract", "relax.multiply", "relax.maximum", "relax.minimum"})
"""Channel-wise ops of two tensors, finite on finite inputs (``divide`` is, by a constant without zeros)."""
POOL_OPS = frozenset({"relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.adaptive_avg_pool2d"})
MAX_INPUT_GROWTH = 2
"""The most a convolution's input may grow by zero channels padded in (``nn.pad``)."""


def padded_channels(channels: int, block: int) -> int:
    """``channels`` rounded up to a whole number of blocks."""
    return -(-channels // block) * block


def _shape(expr: relax.Expr) -> list[int] | None:
    values = getattr(getattr(expr.ty, "shape", None), "values", None)
    if values is None or not all(isinstance(d, tvm.tirx.IntImm) for d in values):
        return None
    return [int(d) for d in values]


def _op_name(call: relax.Expr) -> str | None:
    if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op):
        return call.op.name
    return None


def _pad_axis(value: np.ndarray, axis: int, size: int, fill: float = 0.0) -> np.ndarray:
    widths = [(0, 0)] * value.ndim
    widths[axis] = (0, size - value.shape[axis])
    return np.pad(value, widths, constant_values=fill)


@relax.expr_functor.mutator
class _PadChannels(relax.PyExprMutator):
    """The rewrite :func:`PadChannels` describes, one dataflow binding at a time: ``padded`` maps an
    original tensor to its padded twin and real channel count; a use the rewrite cannot carry
    reads the real channels, sliced once."""

    def __init__(self, mod: tvm.IRModule, block: int, spec: CpuSpec | None = None) -> None:
        super().__init__(mod)
        self.block = block
        self.spec = spec
        self.padded: dict[relax.Var, tuple[relax.Var, int]] = {}
        self.sliced: set[relax.Var] = set()

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = binding.value
        new = None
        if isinstance(binding.var, relax.DataflowVar) and _op_name(value) is not None:
            new = self._rewrite(value)
        if new is None:
            self._materialize(value)
            super().visit_var_binding_(binding)
            return
        call, channels = new
        var = self.builder_.emit(call)
        padded_to = _shape(var)
        if padded_to is None or padded_to[1] == channels:
            self.set_var_remap(binding.var, var)
        else:
            self.padded[binding.var] = (var, channels)

    def visit_match_cast_(self, binding: relax.MatchCast) -> None:
        self._materialize(binding.value)
        super().visit_match_cast_(binding)

    def _materialize(self, expr: relax.Expr) -> None:
        """Slice the real channels of each padded tensor ``expr`` uses, once, under its own name."""
        for var in relax.analysis.free_vars(expr):
            if var in self.padded and var not in self.sliced:
                twin, channels = self.padded[var]
                sliced = self.builder_.emit(relax.op.strided_slice(twin, [1], [0], [channels]))
                self.set_var_remap(var, sliced)
                self.sliced.add(var)

    def _padded_arg(self, arg: relax.Expr) -> tuple[relax.Expr, int, int] | None:
        """(the padded twin, real channels, padded channels) of a padded 4-d tensor argument."""
        if isinstance(arg, relax.Var) and arg in self.padded:
            twin, channels = self.padded[arg]
            return twin, channels, _shape(twin)[1]
        return None

    def _rewrite(self, call: relax.Call) -> tuple[relax.Expr, int] | None:
        """The padded form of ``call`` and its real output channels, or None to keep it as it is."""
        name = _op_name(call)
        shape = _shape(call)
        if shape is None or len(shape) != 4 or "float" not in str(call.ty.dtype):
            return None
        if name == "relax.nn.conv2d":
            return self._conv(call)
        padded = self._padded_arg(call.args[0]) if call.args else None
        if name in UNARY_OPS or name in POOL_OPS or name == "relax.mean":
            if padded is None or (name in POOL_OPS and str(call.attrs.layout) != "NCHW"):
                return None
            if name == "relax.mean" and not _spatial_mean(call):
                return None
            return relax.Call(call.op, [padded[0], *call.args[1:]], call.attrs), shape[1]
        if name in BINARY_OPS or name == "relax.divide":
            return self._binary(call, shape)
        return None

    def _binary(self, call: relax.Call, shape: list[int]) -> tuple[relax.Expr, int] | None:
        twins = [self._padded_arg(arg) for arg in call.args]
        present = [t for t in twins if t is not None]
        if not present or len({(t[1], t[2]) for t in present}) != 1:
            return None
        channels, padded_to = present[0][1], present[0][2]
        if shape[1] != channels:
            return None
        divide = _op_name(call) == "relax.divide"
        if divide and twins[1] is not None:
            return None
        args = []
        for index, (arg, twin) in enumerate(zip(call.args, twins, strict=True)):
            if twin is not None:
                args.append(twin[0])
                continue
            operand = _constant_operand(arg, channels, padded_to, divisor=divide and index == 1)
            if operand is None:
                return None
            args.append(operand)
        return relax.Call(call.op, args, call.attrs), channels

    def _conv(self, call: relax.Call) -> tuple[relax.Expr, int] | None:
        attrs = call.attrs
        data, weight = call.args
        data_shape, weight_shape = _shape(data), _shape(weight)
        if (
            str(attrs.data_layout) != "NCHW"
            or str(attrs.kernel_layout) != "OIHW"
            or str(attrs.out_layout) != "NCHW"
            or not isinstance(weight, tvm.ir.GenericConst)
            or data_shape is None
            or weight_shape is None
        ):
            return None
        groups, in_channels, out_channels = int(attrs.groups), data_shape[1], weight_shape[0]
        depthwise = groups == in_channels == out_channels and weight_shape[1] == 1
        if groups != 1 and not depthwise:
            return None
        twin = self._padded_arg(data)
        if twin is not None:
            data, in_padded = twin[0], twin[2]
        else:
            in_padded = padded_channels(in_channels, self.block)
            if in_padded > MAX_INPUT_GROWTH * in_channels:
                if depthwise:
                    return None
                in_padded = in_channels  # a stem: read as NCHW1c (:func:`~.layout.BlockedLayout`)
            if in_padded != in_channels:
                pad_width = [0, 0, 0, in_padded - in_channels, 0, 0, 0, 0]
                data = self.builder_.emit(relax.op.nn.pad(data, pad_width))
        out_padded = in_padded if depthwise else padded_channels(out_channels, self.block)
        if not depthwise and self.spec is not None:
            out_width, reduction = _shape(call)[3], in_padded * weight_shape[2] * weight_shape[3]
            out_padded = self.block * tile_padded_blocks(out_padded // self.block, out_width, reduction, self.spec)
        if in_padded == in_channels and out_padded == out_channels:
            return None
        kernel = weight.value.numpy()
        kernel = _pad_axis(kernel, 0, out_padded)
        if not depthwise:
            kernel = _pad_axis(kernel, 1, in_padded)
        conv = relax.op.nn.conv2d(
            data,
            relax.const(kernel),
            strides=attrs.strides,
            padding=attrs.padding,
            dilation=attrs.dilation,
            groups=in_padded if depthwise else 1,
            data_layout="NCHW",
            kernel_layout="OIHW",
            out_layout="NCHW",
            out_dtype=attrs.out_dtype,
        )
        return conv, out_channels


def _spatial_mean(call: relax.Call) -> bool:
    axes = sorted(int(a) % 4 for a in call.attrs.axis or [])
    return axes == [2, 3] and bool(call.attrs.keepdims)


def _constant_operand(arg: relax.Expr, channels: int, padded_to: int, divisor: bool) -> relax.Expr | None:
    """A constant operand of a channel-wise binary op, its channel axis padded (with ones where it
    divides): scalars and ``(1, C, 1, 1)``/``(C, 1, 1)`` constants; None for anything else."""
    if not isinstance(arg, tvm.ir.GenericConst):
        return None
    value = arg.value.numpy()
    if divisor and not np.all(value):
        return None
    if value.size == 1:
        return arg
    axis = value.ndim - 3
    if axis < 0 or value.shape[axis] != channels or value.size != channels:
        return None
    return relax.const(_pad_axis(value, axis, padded_to, fill=1.0 if divisor else 0.0))


def PadChannels(block: int, spec: CpuSpec | None = None) -> tvm.transform.Pass:  # noqa: N802 - named like TVM's passes
    """Convolution channels rounded up to whole blocks of ``block``, and where ``spec``'s register tiles
    want it one block more (see the module docstring)."""

    @tvm.transform.module_pass(opt_level=0, name="tvm_memplan.PadChannels")
    def _pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        rewriter = _PadChannels(mod, block, spec)
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
        return rewriter.builder_.get()

    return _pass
