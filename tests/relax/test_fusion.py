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
from tvm_memplan.frontend import load_model, to_relax
from tvm_memplan.relax.fusion import KernelNest, launch_shape, select_members
from tvm_memplan.verify.run import flatten_outputs

from ..backends.conftest import device_ready
from .modules import random_input, tensor

GPUS = [
    pytest.param(
        "vulkan",
        marks=pytest.mark.skipif(not device_ready("vulkan"), reason="no Vulkan device (tvm-memplan setup-gpu)"),
    ),
    pytest.param(
        "opencl",
        marks=pytest.mark.skipif(not device_ready("opencl"), reason="no OpenCL device (tvm-memplan setup-gpu)"),
    ),
]


def inception(channels: int = 8, size: int = 8) -> tvm.IRModule:
    """An inception block: four branches of different depths from one input, concatenated."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", tensor((1, channels, size, size)))
    weights = {
        name: relax.const(random_input(shape, seed=i))
        for i, (name, shape) in enumerate(
            {
                "b1": (channels, channels, 1, 1),
                "b2a": (channels, channels, 1, 1),
                "b2b": (channels, channels, 3, 3),
                "b3a": (channels, channels, 1, 1),
                "b3b": (channels, channels, 5, 5),
                "b4": (channels, channels, 1, 1),
            }.items()
        )
    }
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


def narrow_convs(channels: int = 256, size: int = 2, pool: bool = False) -> tvm.IRModule:
    """Two 1x1 convolutions of one input, whose reductions outnumber their outputs: dlight's
    matmul rule schedules them with shared memory, barriers and 8x8 threads; with ``pool``, a max
    pool of the input beside them, a kernel of tvm_memplan's with 128 threads and no barrier."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", tensor((1, channels, size, size)))
    w1, w2 = (relax.const(random_input((n, channels, 1, 1), seed=n)) for n in (32, 16))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.conv2d(x, w1))
            b = bb.emit(relax.op.nn.conv2d(x, w2))
            branches = [a, b]
            if pool:
                branches.append(bb.emit(relax.op.nn.max_pool2d(x, pool_size=3, strides=1, padding=1)))
            out = bb.emit_output(relax.op.concat(branches, axis=1))
        bb.emit_func_output(out)
    return bb.get()


def reductions_on_one_pixel(channels: int = 256) -> tvm.IRModule:
    """An inception block's last stages on a 1x1 map: dlight reduces the convolutions across
    threads, bound inside other loops (lavapipe: 32x8 threads for the 1x1 kernels, 64 for the 3x3
    one; PoCL: 64 and 256), beside a 128-thread max pool. Layer 1 has one thread shape; layer 2
    has both, which share a launch of a split shape (lavapipe: 32x2, PoCL: 64x4)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", tensor((1, channels, 1, 1)))
    weights = {
        name: relax.const(random_input(shape, seed=i))
        for i, (name, shape) in enumerate(
            {
                "a": (64, channels, 1, 1),
                "b": (32, channels, 1, 1),
                "c": (32, 64, 3, 3),
                "d": (16, channels, 1, 1),
            }.items()
        )
    }
    conv = relax.op.nn.conv2d
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(conv(x, weights["a"])))
            b = bb.emit(relax.op.nn.relu(conv(x, weights["b"])))
            pool = bb.emit(relax.op.nn.max_pool2d(x, pool_size=3, strides=1, padding=1))
            c = bb.emit(relax.op.nn.relu(conv(a, weights["c"], padding=1)))
            d = bb.emit(relax.op.nn.relu(conv(pool, weights["d"])))
            out = bb.emit_output(relax.op.concat([b, c, d], axis=1))
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


def run(mod: tvm.IRModule, kind: str, groups, x: np.ndarray, **options):
    """Build ``mod`` for ``kind`` with ``groups`` (and pipeline ``options``) and run it once:
    outputs, the VM's storage requests, the kernels it launched, and the plan report."""
    target = get_target(kind).tvm_target()  # what the command line builds with (registers the Vulkan generator)
    dev = tvm.device(kind, 0)
    reports = []
    exe = tvm.compile(
        mod, target, relax_pipeline=tvm_memplan.pipeline(target, groups=groups, on_report=reports.append, **options)
    )
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
def test_a_kernel_without_barriers_loops_over_its_threads_in_a_launch_with_fewer(kind):
    x = random_input((1, 256, 2, 2))
    (expected,), _, _, _ = run(narrow_convs(pool=True), kind, None, x)
    (got,), storage, launches, report = run(narrow_convs(pool=True), kind, 1, x)
    np.testing.assert_array_equal(got, expected)
    assert sorted(storage) == sorted([report.arena_bytes, got.nbytes])
    # the 128-thread pool runs twice in each thread of the convolutions' 64-thread launch
    assert report.kernels == 4 and report.groups == 2 and launches == 2


@pytest.mark.parametrize("kind", GPUS)
def test_reductions_in_two_thread_shapes_share_one_launch_with_identical_outputs(kind):
    x = random_input((1, 256, 1, 1))
    (expected,), _, _, _ = run(reductions_on_one_pixel(), kind, None, x)
    (got,), storage, launches, report = run(reductions_on_one_pixel(), kind, 1, x)
    # bit-identical: the wider reduction's lanes keep TVM's order (x fastest; y fastest differed
    # by 3e-5 on both devices), the narrower one's rows loop (lavapipe) or its blocks pack (PoCL)
    np.testing.assert_array_equal(got, expected)
    assert sorted(storage) == sorted([report.arena_bytes, got.nbytes])
    # layer 1 (two reductions and the pool), layer 2 (reductions in two shapes), the concat
    assert report.kernels == 6 and report.groups == 3 and launches == 3


@pytest.mark.parametrize("kind", GPUS)
def test_a_kernel_no_fused_launch_can_take_runs_on_its_own(kind):
    x = random_input((32, 32))
    (expected,), _, launches, report = run(with_unfusable_member(), kind, None, x)
    assert report.kernels == 4 and launches == 5  # two_kernels launches twice
    (got,), _, launches, report = run(with_unfusable_member(), kind, 1, x)
    np.testing.assert_array_equal(got, expected)
    # two groups: the reductions as one launch beside two_kernels' two, then the sum
    assert report.groups == 2 and launches == 4


SEED_NETWORKS = {
    "googlenet": "zoo:googlenet?resolution=31",
    "resnext50_32x4d": "zoo:resnext50_32x4d?resolution=16",
    "mobilenet_v2": "zoo:mobilenet_v2?width=0.35&resolution=32",
    "xception": "zoo:xception?resolution=16",
    "inception_v3": "zoo:inception_v3?resolution=75",
}
"""Seed 000's networks at the smallest input each builds at. Their four Vulkan builds took 46, 22, 26,
21 and 59 s in one run here (a shared 2-core machine): the cost follows the kernel count, not the input size."""


@pytest.mark.slow
@pytest.mark.skipif(not device_ready("vulkan"), reason="no Vulkan device (tvm-memplan setup-gpu)")
@pytest.mark.parametrize("name", list(SEED_NETWORKS))
def test_seed_networks_on_vulkan_identical_for_every_setting_and_one_launch_per_group(name):
    model = load_model(SEED_NETWORKS[name])
    mod, (x,) = to_relax(model), model.random_inputs(0).values()
    expected, _, launches, report = run(mod, "vulkan", None, x, order="program", time_budget=1.0)
    assert launches == report.kernels
    for groups in ("seq", 1, 2):
        got, storage, launches, report = run(mod, "vulkan", groups, x, time_budget=1.0)
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_array_equal(a, b)
        assert sorted(storage) == sorted([report.arena_bytes, *(a.nbytes for a in got)])  # the VM allocates the plan
        assert launches == report.groups


def nest(
    threads: dict[str, int],
    blocks: int = 1,
    uniform: bool = False,
    across: bool = False,
    index: str = "int32",
    reduced: tuple[str, ...] = ("threadIdx.x",),
) -> KernelNest:
    var = tvm.tirx.Var("v", index)
    return KernelNest(
        None,
        {"blockIdx.x": (var, blocks)},
        {t: (var, n) for t, n in threads.items()},
        None,
        [],
        uniform or across,
        across,
        () if across else tuple(threads),
        reduced if across else (),
    )


def test_a_launch_runs_at_the_thread_count_of_its_synchronising_members():
    spatial128, spatial64 = nest({"threadIdx.x": 128}), nest({"threadIdx.x": 64})
    shared64 = nest({"threadIdx.x": 8, "threadIdx.y": 8}, uniform=True)
    shared128 = nest({"threadIdx.x": 128}, uniform=True)
    # at 128 threads three kernels join, at 64 also three (the 128-thread one looping): more threads win
    assert select_members([spatial128, shared64, spatial64, shared128]) == [0, 2, 3]
    # kernels without barriers join the shared-memory kernel at its count, with more threads or fewer
    assert select_members([spatial128, shared64, spatial64]) == [0, 1, 2]
    assert launch_shape([spatial128, shared64, spatial64]) == (("threadIdx.x", 64),)
    # two synchronising kernels with different counts never share a launch
    assert select_members([shared64, shared128]) == [1]
    # the fused grid stays within Vulkan's smallest limit
    assert select_members([nest({"threadIdx.x": 32}, blocks=40000)] * 2) == [0]


def test_reductions_across_threads_share_a_launch_their_thread_loops_split_into():
    gemv = nest({"threadIdx.x": 32, "threadIdx.y": 8}, blocks=4, across=True)
    row = nest({"threadIdx.x": 64}, across=True)
    shared256 = nest({"threadIdx.x": 256}, uniform=True)
    spatial128 = nest({"threadIdx.x": 128})
    # the launch takes the reduction's 32x8 shape; the other 256-thread kernels flatten onto it
    assert select_members([gemv, spatial128, shared256, gemv]) == [0, 1, 2, 3]
    assert launch_shape([gemv, spatial128, shared256]) == (("threadIdx.x", 32), ("threadIdx.y", 8))
    # 64 lanes split into 32x2; the 32x8 reduction runs its rows two at a time
    assert select_members([row, gemv, spatial128, gemv]) == [0, 1, 2, 3]
    assert launch_shape([row, gemv]) == (("threadIdx.x", 32), ("threadIdx.y", 2))
    # 256 lanes split into 64x4; a 64-lane reduction with one row per block packs four blocks
    wide, narrow = (
        nest({"threadIdx.x": 256}, across=True),
        nest({"threadIdx.x": 64, "threadIdx.y": 1}, blocks=8, across=True),
    )
    assert select_members([wide, narrow]) == [0, 1] and launch_shape([wide, narrow]) == (
        ("threadIdx.x", 64),
        ("threadIdx.y", 4),
    )
    # ... not where its blocks do not divide into fours
    assert select_members([wide, nest({"threadIdx.x": 64, "threadIdx.y": 1}, blocks=6, across=True)]) == [0]
    # rows do not split where the rows are reduced across too, or do not divide
    both = nest({"threadIdx.x": 32, "threadIdx.y": 8}, across=True, reduced=("threadIdx.x", "threadIdx.y"))
    assert len(select_members([row, both])) == 1
    assert len(select_members([row, nest({"threadIdx.x": 32, "threadIdx.y": 3}, across=True)])) == 1
    # nor do reductions whose thread loops have different index types share the launch's
    assert select_members([gemv, nest({"threadIdx.x": 32, "threadIdx.y": 8}, across=True, index="int64")]) == [0]
