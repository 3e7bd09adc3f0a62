"""The LQ kernels are bit-exact against a numpy ±1 reference on every schedule family this machine runs."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import tvm

from tvm_memplan.lq import kernels
from tvm_memplan.lq.quantizer import fit_activations

from .models import kernel_case

# This machine's own CPU: a fixed -mcpu (znver4 once) emits instructions other AVX-512 CPUs lack.
NATIVE = tvm.target.Target({**json.loads(str(tvm.target.Target.from_device("cpu"))), "num-cores": 2})
# The generic fallback: plain x86-64 (SSE2 only) and AVX2 without VPOPCNTDQ.
GENERIC = {
    "x86-64": tvm.target.Target({"kind": "llvm", "mcpu": "x86-64", "num-cores": 2}),
    "haswell": tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2}),
}
HAS_VPOPCNTDQ = kernels.kernel_flavor(tvm.target.Target.from_device("cpu")) == "avx512"


def _run(func, target, arrays):
    lib = tvm.tirx.build(func, target=target)
    dev = tvm.cpu()
    tensors = [tvm.runtime.tensor(a, dev) for a in arrays]
    lib(*tensors)
    return [t.numpy() for t in tensors]


def _check(flavor, target, m, n, o, kx, kw, seed=0):
    x, act, xbits, wbits, ax, aw, bias = kernel_case(m, n, o, kx, kw, seed)
    lanes = kernels.LANES[flavor]
    pack = kernels.schedule_lq_pack(kernels.lq_pack_func(m, n, act), flavor)
    xp = _run(pack, target, [x, np.zeros((kx, m, kernels.words(n)), np.uint32)])[1]
    np.testing.assert_array_equal(xp, kernels.pack_rows(xbits))
    dense = kernels.schedule_lq_dense(kernels.lq_dense_func(m, n, o, kx, kw, lanes), flavor)
    wp = kernels.pack_weight_planes(wbits, lanes)
    y = _run(dense, target, [xp, wp, ax, aw, bias, np.zeros((m, o), np.float32)])[-1]
    np.testing.assert_array_equal(y, kernels.lq_dense_reference(xbits, wbits, ax, aw, bias).astype(np.float32))


def test_pack_rows_round_trips_with_zero_padding():
    bits = np.random.default_rng(0).integers(0, 2, (3, 77)).astype(np.uint8)
    packed = kernels.pack_rows(bits)
    assert packed.shape == (3, 3)
    np.testing.assert_array_equal(kernels.unpack_rows(packed, 77), bits)
    full = kernels.unpack_rows(packed, 96)
    assert not full[:, 77:].any(), "padding bits are zero"


@pytest.mark.skipif(not HAS_VPOPCNTDQ, reason="needs AVX-512 VPOPCNTDQ")
@pytest.mark.parametrize("kx,kw", list(itertools.product(range(1, 5), range(1, 5))))
def test_avx512_all_bit_widths_odd_n(kx, kw):
    _check("avx512", NATIVE, 5, 77, 37, kx, kw, seed=kx * 10 + kw)


@pytest.mark.skipif(not HAS_VPOPCNTDQ, reason="needs AVX-512 VPOPCNTDQ")
@pytest.mark.parametrize("m", [1, 8, 64])
@pytest.mark.parametrize("kx,kw", [(2, 2), (1, 1), (3, 1)])
def test_avx512_batch_sizes_and_parallel_schedule(m, kx, kw):
    # 64 x 1000 -> 200 crosses the parallel threshold; M=1 and M=8 exercise the M-tiles.
    _check("avx512", NATIVE, m, 1000, 200, kx, kw, seed=m)


@pytest.mark.parametrize("name", sorted(GENERIC))
@pytest.mark.parametrize("m,kx,kw", [(1, 2, 2), (6, 1, 3), (16, 4, 4)])
def test_generic_x86_fallback(name, m, kx, kw):
    assert kernels.kernel_flavor(GENERIC[name]) == "x86"
    _check("x86", GENERIC[name], m, 131, 19, kx, kw, seed=m)


def test_float_scales_match_reference_closely():
    rng = np.random.default_rng(7)
    m, n, o, kx, kw = 4, 300, 48, 2, 3
    x = rng.normal(size=(m, n)).astype(np.float32)
    act = fit_activations(x, kx, "pm1", iters=5)
    xbits = act.code_bits(x.reshape(1, -1)).reshape(kx, m, n)
    wbits = rng.integers(0, 2, (kw, o, n)).astype(np.uint8)
    ax = act.pm1_form()[0][0].astype(np.float32)
    aw = rng.uniform(0.01, 0.1, (kw, o)).astype(np.float32)
    bias = rng.normal(size=o).astype(np.float32)
    flavor = kernels.kernel_flavor(tvm.target.Target.from_device("cpu"))
    target = NATIVE if flavor == "avx512" else GENERIC["x86-64"]
    lanes = kernels.LANES[flavor]
    pack = kernels.schedule_lq_pack(kernels.lq_pack_func(m, n, act), flavor)
    xp = _run(pack, target, [x, np.zeros((kx, m, kernels.words(n)), np.uint32)])[1]
    dense = kernels.schedule_lq_dense(kernels.lq_dense_func(m, n, o, kx, kw, lanes), flavor)
    y = _run(dense, target, [xp, kernels.pack_weight_planes(wbits, lanes), ax, aw, bias, np.zeros((m, o), np.float32)])
    ref = kernels.lq_dense_reference(xbits, wbits, ax, aw, bias)
    np.testing.assert_allclose(y[-1], ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m,n,o", [(1, 100, 40), (12, 64, 33)])
def test_fp32_baseline_kernel(m, n, o):
    rng = np.random.default_rng(m)
    x = rng.normal(size=(m, n)).astype(np.float32)
    w = rng.normal(size=(n, o)).astype(np.float32)
    b = rng.normal(size=o).astype(np.float32)
    func = kernels.schedule_fp32_dense(kernels.fp32_dense_func(m, n, o, 32))
    y = _run(
        func,
        NATIVE if HAS_VPOPCNTDQ else GENERIC["x86-64"],
        [x, kernels.pack_fp32_weight(w, 32), b, np.zeros((m, o), np.float32)],
    )
    np.testing.assert_allclose(y[-1], x @ w + b, rtol=1e-4, atol=1e-4)


def test_kernel_flavor_per_target():
    # by the CPU's features, not by this machine's (CI machines are AVX-512 Xeons or AVX2-only Zen 3s)
    icelake = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server"})
    assert kernels.kernel_flavor(icelake) == "avx512"
    assert kernels.kernel_flavor(tvm.target.Target({"kind": "llvm", "mcpu": "znver3"})) == "x86"
    assert kernels.kernel_flavor(GENERIC["x86-64"]) == "x86"
    arm = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]})
    assert kernels.kernel_flavor(arm) == "neon"
    with pytest.raises(ValueError):
        kernels.kernel_flavor(tvm.target.Target({"kind": "c"}))
