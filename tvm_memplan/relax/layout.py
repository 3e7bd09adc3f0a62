"""Blocked channel layouts on CPUs: convolutions in NCHW[x]c with weights packed at compile time.

The layout of NeoCPU (Liu et al., USENIX ATC 2019) and onnxruntime's MLAS: channels are split into
blocks of one vector register's lanes (16 float32 lanes for AVX-512, 8 for AVX2, 4 for NEON), so a
convolution's inner loop multiplies one broadcast input value by a contiguous vector of output
channels, and every tensor between two blocked layers stays blocked.

:func:`BlockedLayout` runs Relax's ``ConvertLayout`` with ``NCHW{x}c`` as the convolutions' desired
layout: it converts the regular (``groups=1``) convolutions whose channels divide into blocks, carries
the layout through the ops that follow it (bias adds, activations, residual adds, pools, concats)
and inserts ``layout_transform`` only where the layout changes. The weights' and biases' transforms
are constants, folded in numpy (:mod:`.fold`); the blocked convolutions become the TE compute
:func:`conv2d_nchwc`, which TVM 0.27's ``LegalizeOps`` has no lowering for.
"""

from __future__ import annotations

import re

import tvm
from tvm import relax, te, topi

from ..schedule.cpu import cpu_spec
from ..schedule.cpu.blocked_conv import BLOCKED_CONV
from .fold import FoldDataMovementConstants

_BLOCKED_DATA = re.compile(r"NCHW(\d+)c")


MIN_BLOCK = 8
"""The narrowest block converted: AVX2's 8 lanes. 4-lane targets (NEON, SSE) keep NCHW until a
blocked kernel has been measured on one."""


def channel_block(target: tvm.target.Target) -> int | None:
    """Channels per block for ``target``: the float32 lanes of its vector registers, from its ``-mcpu``
    and ``-mattr`` features (:func:`~tvm_memplan.schedule.cpu.cpu_spec`: 16 with AVX-512, 8 with
    AVX2); None for targets with narrower vectors or no vector code generator (the ``c`` target)."""
    spec = cpu_spec(target)
    if not spec.vector_codegen or spec.lanes < MIN_BLOCK:
        return None
    return spec.lanes


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
    stride_h, stride_w = (int(s) for s in strides)
    dilation_h, dilation_w = (int(d) for d in dilation)
    top, left, bottom, right = (int(p) for p in padding)
    if top or left or bottom or right:
        data = topi.nn.pad(data, (0, 0, top, left, 0), (0, 0, bottom, right, 0), name="data_pad")
    n, _, height, width, _ = (int(d) for d in data.shape)
    out_h = (height - (kernel_h - 1) * dilation_h - 1) // stride_h + 1
    out_w = (width - (kernel_w - 1) * dilation_w - 1) // stride_w + 1
    ic = te.reduce_axis((0, group_chunks), name="ic")
    kh = te.reduce_axis((0, kernel_h), name="kh")
    kw = te.reduce_axis((0, kernel_w), name="kw")
    ii = te.reduce_axis((0, in_block), name="ii")
    return te.compute(
        (n, out_chunks, out_h, out_w, out_block),
        lambda b, oc, oh, ow, o: te.sum(
            data[b, ic if groups == 1 else oc // group_outputs * group_chunks + ic, oh * stride_h + kh * dilation_h, ow * stride_w + kw * dilation_w, ii].astype(out_dtype)
            * kernel[oc, ic, kh, kw, ii, o].astype(out_dtype),
            axis=[ic, kh, kw, ii],
        ),
        name=BLOCKED_CONV,
    )


@relax.expr_functor.mutator
class _LowerBlockedConv(relax.PyExprMutator):
    """Blocked ``relax.nn.conv2d`` calls become calls of :func:`conv2d_nchwc`."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d"):
            return call
        attrs = call.attrs
        if not _BLOCKED_DATA.fullmatch(str(attrs.data_layout)) or attrs.out_layout != attrs.data_layout:
            return call
        return self.builder_.call_te(
            conv2d_nchwc, call.args[0], call.args[1], attrs.strides, attrs.padding, attrs.dilation,
            str(call.ty.dtype), primfunc_name_hint="conv2d_nchwc",
        )


def LowerBlockedConv() -> tvm.transform.Pass:  # noqa: N802 - named like TVM's passes
    """Replace every NCHW[x]c ``relax.nn.conv2d`` by a call of :func:`conv2d_nchwc`."""

    @tvm.transform.module_pass(opt_level=0, name="tvm_memplan.LowerBlockedConv")
    def _pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        lowering = _LowerBlockedConv(mod)
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                lowering.builder_.update_func(gv, lowering.visit_expr(func))
        return lowering.builder_.get()

    return _pass


def BlockedLayout(block: int) -> tvm.transform.Pass:  # noqa: N802 - named like TVM's passes
    """Regular convolutions and what follows them in NCHW[block]c (see the module docstring)."""
    desired = {"relax.nn.conv2d": [f"NCHW{block}c", f"OIHW{block}i{block}o"]}
    return tvm.transform.Sequential(
        [relax.transform.ConvertLayout(desired), FoldDataMovementConstants(), LowerBlockedConv()],
        name="tvm_memplan.BlockedLayout",
    )
