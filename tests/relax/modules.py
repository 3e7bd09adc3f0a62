"""Small Relax modules with known structure, built with BlockBuilder."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax

from tvm_memplan.relax import stage_passes


def save_graph(path, name: str, nodes: list, shapes: tuple[list[int], list[int]], initializers: list) -> str:
    """An opset-17 ONNX file of ``nodes`` from float32 ``x`` to ``y`` (``shapes``: theirs), at ``path``."""
    import onnx
    from onnx import TensorProto, helper

    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in zip("xy", shapes, strict=True))
    graph = helper.make_graph(nodes, name, [x], [y], initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return str(path)


def op_calls(mod: tvm.IRModule, op: str) -> list[relax.Call]:
    """The calls of Relax operator ``op`` bound in ``main``'s blocks."""
    return [
        b.value
        for block in mod["main"].body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op) and b.value.op.name == op
    ]


def random_weights(seed: int = 0) -> Callable[..., relax.Constant]:
    """``const(*shape)``: float32 constants drawn one after another from one generator (standard normal
    x 0.3, small enough that a few layers stay finite), so a test net's weights depend only on ``seed``."""
    rng = np.random.default_rng(seed)

    def const(*shape: int) -> relax.Constant:
        return relax.const(rng.standard_normal(shape).astype("float32") * 0.3)

    return const


def compile_and_run(mod: tvm.IRModule, target: tvm.target.Target, x: np.ndarray, **options):
    """``mod`` compiled with ``tvm_memplan.pipeline(target, order="program", **options)`` and run on ``x``
    (:func:`~tvm_memplan.verify.run.run_vm`'s outputs and VM requests)."""
    from tvm_memplan.relax.pipeline import pipeline
    from tvm_memplan.verify.run import run_vm

    with target:
        executable = tvm.compile(mod, target, relax_pipeline=pipeline(target, order="program", **options))
    return run_vm(executable, [x])


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


def concat_cases() -> tvm.IRModule:
    """Concats the planner must handle: one of each kind the elimination has to get right.

    - ``cat_ab``: inputs are kernel outputs, ``a`` is also read after the concat → removed;
    - ``cat_ac``: ``a`` already lives inside ``cat_ab`` (feeds two concats) → kept as a copy;
    - ``cat_nested``: a concat of a concat output and a kernel output → removed (nested);
    - ``cat_x``: one input is the function parameter → kept;
    - ``cat_inner``: concat on an inner axis, slices interleave → kept.
    """
    bb = relax.BlockBuilder()
    x = relax.Var("x", tensor((1, 32)))
    m = relax.Var("m", tensor((2, 32)))
    w = relax.const(np.linspace(-1, 1, 32 * 32, dtype="float32").reshape(32, 32))
    with bb.function("main", [x, m]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, w))
            b = bb.emit(relax.op.matmul(a, w))
            c = bb.emit(relax.op.matmul(b, w))
            cat_ab = bb.emit(relax.op.concat([a, b], axis=1))  # (1, 64)
            cat_ac = bb.emit(relax.op.concat([a, c], axis=1))  # (1, 64)
            d = bb.emit(relax.op.matmul(c, w))
            cat_nested = bb.emit(relax.op.concat([cat_ab, d], axis=1))  # (1, 96)
            cat_x = bb.emit(relax.op.concat([x, d], axis=1))  # (1, 64)
            e = bb.emit(relax.op.matmul(m, w))  # (2, 32)
            f = bb.emit(relax.op.matmul(e, w))
            cat_inner = bb.emit(relax.op.concat([e, f], axis=1))  # (2, 64): rows interleave
            late = bb.emit(relax.op.matmul(a, w))  # ``a`` is read again after its concat
            s0 = bb.emit(relax.op.sum(cat_ab))  # a second reader keeps ``cat_ab`` from fusing into ``cat_nested``
            s1 = bb.emit(relax.op.add(relax.op.sum(cat_nested), s0))
            s2 = bb.emit(relax.op.sum(cat_ac))
            s3 = bb.emit(relax.op.sum(cat_x))
            s4 = bb.emit(relax.op.sum(cat_inner))
            s5 = bb.emit(relax.op.sum(late))
            out = bb.emit_output(relax.op.add(relax.op.add(relax.op.add(s1, s2), relax.op.add(s3, s4)), s5))
        bb.emit_func_output(out)
    return bb.get()


def residual_block(n: int = 64) -> tvm.IRModule:
    """A bottleneck ``relu(matmul(matmul(s, down), up) + s)``: the fused tail may write over ``s``.

    The peak is that kernel (bottleneck input, shortcut and output alive), so writing the output
    over the dying shortcut lowers it.
    """
    bb = relax.BlockBuilder()
    x = relax.Var("x", tensor((n, n)))
    w = relax.const(np.linspace(-0.05, 0.05, n * n, dtype="float32").reshape(n, n))
    down = relax.const(np.linspace(-0.1, 0.1, n * n // 4, dtype="float32").reshape(n, n // 4))
    up = relax.const(np.linspace(-0.1, 0.1, n * n // 4, dtype="float32").reshape(n // 4, n))
    with bb.function("main", [x]):
        with bb.dataflow():
            shortcut = bb.emit(relax.op.matmul(x, w))
            h = bb.emit(relax.op.matmul(shortcut, down))
            y = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.matmul(h, up), shortcut)))
            out = bb.emit_output(relax.op.sum(relax.op.matmul(y, w), axis=[0]))
        bb.emit_func_output(out)
    return bb.get()
