"""Blocked channel layouts on CPUs: convolutions in NCHW[x]c with weights packed at compile time.

The layout of NeoCPU (Liu et al., USENIX ATC 2019) and onnxruntime's MLAS: channels are split into
blocks of one vector register's lanes (16 float32 lanes for AVX-512, 8 for AVX2), so a
convolution's inner loop multiplies one broadcast input value by a contiguous vector of output
channels, and every tensor between two blocked layers stays blocked.

:func:`BlockedLayout` runs Relax's ``ConvertLayout`` with ``NCHW{x}c`` as the convolutions' desired
layout: it converts the convolutions whose channels divide into blocks (regular, grouped and
depthwise; other channel counts are padded to whole blocks first, :mod:`.channel_pad`, and a stem's
3 input channels are read as ``NCHW1c``), carries the layout through the ops that follow it (bias
adds, activations, residual adds, pools, concats) and inserts ``layout_transform`` only where the
layout changes. The ONNX frontend's Clip bounds (``call_tir`` of ``topi.maximum``/``minimum`` with
a scalar, or ``relax.clip``) become Relax maximum and minimum ops first, so that ReLU6 and HardSwish
do not end a blocked region, and inference batch norms a multiply and an add, so that unfolded ones
(DenseNet's pre-activations) do not either.
The weights' and biases' transforms are constants, folded in numpy (:mod:`.fold`); the blocked
convolutions become the TE computes :func:`conv2d_nchwc` and :func:`depthwise_conv2d_nchwc`, which
TVM 0.27's ``LegalizeOps`` has no lowering for.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial

import tvm
from tvm import relax, s_tir, te, tirx, topi

from ..schedule.blocks import NotApplicable, top_level_blocks
from ..schedule.cpu import CpuSpec, cpu_spec
from ..schedule.cpu.blocked_conv import BLOCKED_CONV
from .channel_pad import PadChannels
from .conv_layouts import CONV2D, conv2d_layouts, is_conv2d
from .fold import FoldDataMovementConstants
from .ir_utils import fold_inference_batch_norms, static_shape
from .matmul_layout import PackMatmulWeights
from .tile_layout import BlockedTiles

_BLOCKED_DATA = re.compile(r"NCHW(\d+)c")
_DEPTHWISE_KERNEL = re.compile(r"OIHW(\d+)o")
_BOUND_OPS = {tirx.Max: relax.op.maximum, tirx.Min: relax.op.minimum}
_IMMEDIATES = (tirx.IntImm, tirx.FloatImm)


MIN_BLOCK = 8
"""The narrowest block ``layout="auto"`` converts: AVX2's 8 lanes. On 4-lane targets (arm64 NEON, SSE)
NCHW4c is correct (checked on the emulated arm64 device) but has not been timed on hardware, so
``auto`` keeps NCHW there and ``layout="blocked"`` asks for NCHW4c."""

MIN_BLOCK_BLOCKED = 4
"""The narrowest block ``layout="blocked"`` converts: NEON's and SSE's 4 lanes."""


def channel_block(target: tvm.target.Target, minimum: int = MIN_BLOCK) -> int | None:
    """Channels per block for ``target``: the float32 lanes of its vector registers, from its ``-mcpu``
    and ``-mattr`` features (:func:`~tvm_memplan.schedule.cpu.cpu_spec`: 16 with AVX-512, 8 with
    AVX2, 4 with NEON); None for targets with fewer than ``minimum`` lanes or no vector code generator
    (the ``c`` target)."""
    spec = cpu_spec(target)
    if not spec.vector_codegen or spec.lanes < minimum:
        return None
    return spec.lanes


def layout_block(target: tvm.target.Target, layout: str) -> int | None:
    """The channel block the ``layout`` option (``auto``, ``blocked``, ``nchw``) gives on ``target``: its
    :func:`channel_block` on ``llvm`` targets unless ``nchw`` (``auto`` from :data:`MIN_BLOCK` lanes,
    ``blocked`` from :data:`MIN_BLOCK_BLOCKED`); None (NCHW) elsewhere."""
    if layout == "nchw" or target.kind.name != "llvm":
        return None
    return channel_block(target, MIN_BLOCK_BLOCKED if layout == "blocked" else MIN_BLOCK)


def _padded_window(data: te.Tensor, kernel_hw: tuple[int, int], strides, padding, dilation):
    """``data`` zero-padded in H and W, and a function of (output row, column, kernel row, column)
    to the input row and column they read; plus the output height and width."""
    (kernel_h, kernel_w), (stride_h, stride_w) = kernel_hw, (int(s) for s in strides)
    dilation_h, dilation_w = (int(d) for d in dilation)
    top, left, bottom, right = (int(p) for p in padding)
    if top or left or bottom or right:
        data = topi.nn.pad(data, (0, 0, top, left, 0), (0, 0, bottom, right, 0), name="data_pad")
    height, width = (int(d) for d in data.shape[2:4])
    out_hw = (
        (height - (kernel_h - 1) * dilation_h - 1) // stride_h + 1,
        (width - (kernel_w - 1) * dilation_w - 1) // stride_w + 1,
    )

    def window(oh, ow, kh, kw):
        return oh * stride_h + kh * dilation_h, ow * stride_w + kw * dilation_w

    return data, window, out_hw


def conv2d_nchwc(data: te.Tensor, kernel: te.Tensor, strides, padding, dilation, out_dtype: str) -> te.Tensor:
    """A convolution in NCHW[x]c with weights in OIHW[x]i[y]o: ``out[n, oc, oh, ow, o] = sum over
    (ic, kh, kw, i) of data[n, ic, oh*s + kh*d, ow*s + kw*d, i] * kernel[oc, ic, kh, kw, i, o]`` (with
    groups, ``ic`` counts from the first block of ``oc``'s group).
    topi's ``conv2d_NCHWc`` sums over one fused input-channel axis split by division; separate axes
    leave the schedule a plain loop nest to tile."""
    _, in_chunks, _, _, in_block = (int(d) for d in data.shape)
    out_chunks, group_chunks, kernel_h, kernel_w, _, out_block = (int(d) for d in kernel.shape)
    groups = in_chunks // group_chunks
    if groups * group_chunks != in_chunks or out_chunks % groups:
        raise ValueError(f"{in_chunks} input and {out_chunks} output channel blocks do not split into groups")
    group_outputs = out_chunks // groups
    data, window, (out_h, out_w) = _padded_window(data, (kernel_h, kernel_w), strides, padding, dilation)
    ic = te.reduce_axis((0, group_chunks), name="ic")
    kh = te.reduce_axis((0, kernel_h), name="kh")
    kw = te.reduce_axis((0, kernel_w), name="kw")
    ii = te.reduce_axis((0, in_block), name="ii")

    def in_chunk(oc):
        return ic if groups == 1 else oc // group_outputs * group_chunks + ic

    return te.compute(
        (int(data.shape[0]), out_chunks, out_h, out_w, out_block),
        lambda b, oc, oh, ow, o: te.sum(
            data[(b, in_chunk(oc), *window(oh, ow, kh, kw), ii)].astype(out_dtype)
            * kernel[oc, ic, kh, kw, ii, o].astype(out_dtype),
            axis=[ic, kh, kw, ii],
        ),
        name=BLOCKED_CONV,
    )


def depthwise_conv2d_nchwc(data: te.Tensor, kernel: te.Tensor, strides, padding, dilation, out_dtype: str) -> te.Tensor:
    """A depthwise convolution in NCHW[x]c with weights in OIHW[x]o: ``out[n, c, oh, ow, i] = sum over
    (kh, kw) of data[n, c, oh*s + kh*d, ow*s + kw*d, i] * kernel[c, 0, kh, kw, i]``."""
    _, _, kernel_h, kernel_w, _ = (int(d) for d in kernel.shape)
    data, window, (out_h, out_w) = _padded_window(data, (kernel_h, kernel_w), strides, padding, dilation)
    n, chunks, _, _, block = (int(d) for d in data.shape)
    kh = te.reduce_axis((0, kernel_h), name="kh")
    kw = te.reduce_axis((0, kernel_w), name="kw")
    return te.compute(
        (n, chunks, out_h, out_w, block),
        lambda b, c, oh, ow, i: te.sum(
            data[(b, c, *window(oh, ow, kh, kw), i)].astype(out_dtype) * kernel[c, 0, kh, kw, i].astype(out_dtype),
            axis=[kh, kw],
        ),
        name="depthwise_conv2d_NCHWc",
    )


def _desired_layouts(block: int):
    """``ConvertLayout``'s per-call callback: each convolution's :func:`~.conv_layouts.conv2d_layouts`."""

    def layouts(call: relax.Call) -> dict[str, list[str]]:
        chosen = conv2d_layouts(call, block)
        return {CONV2D: chosen} if chosen else {}

    return layouts


def clip_bound_op(func: tirx.PrimFunc):
    """``relax.op.maximum`` (``minimum``) where ``func`` is ``topi.maximum`` (``minimum``) of a tensor
    and a 0-d tensor, as the ONNX frontend emits a Clip's bounds; else None."""
    if len(func.params) != 3:
        return None
    sch = s_tir.Schedule(func)
    try:
        blocks = top_level_blocks(sch)
    except NotApplicable:
        return None
    if len(blocks) != 1:
        return None
    store = sch.get(blocks[0]).body
    value = getattr(store, "value", None)
    op = _BOUND_OPS.get(type(value))
    if op is None:
        return None
    data, bound = value.a, value.b
    elementwise = (
        isinstance(data, tvm.ir.expr.TensorLoad)
        and len(data.indices) == len(store.indices)
        and all(x.same_as(y) for x, y in zip(data.indices, store.indices, strict=True))
    )
    scalar = isinstance(bound, tvm.ir.expr.TensorLoad) and not bound.source.shape
    return op if elementwise and scalar and not data.source.same_as(store.buffer) else None


def clip_as_bounds(call: relax.Call) -> relax.Expr:
    """``relax.clip(x, lo, hi)`` of constant bounds as ``minimum(maximum(x, lo), hi)`` (``ConvertLayout``
    carries no layout through ``relax.clip``: a HardSwish in a blocked region left it and came back); the
    call itself where a bound is not a constant."""
    data, *bounds = call.args
    bounds = [bound if isinstance(bound, _IMMEDIATES) else getattr(bound, "value", None) for bound in bounds]
    if not all(isinstance(bound, _IMMEDIATES) for bound in bounds):
        return call
    dtype = str(call.ty.dtype)
    low, high = (relax.const(bound.value, dtype) for bound in bounds)
    return relax.op.minimum(relax.op.maximum(data, low), high)


@relax.expr_functor.mutator
class _ClipBoundsAsOps(relax.PyExprMutator):
    """``call_tir`` of a Clip bound (:func:`clip_bound_op`) becomes ``relax.op.maximum``/``minimum``, and
    so does ``relax.clip`` (:func:`clip_as_bounds`)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.clip":
            return clip_as_bounds(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.call_tir"):
            return call
        callee = self.builder_.get()[call.args[0]]
        op = clip_bound_op(callee) if isinstance(callee, tirx.PrimFunc) else None
        return call if op is None else op(*call.args[1].fields)


@relax.expr_functor.mutator
class _LowerBlockedConv(relax.PyExprMutator):
    """Blocked ``relax.nn.conv2d`` calls become calls of :func:`conv2d_nchwc` (depthwise ones, of
    :func:`depthwise_conv2d_nchwc`)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not is_conv2d(call):
            return call
        attrs = call.attrs
        if not all(_BLOCKED_DATA.fullmatch(str(layout)) for layout in (attrs.data_layout, attrs.out_layout)):
            return call
        depthwise = _DEPTHWISE_KERNEL.fullmatch(str(attrs.kernel_layout))
        compute = depthwise_conv2d_nchwc if depthwise else conv2d_nchwc
        return self.builder_.call_te(
            compute,
            call.args[0],
            call.args[1],
            attrs.strides,
            attrs.padding,
            attrs.dilation,
            str(call.ty.dtype),
            primfunc_name_hint=compute.__name__,
        )


def unit_axes_dropped(index_map: tirx.IndexMap) -> bool:
    """Whether ``index_map`` only inserts constant-0 axes (NCHW to NCHW1c): its row-major order is its
    input's, so the transform is a reshape."""
    kept = [index for index in index_map.final_indices if not (isinstance(index, tirx.IntImm) and int(index) == 0)]
    initial = list(index_map.initial_indices)
    return len(kept) == len(initial) and all(a.same_as(b) for a, b in zip(kept, initial, strict=True))


@relax.expr_functor.mutator
class _UnitBlocksAsReshape(relax.PyExprMutator):
    """A ``layout_transform`` that only adds unit axes (NCHW to NCHW1c) becomes a ``reshape``, a view."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.layout_transform"):
            return call
        if call.attrs.pad_value is not None or not unit_axes_dropped(call.attrs.index_map):
            return call
        shape = static_shape(call.ty)
        return call if shape is None else relax.op.reshape(call.args[0], shape)


@relax.expr_functor.mutator
class _ParameterTransformOnce(relax.PyExprMutator):
    """A parameter that several consumers read blocked is transformed once, not once per consumer
    (``ConvertLayout`` inserts a ``layout_transform`` before each): a split chain measured alone
    (:func:`~tvm_memplan.relax.split.chain_module`) read its NCHW input through one transform per
    tile's head convolution, which the chain in its model, whose input is already blocked, never runs."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.params: set[relax.Var] = set()
        self.done: dict[tuple[relax.Var, str], relax.Var] = {}

    def visit_function_(self, func: relax.Function) -> relax.Expr:
        self.params, self.done = set(func.params), {}
        return super().visit_function_(func)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = binding.value
        is_transform = isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
        if not (is_transform and value.op.name == "relax.layout_transform" and value.args[0] in self.params):
            super().visit_var_binding_(binding)
            return
        key = (value.args[0], str(value.attrs.index_map) + str(value.attrs.pad_value))
        if key in self.done:
            self.set_var_remap(binding.var, self.done[key])
            return
        super().visit_var_binding_(binding)
        self.done[key] = self.visit_expr(binding.var)


def _rewrite(mutator: Callable[[tvm.IRModule], relax.PyExprMutator], name: str) -> tvm.transform.Pass:
    """A module pass that runs ``mutator`` over every Relax function."""

    @tvm.transform.module_pass(opt_level=0, name=name)
    def _pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        rewriter = mutator(mod)
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
        return rewriter.builder_.get()

    return _pass


def BlockedLayout(block: int, spec: CpuSpec | None = None) -> tvm.transform.Pass:  # noqa: N802 - named like TVM's passes
    """Convolutions and what follows them in NCHW[block]c (see the module docstring); with the target's ``spec``,
    output channel blocks that no register tile divides get one block more where that pays
    (:func:`~.channel_pad.PadChannels`). Matmuls with constant weights read them packed in panels
    (:class:`~.matmul_layout.PackMatmulWeights`)."""
    return tvm.transform.Sequential(
        [
            _rewrite(_ClipBoundsAsOps, "tvm_memplan.ClipBoundsAsOps"),
            fold_inference_batch_norms,  # Relax's batch_norm keeps NCHW: DenseNet's pre-activations
            relax.transform.DeadCodeElimination(),  # the Clip bounds' PrimFuncs, the batch norms' tuples
            PadChannels(block, spec),
            relax.transform.ConvertLayout({}, _desired_layouts(block)),
            _rewrite(_ParameterTransformOnce, "tvm_memplan.ParameterTransformOnce"),
            FoldDataMovementConstants(),
            BlockedTiles(conv2d_nchwc),
            _rewrite(_UnitBlocksAsReshape, "tvm_memplan.UnitBlocksAsReshape"),
            _rewrite(_LowerBlockedConv, "tvm_memplan.LowerBlockedConv"),
            _rewrite(partial(PackMatmulWeights, lanes=block), "tvm_memplan.PackMatmulWeights"),
        ],
        name="tvm_memplan.BlockedLayout",
    )
