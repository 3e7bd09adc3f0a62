"""Small Relax modules with known structure, built with BlockBuilder."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvm_memplan.relax import stage_passes


def tensor(shape, dtype="float32") -> relax.TensorType:
    return relax.TensorType(shape, dtype)


def chain_with_view(n: int = 64) -> tvm.IRModule:
    """A reduction's output read through a reshape view after a large tensor is allocated.

    The planner must keep the viewed storage alive through the view's last use (the TVM bug
    class "view alive while its storage is reused").
    """
    bb = relax.BlockBuilder()
    x = relax.Var("x", tensor((n, n)))
    with bb.function("main", [x]):
        with bb.dataflow():
            column = bb.emit(relax.op.sum(x, axis=[1], keepdims=True))  # (n, 1)
            view = bb.emit(relax.op.reshape(column, (1, n)))  # a view after RewriteDataflowReshape
            big = bb.emit(relax.op.matmul(x, x))  # (n, n), allocated while ``view`` is alive
            out = bb.emit_output(relax.op.matmul(view, big))
        bb.emit_func_output(out)
    return bb.get()


def two_functions() -> tvm.IRModule:
    """``main`` and ``second`` each with a chain of unfusable matmuls (intermediates of their own)."""
    bb = relax.BlockBuilder()
    for name, width in (("main", 32), ("second", 48)):
        x = relax.Var("x", tensor((4, 32)))
        with bb.function(name, [x]):
            with bb.dataflow():
                w = relax.const(np.full((32, width), 0.01, "float32"))
                v = relax.const(np.full((width, width), 0.02, "float32"))
                a = bb.emit(relax.op.matmul(x, w))
                b = bb.emit(relax.op.matmul(a, v))
                c = bb.emit(relax.op.matmul(b, v))
                out = bb.emit_output(relax.op.sum(relax.op.add(c, a), axis=[1]))
            bb.emit_func_output(out)
    return bb.get()


def dynamic_batch() -> tvm.IRModule:
    """A symbolic batch next to statically shaped work: the static part must still be planned."""
    bb = relax.BlockBuilder()
    batch = tvm.tirx.Var("batch", "int64")
    x = relax.Var("x", tensor((batch, 16)))
    w = relax.Var("w", tensor((16, 16)))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            w1 = bb.emit(relax.op.matmul(w, w))
            w2 = bb.emit(relax.op.matmul(w1, w))
            h = bb.emit(relax.op.matmul(x, w2))
            out = bb.emit_output(relax.op.nn.relu(h))
        bb.emit_func_output(out)
    return bb.get()


def staged(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    stages = stage_passes(target)
    with target:
        return tvm.transform.Sequential(stages.dataflow + stages.lowering)(mod)


def random_input(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")
