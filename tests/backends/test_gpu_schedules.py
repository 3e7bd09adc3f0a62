"""tvm_memplan's GPU rule computes what the unscheduled kernel computes on this machine's OpenCL
device (PoCL in CI): depthwise, regular and pointwise convolutions, pools; it leaves long
reductions to dlight. Reference: the same kernel unscheduled, built by LLVM for the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from tvm_memplan.schedule.gpu import ThreadPerOutput

from ..kernels import conv_body, kernels_of
from .conftest import needs_device

OPENCL = tvm.target.Target({"kind": "opencl", "host": "llvm"})


def _run(func: tirx.PrimFunc, target: tvm.target.Target, dev: tvm.runtime.Device) -> np.ndarray:
    lib = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.shape]).astype("float32"), dev) for p in func.params]
    lib["main"](*args)
    return args[-1].numpy()


CASES = {
    "depthwise3x3": (conv_body(16, 3, padding=1, groups=16, activation="relu6"), (1, 16, 10, 10)),
    "depthwise3x3_stride2": (conv_body(24, 3, stride=2, padding=1, groups=24, activation="relu6"), (1, 24, 11, 11)),
    "depthwise5x5": (conv_body(8, 5, padding=2, groups=8, activation="relu6"), (1, 8, 9, 9)),
    "conv3x3_stride2_stem": (conv_body(8, 3, stride=2, padding=1, activation="relu6"), (1, 3, 16, 16)),
    "conv1x1": (conv_body(12, 1, activation="relu6"), (1, 8, 7, 7)),
    "conv3x3_batch2_partial_block": (conv_body(8, 3, padding=1, activation="relu6"), (2, 4, 7, 7)),  # 196 threads in blocks of 128
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
