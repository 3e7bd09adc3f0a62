"""Unscheduled kernels for the schedule tests (CPU rules and the GPU rule): the fused PrimFuncs
TVM's pipeline makes of a one-input Relax function, and convolution bodies to build them from."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx

from tvm_memplan.relax import stage_passes


def kernels_of(build_body, input_shape, target=None, layout="nchw") -> dict[str, tirx.PrimFunc]:
    """The fused PrimFuncs of ``build_body(bb, x)`` for ``target`` (this CPU by default), unscheduled
    (the pipeline schedules after planning, so its dataflow stage leaves kernels as emitted)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(input_shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(build_body(bb, x))
        bb.emit_func_output(out)
    target = target or tvm.target.Target.from_device("cpu")
    with target:
        mod = tvm.transform.Sequential(stage_passes(target, layout=layout).dataflow)(bb.get())
    return {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}


def conv_body(channels_out, kernel, stride=1, padding=0, groups=1, activation="relu"):
    """conv2d + bias, then ``relu``, ``relu6`` (a clip) or nothing (``None``)."""

    def body(bb, x):
        channels_in = int(x.ty.shape.values[1])
        rng = np.random.default_rng(1)
        w = relax.const(rng.standard_normal((channels_out, channels_in // groups, kernel, kernel)).astype("float32"))
        b = relax.const(rng.standard_normal((1, channels_out, 1, 1)).astype("float32"))
        y = bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=padding, groups=groups))
        y = bb.emit(relax.op.add(y, b))
        if activation == "relu6":
            return relax.op.clip(y, 0, 6)
        return relax.op.nn.relu(y) if activation == "relu" else y

    return body
