"""Layer grouping through the Relax pipeline: same outputs for every g, plans keep the F-predicate."""

from itertools import pairwise

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_memplan
from tvm_memplan import zoo
from tvm_memplan.errors import UserError
from tvm_memplan.frontend import LoadedModel
from tvm_memplan.planner import plan_model
from tvm_memplan.planning import validate_offsets
from tvm_memplan.verify import run_vm

from ..backends.conftest import needs_device
from .modules import random_input, tensor

SETTINGS = ["seq", 1, 2, "auto"]


def branches(n: int = 32) -> tvm.IRModule:
    """x feeds four unfusable branches of different depths, summed at the end: layers of 4, 2, 1."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", tensor((n, n)))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, x))
            b = bb.emit(relax.op.sum(x, axis=[1], keepdims=True))
            c = bb.emit(relax.op.matmul(x, relax.op.permute_dims(x)))
            d = bb.emit(relax.op.max(x, axis=[0], keepdims=True))
            a2 = bb.emit(relax.op.matmul(a, x))
            c2 = bb.emit(relax.op.matmul(c, c))
            out = bb.emit_output(relax.op.add(relax.op.add(a2, c2), relax.op.add(b, d)))
        bb.emit_func_output(out)
    return bb.get()


def compile_grouped(mod, target, groups):
    reports = []
    exe = tvm.compile(mod, target, relax_pipeline=tvm_memplan.pipeline(target, on_report=reports.append, groups=groups))
    return exe, reports[0]


@pytest.mark.parametrize("groups", SETTINGS)
def test_every_setting_matches_the_ungrouped_pipeline_and_keeps_the_f_predicate(target, groups):
    mod = branches()
    x = random_input((32, 32))
    ungrouped = tvm.compile(mod, target, relax_pipeline=tvm_memplan.pipeline(target))
    (expected,), _ = run_vm(ungrouped, [x])
    exe, report = compile_grouped(mod, target, groups)
    (got,), trace = run_vm(exe, [x])
    np.testing.assert_array_equal(got, expected)
    assert report.layers >= 3 and report.kernels >= report.groups >= report.layers
    for problem, offsets, arena_bytes in report.layouts():
        validate_offsets(problem, offsets, arena_bytes)  # re-derives the conflicts of each group
        assert arena_bytes >= problem.lower_bound()
    assert sorted(trace.storage_bytes) == sorted([report.arena_bytes, got.nbytes])  # the arena and the output
    ranges = [r for arena in report.arenas for r in arena["concurrent"]]
    if groups == "seq":
        assert not ranges and report.groups == report.kernels
    if groups == 1:
        assert ranges and report.groups == report.layers
        assert report.arena_bytes >= report.unconstrained_arena_bytes


def test_one_group_keeps_a_layers_tensors_apart(target):
    """The first layer's four kernels run together: none of their outputs may share bytes."""
    _, report = compile_grouped(branches(), target, 1)
    (arena,) = report.arenas
    ((first, *_),) = [arena["concurrent"][:1]]
    inside = [t for t in arena["tensors"] if t["start"] < first[1] and first[0] < t["end"]]
    assert len(inside) >= 4
    spans = sorted((t["offset"], t["offset"] + t["bytes"]) for t in inside)
    assert all(end <= start for (_, end), (start, _) in pairwise(spans))


@needs_device("opencl")
def test_grouped_builds_on_opencl_match_the_ungrouped_build():
    """The GPU pipeline (dlight schedules) on this machine's OpenCL device (PoCL)."""
    target = tvm.target.Target({"kind": "opencl", "host": "llvm"})
    dev = tvm.opencl(0)
    x = random_input((32, 32))
    outputs = {}
    for groups in (None, 1):
        # in place off as on every OpenCL build: a tensor at an arena offset is a copy there (issue 10)
        exe = tvm.compile(branches(), target, relax_pipeline=tvm_memplan.pipeline(target, groups=groups, inplace=False))
        outputs[groups] = relax.VirtualMachine(exe, dev)["main"](tvm.runtime.tensor(x, dev)).numpy()
    np.testing.assert_array_equal(outputs[1], outputs[None])


@pytest.mark.parametrize("bad", [0, "x", -2])
def test_bad_group_settings_are_user_errors(target, bad):
    with pytest.raises(UserError, match="positive integer"):
        tvm_memplan.pipeline(target, groups=bad)


@pytest.mark.slow
def test_squeezenet_outputs_identical_for_every_setting_and_vm_allocates_the_plan():
    """Fire modules put two kernels in a layer. scripts/bench_layers.py runs the same check on
    seed 000's five networks (too slow to build here)."""
    model = LoadedModel("squeezenet1_0", zoo.build("squeezenet1_0", resolution=32))
    inputs = model.random_inputs()
    ungrouped = plan_model(model, order="program", time_budget=1)
    expected, _ = run_vm(ungrouped.build(), inputs)
    for groups in (1, 2):
        plan = plan_model(model, groups=groups, time_budget=1)
        outputs, trace = run_vm(plan.build(), inputs)
        for got, want in zip(outputs, expected, strict=True):
            np.testing.assert_array_equal(got, want)
        output_bytes = sum(a.nbytes for a in outputs)
        assert sorted(trace.storage_bytes) == sorted([plan.main.arena_bytes, output_bytes])
        # a fire module's layer holds two kernels: one group with g = 1, one each with g = 2
        if groups == 1:
            assert plan.main.groups < plan.main.kernels
        else:
            assert plan.main.groups == plan.main.kernels
