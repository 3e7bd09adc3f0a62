"""One launch per group on GPUs: fused builds match the ungrouped ones, launches are counted on
the device, the VM allocates the plan, and kernels that cannot join a fused launch still run."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import tirx as T

import tvm_memplan
from tvm_memplan.deploy.remote import kernel_counter
from tvm_memplan.deploy.targets import get_target
from tvm_memplan.relax.fusion import KernelNest, select_members
from tvm_memplan.verify.run import flatten_outputs

from ..backends.conftest import device_ready
from .modules import random_input, tensor

GPUS = [
    pytest.param("vulkan", marks=pytest.mark.skipif(not device_ready("vulkan"), reason="no Vulkan device (tvm-memplan setup-gpu)")),
    pytest.param("opencl", marks=pytest.mark.skipif(not device_ready("opencl"), reason="no OpenCL device (tvm-memplan setup-gpu)")),
]


def inception(channels: int = 8, size: int = 8) -> tvm.IRModule:
    """An inception block: four branches of different depths from one input, concatenated."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", tensor((1, channels, size, size)))
    weights = {name: relax.const(random_input(shape, seed=i)) for i, (name, shape) in enumerate({
        "b1": (channels, channels, 1, 1), "b2a": (channels, channels, 1, 1), "b2b": (channels, channels, 3, 3),
        "b3a": (channels, channels, 1, 1), "b3b": (channels, channels, 5, 5), "b4": (channels, channels, 1, 1),
    }.items())}
    conv = relax.op.nn.conv2d
    with bb.function("main", [x]):
        with bb.dataflow():
            b1 = bb.emit(relax.op.nn.relu(conv(x, weights["b1"])))
            b2 = bb.emit(relax.op.nn.relu(conv(conv(x, weights["b2a"]), weights["b2b"], padding=1)))
            b3 = bb.emit(relax.op.nn.relu(conv(conv(x, weights["b3a"]), weights["b3b"], padding=2)))
            pool = relax.op.nn.max_pool2d(x, pool_size=3, strides=1, padding=1)
            b4 = bb.emit(relax.op.nn.relu(conv(pool, weights["b4"])))
            out = bb.emit_output(relax.op.concat([b1, b2, b3, b4], axis=1))
        bb.emit_func_output(out)
    return bb.get()


def narrow_convs(channels: int = 256, size: int = 2) -> tvm.IRModule:
    """Two 1x1 convolutions of one input, whose reductions outnumber their outputs: dlight's
    matmul rule schedules them with shared memory, barriers and 8x8 threads."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", tensor((1, channels, size, size)))
    w1, w2 = (relax.const(random_input((n, channels, 1, 1), seed=n)) for n in (32, 16))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.conv2d(x, w1))
            b = bb.emit(relax.op.nn.conv2d(x, w2))
            out = bb.emit_output(relax.op.concat([a, b], axis=1))
        bb.emit_func_output(out)
    return bb.get()


@T.prim_func(s_tir=True)
def two_kernels(a: T.Buffer((32, 32), "float32"), b: T.Buffer((32, 32), "float32")):
    """Scheduled already (dlight leaves it), opaque to Relax's operator fusion, and two launches:
    no fused launch can take it."""
    T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True, "op_pattern": 8})
    for i in T.thread_binding(32, thread="threadIdx.x"):
        for j in range(32):
            with T.sblock("double"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = a[vi, vj] * T.float32(2)
    for i in T.thread_binding(32, thread="threadIdx.x"):
        for j in range(32):
            with T.sblock("increment"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = b[vi, vj] + T.float32(1)


def with_unfusable_member() -> tvm.IRModule:
    """x feeds :func:`two_kernels` and two reductions (one layer), summed by a fourth kernel."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", tensor((32, 32)))
    kernel = bb.add_func(two_kernels, "two_kernels")
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.call_tir(kernel, [x], tensor((32, 32))))
            b = bb.emit(relax.op.sum(x, axis=[1], keepdims=True))
            c = bb.emit(relax.op.max(x, axis=[0], keepdims=True))
            out = bb.emit_output(relax.op.add(relax.op.add(a, b), c))
        bb.emit_func_output(out)
    return bb.get()


def run(mod: tvm.IRModule, kind: str, groups, x: np.ndarray):
    """Build ``mod`` for ``kind`` with ``groups`` and run it once: outputs, the VM's storage
    requests, the kernels it launched, and the plan report."""
    target = get_target(kind).tvm_target()  # what the command line builds with (registers the Vulkan generator)
    dev = tvm.device(kind, 0)
    reports = []
    exe = tvm.compile(mod, target, relax_pipeline=tvm_memplan.pipeline(target, groups=groups, on_report=reports.append))
    kernels = kernel_counter(exe.mod)
    storage, launches = [], []

    def instrument(func, symbol, before_run, ret_value, *args) -> int:
        if before_run and symbol == "vm.builtin.alloc_storage":
            storage.append(int(args[1][0]))
        elif before_run and not symbol.startswith("vm.builtin."):
            launches.append(kernels(symbol))
        return 0

    vm = relax.VirtualMachine(exe, dev)
    vm.set_instrument(instrument)
    outputs = flatten_outputs(vm["main"](tvm.runtime.tensor(x, dev)))
    return outputs, storage, sum(launches), reports[0]


@pytest.mark.parametrize("kind", GPUS)
def test_one_launch_per_group_and_outputs_identical_to_the_ungrouped_build(kind):
    x = random_input((1, 8, 8, 8))
    (expected,), _, launches, report = run(inception(), kind, None, x)
    assert launches == report.kernels  # ungrouped: every kernel its own launch
    for groups in (1, 2):
        (got,), storage, launches, report = run(inception(), kind, groups, x)
        np.testing.assert_array_equal(got, expected)
        assert sorted(storage) == sorted([report.arena_bytes, got.nbytes])  # the VM allocates the plan
        assert launches == report.groups < report.kernels  # every kernel here can join a fused launch


@pytest.mark.parametrize("kind", GPUS)
def test_kernels_with_barriers_fuse_at_their_own_thread_count(kind):
    x = random_input((1, 256, 2, 2))
    (expected,), _, _, _ = run(narrow_convs(), kind, None, x)
    (got,), _, launches, report = run(narrow_convs(), kind, 1, x)
    np.testing.assert_array_equal(got, expected)
    assert report.kernels == 3 and report.groups == 2 and launches == 2  # the convolutions, then the concat


@pytest.mark.parametrize("kind", GPUS)
def test_a_kernel_no_fused_launch_can_take_runs_on_its_own(kind):
    x = random_input((32, 32))
    (expected,), _, launches, report = run(with_unfusable_member(), kind, None, x)
    assert report.kernels == 4 and launches == 5  # two_kernels launches twice
    (got,), _, launches, report = run(with_unfusable_member(), kind, 1, x)
    np.testing.assert_array_equal(got, expected)
    # two groups: the reductions as one launch beside two_kernels' two, then the sum
    assert report.groups == 2 and launches == 4


def nest(threads: dict[str, int], blocks: int = 1, uniform: bool = False, across: bool = False) -> KernelNest:
    var = tvm.tirx.Var("v", "int32")
    return KernelNest(None, {"blockIdx.x": (var, blocks)}, {t: (var, n) for t, n in threads.items()}, None, [], uniform, across)


def test_kernels_that_synchronise_join_only_at_their_own_thread_count():
    spatial128, spatial64 = nest({"threadIdx.x": 128}), nest({"threadIdx.x": 64})
    shared64 = nest({"threadIdx.x": 8, "threadIdx.y": 8}, uniform=True)
    shared128 = nest({"threadIdx.x": 128}, uniform=True)
    # 128 threads: both spatial kernels and the 128-thread shared-memory kernel; not the 64-thread one
    assert select_members([spatial128, shared64, spatial64, shared128]) == [0, 2, 3]
    # a reduction across threads needs threadIdx.x alone
    reduce2d = nest({"threadIdx.x": 8, "threadIdx.y": 8}, uniform=True, across=True)
    assert select_members([spatial64, reduce2d]) == [0]
    # the fused grid stays within Vulkan's smallest limit
    assert select_members([nest({"threadIdx.x": 32}, blocks=40000)] * 2) == [0]
