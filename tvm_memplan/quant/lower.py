"""The ``LowerQDQ`` Relax pass: each DequantizeLinear → op → QuantizeLinear group becomes one integer kernel.

TVM's ONNX frontend imports a QDQ model as float ops between ``R.dequantize`` and ``R.quantize``;
its pipeline then folds the weights' dequantize into float constants and runs every op in float32,
so activations travel between kernels as float32 and the arena is the float model's. This pass
matches the groups onnxruntime itself fuses into integer operators (its QDQ selectors: QLinearConv,
QGemm/QLinearMatMul, QLinearAdd/Mul, QLinearGlobalAveragePool, QLinearSigmoid, and the data-movement
ops it runs on int8 directly) and replaces each with one kernel of :mod:`.kernels`, reading and
writing int8/uint8. The dequantize of a lowered kernel's input is then dead, so tensors between two
lowered kernels are 1-byte tensors in the arena. Weights stay int8 constants, biases int32.

Patterns (the output quantize is per-tensor; weights per-tensor or per-channel, zero point 0):

* ``conv2d(dq(x), dq(W)) [+ bias] [relu|clip]`` → :func:`.kernels.conv2d` (a folded Relu/Clip
  narrows the output clamp: quantization is monotonic, so clamping before or after is the same;
  on a CPU with a dot-product instruction :func:`.dot_kernels.conv2d_dot`, or for a depthwise one
  :func:`.dot_kernels.depthwise_conv2d`);
* ``matmul(dq(x), dq(W)ᵀ | dq(W)) [+ bias] [relu|clip]`` → :func:`.kernels.dense` (2-d on such a
  CPU: :func:`.dot_kernels.dense_dot`). The weights may
  also be ``dq(q(float constant))`` and the bias a float constant (PyTorch's exports) or an int32
  one of another scale (a bias tensor shared between convs): both are quantized to the
  accumulator's scale here;
* ``add|multiply(dq(a), dq(b)) [relu|clip]`` → :func:`.kernels.binary`;
* ``mean(dq(x))`` (GlobalAveragePool) → :func:`.kernels.mean`, ``avg_pool2d(dq(x))`` → :func:`.kernels.avg_pool2d`;
* reshape, permute_dims, strided_slice, a part of split, max_pool2d, concat of ``dq`` inputs with the
  output's scale and zero point → the same op on the integers (exact: these ops move or select
  values; concat inputs of another scale are requantized through a table first);
* any tree of elementwise float ops of one ``dq`` input (Sigmoid, HardSwish, HardSigmoid, Tanh, ...),
  also through an inner ``dq(q(...))`` used only there (SiLU: ``x * sigmoid(x)`` with the sigmoid
  quantized) → a 256-entry lookup table computed in float32 numpy;
* any other ``quantize`` of a float tensor (the network input, an op kept in float) → MLAS's
  QuantizeLinear (round half to even; TVM's legalization uses ``round``), fused into the conv
  that is its only reader (the conv quantizes its float input as it pads it: the quantized input
  is no arena tensor, as the float input is none in the float build).

Anything else keeps its dequantize and quantize and runs in float: correct, not integer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..relax.ir_utils import constant_value, op_name, static_shape
from ..schedule.cpu.spec import cpu_spec
from . import dot_kernels, kernels, mcu_kernels
from .kernels import INT_RANGE
from .qdq_graph import (
    Clamp,
    QDQGraph,
    QParams,
    called_functions,
    has_qdq,
    prim_float,
    tensor_dtype,
)
from .tables import quantized_table, requantization_table, tabulate

_POINTWISE = {"strides": [1, 1], "padding": [0, 0, 0, 0], "dilation": [1, 1]}
"""The geometry of a dense as a 1x1 convolution."""


@dataclass
class LoweringReport:
    """What :func:`LowerQDQ` did to each quantize of ``main``."""

    lowered: dict[str, int]
    """Kernel kind → how many groups became it."""
    kept_float: list[str]
    """The ops between a dequantize and a quantize that stay in float (op name)."""

    @property
    def total(self) -> int:
        return sum(self.lowered.values())


@mutator
class _Lowerer(PyExprMutator):
    def __init__(
        self,
        mod: tvm.IRModule,
        graph: QDQGraph,
        report: LoweringReport,
        int8_dot: str | None = None,
        min_max: bool = False,
    ) -> None:
        super().__init__(mod)
        self.min_max = min_max
        """Whether the convolutions clamp with C's fmaxf/fminf (:attr:`.CpuSpec.float_min_max`)."""
        self.graph = graph
        self.report = report
        self.int8_dot = int8_dot
        """The CPU's int8 dot-product instruction (a key of :data:`.dot_kernels.DOT_INSTRUCTIONS`): regular
        convolutions then use :func:`.dot_kernels.conv2d_dot`, depthwise ones :func:`.dot_kernels.depthwise_conv2d`
        (integer vectors, which every CPU with such an instruction has)."""
        self._recipe: tuple | None = None
        self.recipes: dict[relax.Var, tuple] = {}
        """A lowered conv/dense quantize's var → (kernel, args, kwargs, name, kind): the concat of
        another scale re-emits the kernel with its requantization table in the epilogue."""
        self.kinds: list[tuple[relax.Var, str]] = []
        """Each lowered quantize's var and kernel kind (some die when a later table absorbs them)."""

    # -- emission helpers -------------------------------------------------------------------------

    def _emit(self, binding: relax.VarBinding, value: relax.Expr, kind: str) -> None:
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))
        self.kinds.append((binding.var, kind))

    def _call_te(self, func: Callable, *args, name: str, **kwargs) -> relax.Expr:
        call = self.builder_.call_te(func, *args, primfunc_name_hint=name, **kwargs)
        return mcu_kernels.opaque_to_fusion(self.builder_, call)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = binding.value
        if op_name(value) == "relax.quantize":
            self._recipe = None
            lowered = self._lower_quantize(binding)
            if lowered is not None:
                self._emit(binding, *lowered)
                if self._recipe is not None:
                    self.recipes[binding.var] = self._recipe
                return
        super().visit_var_binding_(binding)

    # -- matching ---------------------------------------------------------------------------------

    def _lower_quantize(self, binding: relax.VarBinding) -> tuple[relax.Expr, str] | None:
        data, scale, zero_point = binding.value.args
        s, z = constant_value(scale), constant_value(zero_point)
        out_dtype = str(binding.value.attrs.out_dtype)
        if s is None or z is None or s.size != 1 or z.size != 1 or out_dtype not in INT_RANGE:
            return None
        out = QParams(float(s.reshape(())), int(z.reshape(())), out_dtype)
        g = self.graph
        if not self._is_float_input(data) and g.single_use(data):
            for lower in (self._movement, self._table, self._conv_or_dense, self._binary, self._mean, self._avg_pool):
                result = lower(data, out)
                if result is not None:
                    return result
            self.report.kept_float.append(op_name(g.value(data)) or "?")
        if tensor_dtype(data) != "float32":
            return None
        # the network input, or the result of an op kept in float: QuantizeLinear as MLAS computes it
        # (TVM's legalization rounds with ``round``, half away from zero in C)
        return self._call_te(
            kernels.quantize,
            self.visit_expr(data),
            scale=out.scale,
            zero_point=out.zero_point,
            out_dtype=out.dtype,
            name="quantize_linear",
        ), "quantize"

    def _is_float_input(self, data: relax.Expr) -> bool:
        """A float tensor that no op produces inside this function's QDQ graph: a function parameter."""
        return isinstance(data, relax.Var) and data not in self.graph.defs and tensor_dtype(data) == "float32"

    def _strip_clamp(self, expr: relax.Expr) -> tuple[relax.Expr, Clamp]:
        """Relu/Clip on the way from the quantize to the op, as one float clamp."""
        clamp = Clamp()
        g = self.graph
        while True:
            call = g.value(expr)
            name = op_name(call)
            if name == "relax.nn.relu" and g.single_use(call.args[0]):
                clamp.low = max(clamp.low, 0.0)
            elif name == "relax.clip" and g.single_use(call.args[0]):
                low, high = prim_float(call.args[1]), prim_float(call.args[2])
                if low is None or high is None:
                    return expr, clamp
                clamp.low, clamp.high = max(clamp.low, low), min(clamp.high, high)
            else:
                return expr, clamp
            expr = call.args[0]

    def _movement(self, data: relax.Expr, out: QParams) -> tuple[relax.Expr, str] | None:
        call = self.graph.value(data)
        name = op_name(call)
        if isinstance(call, relax.TupleGetItem):
            return self._split_item(call, out)
        if name in ("relax.reshape", "relax.permute_dims", "relax.nn.max_pool2d", "relax.strided_slice"):
            inputs = [call.args[0]]
        elif name == "relax.concat" and isinstance(call.args[0], relax.Tuple):
            inputs = list(call.args[0].fields)
        else:
            return None
        sources = []
        for item in inputs:
            found = self.graph.activation(item)
            if found is None or found[1].dtype != out.dtype or (found[1] != out and name != "relax.concat"):
                return None
            source = self.visit_expr(found[0])
            if found[1] != out:  # onnxruntime's QLinearConcat requantizes such an input through a table
                table = relax.const(requantization_table(found[1], out))
                recipe = self.recipes.get(found[0])
                if recipe is not None and self.graph.single_use(found[0]) and self.graph.single_use(item):
                    # the producing conv/dense applies the table in its epilogue: one kernel, and the
                    # concat can take its output in place
                    func, args, kwargs, kernel_name, kind = recipe
                    source = self.builder_.emit(self._call_te(func, *args, table=table, name=kernel_name, **kwargs))
                    self.kinds.append((source, kind))
                else:
                    source = self._call_te(kernels.lookup, source, table, name="qrequantize")
            sources.append(source)
        if name == "relax.concat":
            new_args = [relax.Tuple(sources)] + list(call.args[1:])
        else:
            new_args = [sources[0]] + list(call.args[1:])
        return relax.Call(call.op, new_args, call.attrs, call.ty_args), name.split(".")[-1]

    def _split_item(self, item: relax.TupleGetItem, out: QParams) -> tuple[relax.Expr, str] | None:
        """One part of ``split(dq(x))`` (ShuffleNet's channel split): a strided slice of the integers."""
        call = self.graph.value(item.tuple_value)
        if op_name(call) != "relax.split":
            return None
        source = self.graph.activation(call.args[0])
        shape = static_shape(call.args[0].ty)
        if source is None or source[1] != out or shape is None:
            return None
        axis = int(call.attrs.axis) % len(shape)
        sections = call.attrs.indices_or_sections
        if isinstance(sections, tvm.tirx.IntImm):
            step = shape[axis] // int(sections)
            bounds = [step * i for i in range(1, int(sections))]
        else:
            bounds = [int(v) for v in sections]
        edges = [0, *bounds, shape[axis]]
        index = int(item.index)
        sliced = relax.op.strided_slice(
            self.visit_expr(source[0]), axes=[axis], begin=[edges[index]], end=[edges[index + 1]]
        )
        return sliced, "strided_slice"

    def _conv_or_dense(self, data: relax.Expr, out: QParams) -> tuple[relax.Expr, str] | None:
        g = self.graph
        core, clamp = self._strip_clamp(data)
        bias = None
        call = g.value(core)
        if op_name(call) == "relax.add":
            for acc, other in ((call.args[0], call.args[1]), (call.args[1], call.args[0])):
                if op_name(g.value(acc)) in ("relax.nn.conv2d", "relax.matmul") and g.single_use(acc):
                    bias = g.dequantized_constant(other)
                    if bias is None:
                        float_bias = g.float_constant(other)
                        if float_bias is not None:  # real values: scale 1, zero point 0
                            bias = (float_bias, np.ones_like(float_bias), np.zeros(float_bias.shape, np.int64))
                    if bias is not None:
                        core, call = acc, g.value(acc)
                        break
            else:
                return None
        name = op_name(call)
        if name not in ("relax.nn.conv2d", "relax.matmul") or (not core.same_as(data) and not g.single_use(core)):
            return None
        source = g.activation(call.args[0])
        weight = g.dequantized_constant(call.args[1])
        if source is None or weight is None:
            return None
        x, xq = source
        w_int, w_scale, w_zero = weight
        if name == "relax.nn.conv2d":
            attrs = call.attrs
            if str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != "OIHW" or w_int.ndim != 4:
                return None
            channels = w_int.shape[0]
            per_channel = (w_scale.reshape(channels, -1), w_zero.reshape(channels, -1))
            w_matrix = w_int
        else:
            if w_int.ndim != 2 or len(static_shape(x.ty) or ()) < 1:
                return None
            channels = w_int.shape[1]
            per_channel = (w_scale.T.reshape(channels, -1), w_zero.T.reshape(channels, -1))
            w_matrix = np.ascontiguousarray(w_int.T)  # (N, K)
        scale_oc, zero_oc = per_channel
        if not (np.all(scale_oc == scale_oc[:, :1]) and np.all(zero_oc == zero_oc[:, :1])):
            return None  # scales vary inside an output channel: blocked or per-input-channel weights
        w_shifted = w_matrix.astype(np.int64) - zero_oc[:, 0].reshape((-1,) + (1,) * (w_matrix.ndim - 1))
        if w_shifted.min(initial=0) < -128 or w_shifted.max(initial=0) > 127:
            return None
        # onnxruntime: output_scales[i] = X_scale * W_scale[i] / Y_scale, in float32
        multiplier = (np.float32(xq.scale) * scale_oc[:, 0].astype(np.float32)) / np.float32(out.scale)
        if bias is None:
            bias_int = np.zeros(channels, np.int32)
        else:
            b_int, b_scale, b_zero = bias
            if b_int.dtype not in (np.int32, np.float32) or b_int.size != channels or np.any(b_zero != 0):
                return None
            accumulator_scale = np.float32(xq.scale) * scale_oc[:, 0].astype(np.float32)
            bias_int = b_int.reshape(-1).astype(np.int32)
            same_scale = np.array_equal(b_scale.reshape(-1).astype(np.float32), accumulator_scale)
            if b_int.dtype == np.float32 or not same_scale:
                # a float bias (PyTorch's exports) or one quantized with another scale (TorchScript exports
                # share one bias tensor between convs): quantized to the accumulator's scale, off by at
                # most half an accumulator LSB
                real = b_int.reshape(-1).astype(np.float64) * b_scale.reshape(-1).astype(np.float64)
                rescaled = np.rint(real / accumulator_scale.astype(np.float64))
                if np.abs(rescaled).max(initial=0) >= 2**31:
                    return None
                bias_int = rescaled.astype(np.int32)
        low, high = clamp.bounds(out)
        common = {"y_zero_point": out.zero_point, "low": low, "high": high, "out_dtype": out.dtype}
        accumulate = kernels.accumulator_dtype(w_shifted, xq.dtype)
        float_input = None
        if name == "relax.nn.conv2d":
            attrs = call.attrs
            groups = int(attrs.groups)
            kind = "depthwise_conv2d" if groups == channels and groups > 1 else "conv2d"
            if self.int8_dot == "dsp-smlad" and kind == "depthwise_conv2d":
                accumulate = "int32"  # a Cortex-M: integer multiply-adds, no int-to-float conversion per operand
            float_input = self._fusable_quantize(x, call.args[0], xq)
            geometry = {
                "strides": [int(v) for v in attrs.strides],
                "padding": [int(v) for v in attrs.padding],
                "dilation": [int(v) for v in attrs.dilation],
                "x_zero_point": xq.zero_point,
            }
            # (on a Cortex-M, a conv of at most 4 input channels, the stem, gains nothing from SMLAD's layout)
            if self.int8_dot and groups == 1 and not (self.int8_dot == "dsp-smlad" and w_shifted.shape[1] <= 4):
                # the dot-product kernel: the input packed to the instruction's signedness, weights
                # packed, the bias folded for the moved zero point
                instruction = dot_kernels.DOT_INSTRUCTIONS[self.int8_dot]
                func = mcu_kernels.dot_conv(self.int8_dot, w_shifted.shape, geometry, xq.dtype)
                kwargs = {"out_channels": channels, "packed_dtype": instruction.packed_dtype, **geometry, **common}
                zero_point = dot_kernels.dot_zero_point(xq.zero_point, xq.dtype, instruction.packed_dtype)
                stored = dot_kernels.pack_dot_weights(w_shifted, instruction.lanes, instruction.depth)
            elif self.int8_dot and self.int8_dot != "dsp-smlad" and kind == "depthwise_conv2d":
                # the same CPUs' integer vectors: int8 products widened to int32
                func, kwargs = dot_kernels.depthwise_conv2d, {**geometry, **common}
                zero_point, stored = xq.zero_point, w_shifted
            else:
                func = mcu_kernels.conv2d if self.int8_dot == "dsp-smlad" else kernels.conv2d  # Cortex-M: C kernels
                kwargs = {**geometry, "groups": groups, "accumulate": accumulate, **common}
                zero_point, stored = xq.zero_point, w_shifted
            if float_input is not None:
                x, kind = float_input, f"quantize+{kind}"
                kwargs["quantize_input"] = (xq.scale, xq.dtype)
        elif self.int8_dot == "dsp-smlad" and (static_shape(x.ty) or (0, 0))[:-1] == (1,):
            # a Cortex-M: a dense of one row as the 1x1 convolution of one pixel, on SMLAD
            func, kind, zero_point = (
                mcu_kernels.dot_conv(self.int8_dot, (channels, w_shifted.shape[1], 1, 1), _POINTWISE, xq.dtype),
                "dense",
                dot_kernels.dot_zero_point(xq.zero_point, xq.dtype, "int8"),
            )
            kwargs = {"out_channels": channels, "packed_dtype": "int8", **_POINTWISE, "x_zero_point": xq.zero_point}
            kwargs.update(common)
            stored = dot_kernels.pack_dot_weights(w_shifted[:, :, None, None], 4, 4)
        else:
            kind = "dense"
            if self.int8_dot and self.int8_dot != "dsp-smlad" and len(static_shape(x.ty) or ()) == 2:
                # as a 1x1 convolution of the rows on the dot-product instruction
                instruction = dot_kernels.DOT_INSTRUCTIONS[self.int8_dot]
                func = dot_kernels.dense_dot
                kwargs = {"out_channels": channels, "packed_dtype": instruction.packed_dtype, **common}
                kwargs["x_zero_point"] = xq.zero_point
                zero_point = dot_kernels.dot_zero_point(xq.zero_point, xq.dtype, instruction.packed_dtype)
                stored = dot_kernels.pack_dot_weights(w_shifted[:, :, None, None], instruction.lanes, instruction.depth)
            else:
                func, kwargs = kernels.dense, {"accumulate": accumulate, **common}
                zero_point, stored = xq.zero_point, np.ascontiguousarray(w_shifted.T)  # dense: (K, N)
        if func in (mcu_kernels.conv2d, mcu_kernels.pointwise_conv2d):  # the C kernels' integer requantization
            kwargs["fixed_point"] = mcu_kernels.fits_fixed_point(multiplier)
        try:
            bias_int = kernels.fold_zero_point(bias_int, w_shifted, zero_point)
        except OverflowError:
            return None
        consts = [
            relax.const(stored.astype(np.int8)),
            relax.const(bias_int),
            relax.const(multiplier.astype(np.float32)),
        ]
        if self.min_max and func in (kernels.conv2d, dot_kernels.conv2d_dot, *mcu_kernels.CONVOLUTIONS):
            kwargs["min_max"] = True
        x_new = self.visit_expr(x)
        kernel_name = "qdense" if kind == "dense" else f"q{kind.split('+')[-1]}"
        if kind == "dense" and func in mcu_kernels.DOT_CONVOLUTIONS:  # (1, K) -> (1, K, 1, 1) -> (1, N, 1, 1) -> (1, N)
            pixel = self.builder_.emit(relax.op.reshape(x_new, (1, w_shifted.shape[1], 1, 1)))
            out = self.builder_.emit(self._call_te(func, pixel, *consts, name=kernel_name, **kwargs))
            return relax.op.reshape(out, (1, channels)), kind
        self._recipe = (func, [x_new, *consts], kwargs, kernel_name, kind)
        return self._call_te(func, x_new, *consts, name=kernel_name, **kwargs), kind

    def _fusable_quantize(self, x: relax.Expr, dequantized: relax.Expr, xq: QParams) -> relax.Expr | None:
        """The network input ``x = quantize(input)`` quantizes, when this conv is its only reader
        (QuantizeLinear → DequantizeLinear → first conv): the conv quantizes as it
        pads, and the quantized copy of the input, as large as the first conv's output in
        ShuffleNetV2 and MobileNetV3, leaves the arena."""
        g = self.graph
        call = g.value(x)
        if op_name(call) != "relax.quantize" or not g.single_use(x) or not g.single_use(dequantized):
            return None
        source = call.args[0]
        scale, zero_point = constant_value(call.args[1]), constant_value(call.args[2])
        if (
            scale is None
            or zero_point is None
            or scale.size != 1
            or zero_point.size != 1
            or not self._is_float_input(source)
            or len(static_shape(source.ty) or ()) != 4
        ):
            return None
        if QParams(float(scale.reshape(())), int(zero_point.reshape(())), str(call.attrs.out_dtype)) != xq:
            return None
        return source

    def _binary(self, data: relax.Expr, out: QParams) -> tuple[relax.Expr, str] | None:
        g = self.graph
        core, clamp = self._strip_clamp(data)
        call = g.value(core)
        name = op_name(call)
        if name not in ("relax.add", "relax.multiply") or (not core.same_as(data) and not g.single_use(core)):
            return None
        a, b = g.activation(call.args[0]), g.activation(call.args[1])
        shape = static_shape(call.ty)
        if a is None or b is None or shape is None:
            return None
        low, high = clamp.bounds(out)
        op = "add" if name == "relax.add" else "multiply"
        if op == "add":
            fused = self._add_into_producer(call, a, b, shape, out, low, high)
            if fused is not None:
                return fused
        return self._call_te(
            kernels.binary,
            self.visit_expr(a[0]),
            self.visit_expr(b[0]),
            op=op,
            out_shape=shape,
            a_scale=a[1].scale,
            a_zero_point=a[1].zero_point,
            b_scale=b[1].scale,
            b_zero_point=b[1].zero_point,
            y_scale=out.scale,
            y_zero_point=out.zero_point,
            low=low,
            high=high,
            out_dtype=out.dtype,
            name=f"q{op}",
        ), op

    def _add_into_producer(
        self, call: relax.Call, a: tuple, b: tuple, shape: tuple[int, ...], out: QParams, low: int, high: int
    ) -> tuple[relax.Expr, str] | None:
        """A residual add whose operand comes only from a lowered conv/dense: that kernel re-emitted
        with the add in its epilogue (the conv's own rounding, then MLAS's add: the same integers as
        two kernels, one pass and one tensor fewer, as the float build's fused conv + add)."""
        g = self.graph
        ratio_a, ratio_b, constant = kernels.add_parameters(
            a[1].scale, a[1].zero_point, b[1].scale, b[1].zero_point, out.scale, out.zero_point
        )
        for position, (mine, other) in enumerate(((a, b), (b, a))):
            recipe = self.recipes.get(mine[0])
            if (
                recipe is None
                or not g.single_use(mine[0])
                or not g.single_use(call.args[position])
                or static_shape(mine[0].ty) != shape
                or static_shape(other[0].ty) != shape
            ):
                continue
            func, args, kwargs, kernel_name, kind = recipe
            residual_add = {
                "ratio_a": ratio_a,
                "ratio_b": ratio_b,
                "constant": constant,
                "low": low,
                "high": high,
                "out_dtype": out.dtype,
                "code_first": position == 0,
            }
            fused = self._call_te(
                func,
                *args,
                residual=self.visit_expr(other[0]),
                residual_add=residual_add,
                name=f"{kernel_name}_add",
                **kwargs,
            )
            return fused, f"{kind}+add"
        return None

    def _mean(self, data: relax.Expr, out: QParams) -> tuple[relax.Expr, str] | None:
        g = self.graph
        call = g.value(data)
        if op_name(call) != "relax.mean" or call.attrs.axis is None:
            return None
        source = g.activation(call.args[0])
        in_shape = static_shape(call.args[0].ty)
        if source is None or in_shape is None:
            return None
        axes = [int(a) for a in call.attrs.axis]
        count = int(np.prod([in_shape[a] for a in axes]))
        # onnxruntime's QLinearGlobalAveragePool: x_scale / (count * y_scale) in float32
        multiplier = float(np.float32(source[1].scale) / (np.float32(count) * np.float32(out.scale)))
        low, high = INT_RANGE[out.dtype]
        return self._call_te(
            kernels.mean,
            self.visit_expr(source[0]),
            axes=axes,
            keepdims=bool(call.attrs.keepdims),
            multiplier=multiplier,
            x_zero_point=source[1].zero_point,
            y_zero_point=out.zero_point,
            low=low,
            high=high,
            out_dtype=out.dtype,
            name="qmean",
        ), "mean"

    def _avg_pool(self, data: relax.Expr, out: QParams) -> tuple[relax.Expr, str] | None:
        call = self.graph.value(data)
        if op_name(call) != "relax.nn.avg_pool2d":
            return None
        attrs = call.attrs
        source = self.graph.activation(call.args[0])
        if (
            source is None
            or str(attrs.layout) != "NCHW"
            or bool(attrs.ceil_mode)
            or any(int(d) != 1 for d in attrs.dilation)
            or source[1].dtype != out.dtype
        ):
            return None
        return self._call_te(
            kernels.avg_pool2d,
            self.visit_expr(source[0]),
            pool_size=[int(v) for v in attrs.pool_size],
            strides=[int(v) for v in attrs.strides],
            padding=[int(v) for v in attrs.padding],
            count_include_pad=bool(attrs.count_include_pad),
            x_scale=source[1].scale,
            x_zero_point=source[1].zero_point,
            y_scale=out.scale,
            y_zero_point=out.zero_point,
            out_dtype=out.dtype,
            name="qavg_pool2d",
        ), "avg_pool2d"

    def _table(self, data: relax.Expr, out: QParams) -> tuple[relax.Expr, str] | None:
        """An elementwise float function of one dequantized input, tabulated over its 256 values."""
        tabulated = tabulate(self.graph, data)
        if tabulated is None:
            return None
        values, source = tabulated
        table = quantized_table(values, out)
        x = self.visit_expr(source)
        return self._call_te(kernels.lookup, x, relax.const(table), name="qlookup"), "lookup"


def lower_function(
    mod: tvm.IRModule, gv: tvm.ir.GlobalVar, int8_dot: str | None = None, min_max: bool = False
) -> tuple[tvm.IRModule, LoweringReport]:
    """``mod`` with function ``gv`` lowered and its integer kernels added (regular convolutions in
    the layout of the dot-product instruction ``int8_dot``, when given)."""
    report = LoweringReport({}, [])
    func = mod[gv]
    lowerer = _Lowerer(tvm.IRModule(dict(mod.functions), attrs=mod.attrs), QDQGraph(func), report, int8_dot, min_max)
    lowered = lowerer.visit_expr(func)
    lowered = relax.analysis.remove_all_unused(lowered)
    bound = [binding.var for block in lowered.body.blocks for binding in block.bindings]
    for var, kind in lowerer.kinds:
        if any(var.same_as(b) for b in bound):
            report.lowered[kind] = report.lowered.get(kind, 0) + 1
    called = {gvar.name_hint for gvar in called_functions(lowered)}
    original = {g.name_hint for g in mod.functions}
    built = lowerer.builder_.get()
    functions = {g: f for g, f in built.functions.items() if g.name_hint in original or g.name_hint in called}
    new_mod = tvm.IRModule(functions, attrs=built.attrs)
    new_mod[gv] = lowered
    return new_mod, report


def LowerQDQ(
    on_report: Callable[[LoweringReport], None] | None = None, target: tvm.target.Target | None = None
) -> tvm.transform.Pass:
    """Lower the QDQ groups of every Relax function to integer kernels (see the module docstring).
    Where ``target``'s CPU has an int8 dot-product instruction (AVX-512 VNNI, AVX2, Arm's sdot, a
    Cortex-M's SMLAD), regular convolutions are lowered in its operand layout (:func:`.dot_kernels.conv2d_dot`),
    which the schedule tensorizes. On the vector CPUs depthwise ones go to :func:`.dot_kernels.depthwise_conv2d`
    (int32 vectors) and dense ones to :func:`.dot_kernels.dense_dot`; on a Cortex-M the one-row dense takes the
    convolution's layout, depthwise convolutions accumulate in int32, and the clamps use fmaxf/fminf where
    the FPU has them."""
    spec = cpu_spec(target) if target is not None else None
    int8_dot, min_max = (spec.int8_dot, spec.float_min_max) if spec is not None else (None, False)

    @tvm.transform.module_pass(opt_level=0, name="tvm_memplan.LowerQDQ")
    def _pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        functions = [(gv, f) for gv, f in mod.functions.items() if isinstance(f, relax.Function) and has_qdq(f)]
        if not functions:
            return mod
        for gv, _func in functions:
            mod, report = lower_function(mod, gv, int8_dot, min_max)
            if on_report is not None:
                on_report(report)
        return mod

    return _pass
