"""Concat elimination and in-place kernels: decided right, and the programs still compute the same."""

import numpy as np
import tvm
from tvm import relax

import tvm_memplan
from tvm_memplan.relax.inplace import inplace_safe
from tvm_memplan.verify import run_vm

from .modules import concat_cases, random_input, residual_block, staged


def build_both(mod, target, **options):
    reports = []
    planned = tvm.compile(mod, target, relax_pipeline=tvm_memplan.pipeline(target, on_report=reports.append, **options))
    stock = tvm.compile(mod, target, relax_pipeline=relax.get_default_pipeline(target))
    return planned, stock, reports[0]


def test_concat_cases_removed_where_safe_and_kept_where_not(target):
    planned, stock, report = build_both(concat_cases(), target, order="program")
    assert report.concats_removed == 2, report.concats_kept  # cat_ab and the nested one
    reasons = " | ".join(report.concats_kept.values())
    assert "already lives inside another tensor" in reasons  # ``a`` feeds a second concat
    assert "not an intermediate" in reasons  # the function parameter
    assert "inner axis" in reasons
    inputs = [random_input((1, 32)), random_input((2, 32), seed=1)]
    out, trace = run_vm(planned, inputs)
    ref, _ = run_vm(stock, inputs)
    np.testing.assert_array_equal(out[0], ref[0])
    assert sorted(trace.storage_bytes) == sorted([report.arena_bytes, out[0].nbytes])


def test_without_inplace_nothing_is_aliased(target):
    _, _, report = build_both(concat_cases(), target, inplace=False)
    assert report.concats_removed == 0 and report.inplace_ops == 0


def test_residual_kernel_writes_over_its_dying_shortcut(target):
    planned, stock, report = build_both(residual_block(), target, order="program")
    assert report.inplace_ops >= 1
    _, _, plain = build_both(residual_block(), target, order="program", inplace=False)
    assert report.arena_bytes < plain.arena_bytes
    x = random_input((64, 64))
    out, _ = run_vm(planned, [x])
    ref, _ = run_vm(stock, [x])
    np.testing.assert_array_equal(out[0], ref[0])


def test_inplace_safety_is_proven_from_the_primfunc(target):
    mod = staged(residual_block(), target)
    fused = [gv for gv in mod.functions if "add" in gv.name_hint and "relu" in gv.name_hint]
    assert fused, [gv.name_hint for gv in mod.functions]
    func = mod[fused[0]]
    names = [p.name for p in func.params]
    # params: (h2, w, shortcut, out): the shortcut is read elementwise at the output index;
    # the matmul's data input is read by a reduction and can never be overwritten.
    assert inplace_safe(func, len(names) - 2, len(names) - 1)
    assert not inplace_safe(func, 0, len(names) - 1)


def test_an_input_copied_into_a_reduction_is_never_overwritten(target):
    """A 1x1 conv reads its input through an identity copy (``pad_temp``) of the output's shape.
    Read elementwise before any output write in program order, but a schedule interleaves conv
    tiles with output writes: writing in place would clobber input later tiles still read."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 6, 6), "float32"))
    w = relax.const(np.full((8, 8, 1, 1), 0.1, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.nn.conv2d(x, w)))
        bb.emit_func_output(out)
    mod = staged(bb.get(), target)
    (gvar,) = [gv for gv in mod.functions if "conv2d" in gv.name_hint]
    func = mod[gvar]
    assert not inplace_safe(func, 0, len(func.params) - 1)


def test_kernels_called_in_place_keep_noalias_and_compute_the_same(target):
    planned, stock, report = build_both(residual_block(), target, order="program")
    assert report.inplace_ops >= 1
    with target:
        mod = tvm.transform.Sequential([tvm_memplan.relax.ArenaPlanBlockMemory()])(staged(residual_block(), target))
    noalias = {
        gv.name_hint: bool(f.attrs["tirx.noalias"])
        for gv, f in mod.functions.items()
        if isinstance(f, tvm.tirx.PrimFunc)
    }
    assert all(noalias.values()), noalias
    inputs = [random_input((64, 64))]
    np.testing.assert_allclose(run_vm(planned, inputs)[0][0], run_vm(stock, inputs)[0][0], rtol=1e-5, atol=1e-6)


def test_kernels_with_symbolic_scratch_extents_are_not_aliased():
    """GPU cumsum kernels carry scratch buffers of symbolic extent: the in-place analysis says no
    instead of failing on ``int()`` of a variable (building needs no OpenCL device)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.cumsum(relax.op.add(x, relax.const(1.0)), axis=1))
            out = bb.emit_output(relax.op.multiply(y, relax.const(2.0)))
        bb.emit_func_output(out)
    target = tvm.target.Target({"kind": "opencl", "host": "llvm"})
    assert tvm.compile(bb.get(), target, relax_pipeline=tvm_memplan.pipeline(target)) is not None


def test_an_intermediate_read_at_another_index_forbids_writing_in_place():
    """out = transpose(x + 1): x itself is read at its own index, but the intermediate is not, and
    a schedule that inlines the intermediate reads x[j, i] after out[j, i] may have replaced it.
    The TorchScript export of ShuffleNetV2 (slice, concat, channel shuffle) computed wrong
    outputs this way with the default CPU schedules."""
    from tvm import te

    from tvm_memplan.relax.inplace import inplace_safe

    x = te.placeholder((8, 8), "float32", name="x")
    plus_one = te.compute((8, 8), lambda i, j: x[i, j] + 1.0, name="plus_one")
    transposed = te.compute((8, 8), lambda i, j: plus_one[j, i], name="transposed")
    assert not inplace_safe(te.create_prim_func([x, transposed]), 0, 1)
    doubled = te.compute((8, 8), lambda i, j: plus_one[i, j] * 2.0, name="doubled")
    assert inplace_safe(te.create_prim_func([x, doubled]), 0, 1)
