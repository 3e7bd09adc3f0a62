"""tvm_memplan's GPU rule computes what the unscheduled kernel computes on this machine's OpenCL
device (PoCL in CI): depthwise, regular and pointwise convolutions, pools; it leaves long
reductions to dlight. Reference: the same kernel unscheduled, built by LLVM for the CPU. The last
rule, ThreadPerLoopNest, makes the kernels every other rule declines (non-global adaptive pools)
device kernels, on PoCL and lavapipe."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, tirx

from tvm_memplan.backends.schedules import generic_gpu_schedule
from tvm_memplan.relax.pipeline import pipeline
from tvm_memplan.schedule.gpu import ThreadPerOutput
from tvm_memplan.verify import run_vm

from ..kernels import conv_body, kernels_of
from .conftest import device_ready, needs_device

OPENCL = tvm.target.Target({"kind": "opencl", "host": "llvm"})
GPUS = {kind: tvm.target.Target({"kind": kind, "host": "llvm"}) for kind in ("opencl", "vulkan")}


def _run(func: tirx.PrimFunc, target: tvm.target.Target, dev: tvm.runtime.Device) -> np.ndarray:
    lib = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    rng = np.random.default_rng(0)
    args = [
        tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.shape]).astype("float32"), dev) for p in func.params
    ]
    lib["main"](*args)
    return args[-1].numpy()


CASES = {
    "depthwise3x3": (conv_body(16, 3, padding=1, groups=16, activation="relu6"), (1, 16, 10, 10)),
    "depthwise3x3_stride2": (conv_body(24, 3, stride=2, padding=1, groups=24, activation="relu6"), (1, 24, 11, 11)),
    "depthwise5x5": (conv_body(8, 5, padding=2, groups=8, activation="relu6"), (1, 8, 9, 9)),
    "conv3x3_stride2_stem": (conv_body(8, 3, stride=2, padding=1, activation="relu6"), (1, 3, 16, 16)),
    "conv1x1": (conv_body(12, 1, activation="relu6"), (1, 8, 7, 7)),
    "conv3x3_batch2_partial_block": (
        conv_body(8, 3, padding=1, activation="relu6"),
        (2, 4, 7, 7),
    ),  # 196 threads in blocks of 128
    "grouped3x3": (conv_body(8, 3, padding=1, groups=2, activation="relu6"), (1, 4, 6, 6)),
    "max_pool": (lambda bb, x: relax.op.nn.max_pool2d(x, 3, 2, 1), (1, 8, 9, 9)),
    "avg_pool": (lambda bb, x: relax.op.nn.avg_pool2d(x, 2, 2), (1, 8, 8, 8)),
    "global_mean": (lambda bb, x: relax.op.mean(x, axis=[2, 3], keepdims=True), (1, 32, 5, 5)),
}


@needs_device("opencl")
@pytest.mark.parametrize("case", list(CASES))
def test_the_rule_schedules_the_kernel_and_matches_the_cpu(case):
    body, shape = CASES[case]
    (func,) = kernels_of(body, shape).values()
    sch = ThreadPerOutput().apply(func, OPENCL, False)
    assert sch is not None, f"{case}: not scheduled by ThreadPerOutput"
    expected = _run(func, tvm.target.Target("llvm"), tvm.cpu())
    np.testing.assert_allclose(_run(sch.mod["main"], OPENCL, tvm.opencl(0)), expected, rtol=1e-5, atol=1e-5)


def test_a_dense_layer_is_left_to_dlight():
    """1000 outputs of a 1280-long reduction: a cross-thread reduction (dlight's GEMV) suits it."""
    w = relax.const(np.ones((1280, 1000), "float32"))
    (func,) = kernels_of(lambda bb, x: relax.op.matmul(x, w), (1, 1280)).values()
    assert ThreadPerOutput().apply(func, OPENCL, False) is None


def test_a_pool_with_a_symbolic_batch_is_declined():
    """A symbolic extent is "not applicable", not an error (only NotApplicable declines a rule)."""
    for func in kernels_of(
        lambda bb, x: relax.op.nn.max_pool2d(x, 3, 2, 1), (tirx.Var("n", "int64"), 8, 9, 9)
    ).values():
        assert ThreadPerOutput().apply(func, OPENCL, False) is None


def test_a_sum_to_a_scalar_is_declined():
    """No output axis to give threads: declined (its scalar output raised an IndexError, swallowed)."""
    (func,) = kernels_of(lambda bb, x: relax.op.sum(x), (4, 33)).values()
    assert ThreadPerOutput().apply(func, OPENCL, False) is None


def adaptive_avg_pool(x: np.ndarray, size: int) -> np.ndarray:
    """PyTorch's adaptive average pool: output i averages rows floor(i*H/size) to ceil((i+1)*H/size)."""
    height, width = x.shape[2:]
    rows = [(i * height // size, -(-(i + 1) * height // size)) for i in range(size)]
    cols = [(j * width // size, -(-(j + 1) * width // size)) for j in range(size)]
    return np.array(
        [
            [[[x[n, c, r0:r1, c0:c1].mean() for c0, c1 in cols] for r0, r1 in rows] for c in range(x.shape[1])]
            for n in range(x.shape[0])
        ],
        dtype=x.dtype,
    )


ADAPTIVE = {"2x2_of_7x7": ((1, 8, 7, 7), 2), "7x7_of_15x15": ((1, 16, 15, 15), 7)}


@pytest.mark.parametrize("case", list(ADAPTIVE))
def test_every_rule_before_the_last_declines_an_adaptive_pool_the_last_binds_it(case):
    """Its windows vary with the output position (a nested block dlight cannot normalise): without
    ThreadPerLoopNest the kernel stays unscheduled host code."""
    shape, size = ADAPTIVE[case]
    (func,) = kernels_of(lambda bb, x: relax.op.nn.adaptive_avg_pool2d(x, (size, size)), shape).values()
    assert ThreadPerOutput().apply(func, OPENCL, False) is None
    with OPENCL:
        scheduled = generic_gpu_schedule()(tvm.IRModule({"main": func}))["main"]
    bound = []
    tvm_ffi.structural_walk(
        scheduled.body,
        [
            (
                tirx.For,
                lambda loop: bound.append(loop.thread_binding.thread_tag) if loop.thread_binding is not None else None,
            )
        ],
        order="post",
    )
    assert sorted(bound) == ["blockIdx.x", "threadIdx.x"]  # one kernel, its epilogue in the same thread


@pytest.mark.parametrize("kind", list(GPUS))
@pytest.mark.parametrize("case", list(ADAPTIVE))
def test_an_adaptive_pool_runs_on_the_device_and_matches_numpy_and_the_cpu(kind, case):
    """Built by the GPU pipeline with a ReLU fused after the pool, run on PoCL and lavapipe."""
    if not device_ready(kind):
        pytest.skip(f"no {kind} device: run tvm-memplan setup-gpu")
    shape, size = ADAPTIVE[case]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            pooled = bb.emit(relax.op.nn.adaptive_avg_pool2d(x, (size, size)))
            out = bb.emit_output(relax.op.nn.relu(relax.op.subtract(pooled, relax.const(0.5, "float32"))))
        bb.emit_func_output(out)
    data = np.random.default_rng(0).random(shape, dtype="float32")
    target = GPUS[kind]
    (gpu,), _ = run_vm(tvm.compile(bb.get(), target, relax_pipeline=pipeline(target)), [data], tvm.device(kind, 0))
    cpu_target = tvm.target.Target("llvm")
    (cpu,), _ = run_vm(tvm.compile(bb.get(), cpu_target, relax_pipeline=pipeline(cpu_target)), [data])
    np.testing.assert_allclose(gpu, np.maximum(adaptive_avg_pool(data, size) - 0.5, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gpu, cpu, rtol=1e-5, atol=1e-6)
