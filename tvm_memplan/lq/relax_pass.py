"""The ``LQDense`` Relax pass: dense layers with constant weights → LQ pack + popcount kernels.

``find_dense_layers`` lists every ``R.matmul`` of ``main`` (what ONNX Gemm/MatMul and
``nn.Linear`` become after ``FoldConstant``) and every ``R.nn.conv2d`` (NCHW/OIHW, groups=1,
lowered by im2col: the packing kernel gathers the patches, the same LQ dense kernel multiplies),
and says which can be converted: float32, a constant weight, static shapes. A following
``R.add`` of a constant bias is folded into the kernel epilogue. Layers that cannot be converted
are listed with the reason and stay in float.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, PyExprVisitor, mutator, visitor

from ..relax.ir_utils import constant_value, static_shape, top_level_bindings
from . import kernels
from .kernels import ConvGeometry
from .quantizer import LQQuantizer

_MATMUL = tvm.ir.Op.get("relax.matmul")
_CONV2D = tvm.ir.Op.get("relax.nn.conv2d")
_ADD = tvm.ir.Op.get("relax.add")
# relax.FuseOps must leave the kernels alone: fusing a tanh into them would re-lower the
# scheduled loops. kOpaque = 8 in TVM's OpPatternKind.
_OPAQUE = 8


@dataclass
class DenseSite:
    """One matmul or conv2d of ``main`` and what the pass needs to know about it."""

    name: str
    index: int
    var: relax.Var
    data: relax.Expr
    in_shape: tuple[int, ...] | None
    weight: np.ndarray | None
    """(N, O): for a conv, the OIHW kernel as an im2col matrix."""
    conv: ConvGeometry | None = None
    bias: np.ndarray | None = None
    bias_var: relax.Var | None = None
    reason: str | None = None
    """Why it stays in float; None when convertible."""

    @property
    def convertible(self) -> bool:
        return self.reason is None

    @property
    def rows(self) -> int:
        assert self.in_shape is not None
        if self.conv is not None:
            return self.conv.rows
        return int(np.prod(self.in_shape[:-1], dtype=np.int64))

    def columns(self, x: np.ndarray) -> np.ndarray:
        """The (rows, N) matrix this layer multiplies by its weight, for inputs x of any batch."""
        return self.conv.columns(x) if self.conv is not None else x.reshape(-1, x.shape[-1])


def _use_counts(func: relax.Function) -> dict[relax.Var, int]:
    counts: dict[relax.Var, int] = {}
    exprs = [b.value for b in top_level_bindings(func)]
    if isinstance(func.body, relax.SeqExpr):
        exprs.append(func.body.body)
    for expr in exprs:
        for var in relax.analysis.free_vars(expr):
            counts[var] = counts.get(var, 0) + 1
    return counts


def find_dense_layers(mod: tvm.IRModule, func_name: str = "main") -> list[DenseSite]:
    """Every matmul and conv2d of ``func_name`` in binding order, named dense0, conv1, dense2, ..."""
    func = mod[func_name]
    uses = _use_counts(func)
    sites: list[DenseSite] = []
    by_var: dict[relax.Var, DenseSite] = {}
    for binding in top_level_bindings(func):
        value = getattr(binding, "value", None)
        if not isinstance(value, relax.Call):
            continue
        if value.op.same_as(_MATMUL) or value.op.same_as(_CONV2D):
            classify = _classify if value.op.same_as(_MATMUL) else _classify_conv
            site = classify(len(sites), binding.var, value)
            sites.append(site)
            by_var[binding.var] = site
        elif value.op.same_as(_ADD):
            _maybe_fold_bias(binding, value, by_var, uses)
    return sites


def _classify(index: int, var: relax.Var, call: relax.Call) -> DenseSite:
    data, weight_expr = call.args[0], call.args[1]
    in_shape = static_shape(data.ty)
    weight = constant_value(weight_expr)
    site = DenseSite(f"dense{index}", index, var, data, in_shape, weight)
    out_dtype = str(getattr(var.ty, "dtype", ""))
    if weight is None:
        site.reason = "weight is not a constant"
    elif weight.ndim != 2:
        site.reason = f"weight is {weight.ndim}-D (batched matmul)"
    elif weight.dtype != np.float32 or str(data.ty.dtype) != "float32" or out_dtype != "float32":
        site.reason = "not float32"
    elif in_shape is None:
        site.reason = "dynamic input shape"
    elif len(in_shape) < 2 or in_shape[-1] != weight.shape[0]:
        site.reason = f"input shape {in_shape} does not multiply a {weight.shape} weight"
    return site


def _classify_conv(index: int, var: relax.Var, call: relax.Call) -> DenseSite:
    data, kernel = call.args[0], constant_value(call.args[1])
    attrs = call.attrs
    in_shape = static_shape(data.ty)
    site = DenseSite(f"conv{index}", index, var, data, in_shape, None)
    if kernel is None:
        site.reason = "weight is not a constant"
    elif (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)) != ("NCHW", "OIHW", "NCHW"):
        site.reason = f"layout {attrs.data_layout}/{attrs.kernel_layout} (only NCHW/OIHW)"
    elif int(attrs.groups) != 1:
        site.reason = f"grouped convolution (groups={int(attrs.groups)})"
    elif kernel.dtype != np.float32 or str(data.ty.dtype) != "float32" or str(var.ty.dtype) != "float32":
        site.reason = "not float32"
    elif in_shape is None or static_shape(var.ty) is None:
        site.reason = "dynamic input shape"
    else:
        o, c, kh, kw = kernel.shape
        site.weight = np.ascontiguousarray(kernel.reshape(o, c * kh * kw).T)
        site.conv = ConvGeometry(
            in_shape[0],
            in_shape[1],
            in_shape[2],
            in_shape[3],
            (kh, kw),
            tuple(int(v) for v in attrs.strides),
            tuple(int(v) for v in attrs.padding),
            tuple(int(v) for v in attrs.dilation),
        )
    return site


def _maybe_fold_bias(
    binding: relax.Binding, call: relax.Call, by_var: dict[relax.Var, DenseSite], uses: dict[relax.Var, int]
) -> None:
    """Fold ``add(layer, c)`` into the epilogue when the layer has no other use and c is one value per
    output channel: (O,) after a matmul, (1, O, 1, 1) or (O, 1, 1) after an NCHW conv."""
    for mine, other in ((call.args[0], call.args[1]), (call.args[1], call.args[0])):
        site = by_var.get(mine) if isinstance(mine, relax.Var) else None
        bias = constant_value(other)
        if site is None or not site.convertible or site.bias_var is not None or bias is None:
            continue
        o = site.weight.shape[1]
        per_channel = bias.shape in ((1, o, 1, 1), (o, 1, 1)) if site.conv is not None else bias.shape[-1] == o
        if uses.get(mine, 0) == 1 and bias.dtype == np.float32 and bias.size == o and per_channel:
            if static_shape(binding.var.ty) == static_shape(site.var.ty):
                site.bias, site.bias_var = bias.reshape(o).astype(np.float64), binding.var
        return


# ---------------------------------------------------------------------------------------------


@dataclass
class LQLayer:
    """A fitted layer: ±1 weight codes with per-channel scales, an activation quantizer, a bias."""

    name: str
    weight_bits: np.ndarray
    """(Kw, O, N) uint8, 1 = +1."""
    weight_scales: np.ndarray
    """(O, Kw) float64."""
    act: LQQuantizer
    bias: np.ndarray
    """(O,) float64, the model's bias (plus any fine-tuning correction)."""

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.weight_bits.shape[2]), int(self.weight_bits.shape[1])

    def dequantized_weight(self) -> np.ndarray:
        """(N, O) float64 weight the kernel effectively multiplies by."""
        signs = 2.0 * self.weight_bits.astype(np.float64) - 1.0
        return np.einsum("jon,oj->no", signs, self.weight_scales)

    def kernel_arguments(self, lanes: int) -> dict[str, np.ndarray]:
        """The constants of the dense kernel: packed weights, ax, aw, and the effective bias.

        {0,1} activation codes are x̂ = off + Σ ax·s; the off·Σ_n Ŵ[n, o] term is folded into the bias.
        """
        ax, offset = self.act.pm1_form()
        bias = self.bias + offset[0] * self.dequantized_weight().sum(axis=0)
        return {
            "wp": kernels.pack_weight_planes(self.weight_bits, lanes),
            "ax": ax[0].astype(np.float32),
            "aw": np.ascontiguousarray(self.weight_scales.T).astype(np.float32),
            "bias": bias.astype(np.float32),
        }


# Emits the replacement of one site: (builder, its input, site) -> the (rows, O) float result.
Emitter = Callable[[relax.BlockBuilder, relax.Expr, DenseSite], relax.Expr]


@mutator
class _Rewriter(PyExprMutator):
    """Replaces each chosen matmul (or its folded bias add) binding by what its emitter builds."""

    def __init__(self, mod: tvm.IRModule, chosen: dict[relax.Var, tuple[DenseSite, Emitter]]) -> None:
        super().__init__(mod)
        self.chosen = chosen
        self.dropped = {site.var for site, _ in chosen.values() if site.bias_var is not None}

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var in self.dropped:
            return
        entry = self.chosen.get(binding.var)
        if entry is None:
            super().visit_var_binding_(binding)
            return
        site, emit = entry
        n, o = site.weight.shape
        data = self.visit_expr(site.data)
        flatten = site.conv is None and len(site.in_shape) != 2
        if flatten:
            data = self.builder_.emit(relax.op.reshape(data, (site.rows, n)))
        out = emit(self.builder_, data, site)
        if flatten:
            out = relax.op.reshape(self.builder_.emit(out), site.in_shape[:-1] + (o,))
        elif site.conv is not None:
            # (B·OH·OW, O) rows → NCHW
            rows = self.builder_.emit(out)
            oh, ow = site.conv.out_hw
            nhwc = self.builder_.emit(relax.op.reshape(rows, (site.conv.batch, oh, ow, o)))
            out = relax.op.permute_dims(nhwc, [0, 3, 1, 2])
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(out)))


def rewrite_dense(mod: tvm.IRModule, emitters: dict[str, Emitter]) -> tvm.IRModule:
    """A copy of ``mod`` whose named convertible sites are rebuilt by their emitters."""
    mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)  # never mutate the caller's module
    chosen = {}
    for site in find_dense_layers(mod):
        if site.name in emitters and site.convertible:
            chosen[site.bias_var if site.bias_var is not None else site.var] = (site, emitters[site.name])
    rewriter = _Rewriter(mod, chosen)
    func = rewriter.visit_expr(mod["main"])
    rewriter.builder_.update_func(mod.get_global_var("main"), func)
    return relax.transform.DeadCodeElimination()(rewriter.builder_.finalize())


def _kernel(func: tirx.PrimFunc) -> tirx.PrimFunc:
    # te.create_prim_func names every function "main": the module names them instead; and
    # FuseOps must not fuse into scheduled kernels.
    return func.without_attr("global_symbol").with_attr("op_pattern", _OPAQUE)


def _with_bias(site: DenseSite) -> np.ndarray:
    return site.bias if site.bias is not None else np.zeros(site.weight.shape[1])


@tvm.transform.module_pass(opt_level=0, name="tvm_memplan.LQDense")
class LQDense:
    """Module pass: each named dense layer of ``main`` → ``lq_pack`` + ``lq_dense`` PrimFuncs.

    ``layers`` maps site names (from :func:`find_dense_layers`) to fitted :class:`LQLayer` s.
    With ``float_rest`` every other convertible dense layer gets the scheduled fp32 kernel in the
    same rewrite (site names are binding order, so a second pass would see them renumbered).
    Kernels are scheduled for ``target``; a ``schedule_dense(func, target)`` callable can replace
    the hand schedule (MetaSchedule), which stays where it returns None.
    """

    def __init__(
        self,
        layers: dict[str, LQLayer],
        target: tvm.target.Target,
        schedule_dense: Callable[[tirx.PrimFunc, tvm.target.Target], tirx.PrimFunc | None] | None = None,
        float_rest: bool = False,
    ) -> None:
        self.layers = layers
        self.target = target
        self.schedule_dense = schedule_dense
        self.float_rest = float_rest

    def _emit(self, builder: relax.BlockBuilder, data: relax.Expr, site: DenseSite) -> relax.Expr:
        layer = self.layers[site.name]
        flavor = kernels.kernel_flavor(self.target)
        lanes = kernels.LANES[flavor]
        (n, o), m = layer.shape, site.rows
        if site.conv is None:
            unpacked = kernels.lq_pack_func(m, n, layer.act)
        else:
            unpacked = kernels.lq_pack_conv_func(site.conv, layer.act)
        pack = kernels.schedule_lq_pack(unpacked, flavor)
        raw = kernels.lq_dense_func(m, n, o, layer.act.bits, layer.weight_bits.shape[0], lanes)
        dense = self.schedule_dense(raw, self.target) if self.schedule_dense is not None else None
        if dense is None:  # no hook, or every tuning trial failed
            dense = kernels.schedule_lq_dense(raw, flavor)
        pack_gv = builder.add_func(_kernel(pack), f"lq_pack_{site.name}")
        dense_gv = builder.add_func(_kernel(dense), f"lq_dense_{site.name}")
        out_ty = relax.TensorType((layer.act.bits, m, kernels.words(n)), "uint32")
        packed = builder.emit(relax.call_tir(pack_gv, [data], out_ty), name_hint=f"{site.name}_xp")
        consts = layer.kernel_arguments(lanes)
        args = [packed] + [relax.const(consts[key]) for key in ("wp", "ax", "aw", "bias")]
        return relax.call_tir(dense_gv, args, relax.TensorType((m, o), "float32"))

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        emitters: dict[str, Emitter] = {}
        if self.float_rest:
            # Convolutions not quantized stay TVM's own conv2d; matmuls get the scheduled fp32 kernel.
            sites = find_dense_layers(mod)
            rest = [s.name for s in sites if s.convertible and s.conv is None and s.name not in self.layers]
            emitters.update({name: FloatDense(rest).emit for name in rest})
        emitters.update({name: self._emit for name in self.layers})
        return rewrite_dense(mod, emitters)


@tvm.transform.module_pass(opt_level=0, name="tvm_memplan.FloatDense")
class FloatDense:
    """Module pass: named float dense layers → the hand-scheduled fp32 kernel (pre-packed weights).

    The baseline the LQ kernels are compared against, and what layers kept in float run on:
    LegalizeOps' unscheduled matmul is ~100x slower.
    """

    def __init__(self, names: Sequence[str], block: int = 32) -> None:
        self.names = list(names)
        self.block = block

    def emit(self, builder: relax.BlockBuilder, data: relax.Expr, site: DenseSite) -> relax.Expr:
        (n, o), m = site.weight.shape, site.rows
        func = kernels.schedule_fp32_dense(kernels.fp32_dense_func(m, n, o, self.block))
        gv = builder.add_func(_kernel(func), f"fp32_dense_{site.name}")
        args = [
            data,
            relax.const(kernels.pack_fp32_weight(site.weight, self.block)),
            relax.const(_with_bias(site).astype(np.float32)),
        ]
        return relax.call_tir(gv, args, relax.TensorType((m, o), "float32"))

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite_dense(mod, {name: self.emit for name in self.names})


# ---------------------------------------------------------------------------------------------


@visitor
class _ConstantBytes(PyExprVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.seen: list[tvm.ir.GenericConst] = []

    def visit_generic_const_(self, const: tvm.ir.GenericConst) -> None:
        if not hasattr(const.value, "numpy") or any(const.same_as(other) for other in self.seen):
            return
        self.seen.append(const)
        self.total += const.value.numpy().nbytes


def parameter_bytes(mod: tvm.IRModule) -> int:
    """Bytes of every constant the Relax functions of ``mod`` carry: the model size a user ships."""
    counter = _ConstantBytes()
    for _, func in mod.functions.items():
        if isinstance(func, relax.Function):
            counter.visit_expr(func)
    return counter.total
