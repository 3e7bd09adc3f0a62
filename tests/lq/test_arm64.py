"""aarch64 NEON kernels, cross-built and run under qemu-aarch64 (opt-in: TVM_MEMPLAN_RUN_ARM64=1).

Needs ``apt-get install gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user``.
"""

from __future__ import annotations

import numpy as np
import pytest

from tvm_memplan.lq import kernels
from tvm_memplan.lq.cross import arm64_target, have_arm64_toolchain, run_under_qemu

from .models import kernel_case

pytestmark = [
    pytest.mark.arm64,
    pytest.mark.skipif(not have_arm64_toolchain(), reason="aarch64 cross compiler or qemu-aarch64 missing"),
]


@pytest.mark.parametrize(
    "m,n,o,kx,kw",
    [
        (1, 77, 9, 1, 1),
        (5, 77, 37, 2, 2),
        (4, 130, 21, 3, 2),
        (8, 1000, 200, 2, 3),
        (3, 64, 16, 4, 4),
        (2, 33, 5, 1, 4),
    ],
)
def test_neon_kernels_bit_exact_under_qemu(m, n, o, kx, kw, tmp_path):
    assert kernels.kernel_flavor(arm64_target()) == "neon"
    x, act, xbits, wbits, ax, aw, bias = kernel_case(m, n, o, kx, kw, seed=m * 100 + n)
    lanes = kernels.LANES["neon"]

    pack = kernels.schedule_lq_pack(kernels.lq_pack_func(m, n, act), "neon")
    xp = np.zeros((kx, m, kernels.words(n)), np.uint32)
    xp = run_under_qemu(pack, [x, xp], tmp_path / "pack", "lq_pack")[1]
    np.testing.assert_array_equal(xp, kernels.pack_rows(xbits))

    dense = kernels.schedule_lq_dense(kernels.lq_dense_func(m, n, o, kx, kw, lanes), "neon")
    args = [xp, kernels.pack_weight_planes(wbits, lanes), ax, aw, bias, np.zeros((m, o), np.float32)]
    y = run_under_qemu(dense, args, tmp_path / "dense", "lq_dense")[-1]
    np.testing.assert_array_equal(y, kernels.lq_dense_reference(xbits, wbits, ax, aw, bias).astype(np.float32))
