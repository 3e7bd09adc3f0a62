"""MetaSchedule tuning of the LQ dense kernel (opt-in: TVM_MEMPLAN_RUN_TUNING=1; about two minutes on two cores)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from tvm_memplan.lq import kernels
from tvm_memplan.lq.calibrate import default_target
from tvm_memplan.lq.tuning import tune_primfunc

pytestmark = pytest.mark.tuning


def test_tuned_kernel_is_exact_and_the_database_is_reused(tmp_path):
    target = default_target()
    flavor = kernels.kernel_flavor(target)
    lanes = kernels.LANES[flavor]
    m, n, o, kx, kw = 4, 250, 48, 2, 2
    func = kernels.lq_dense_func(m, n, o, kx, kw, lanes)
    tuned = tune_primfunc(func, target, trials=8, work_dir=tmp_path)
    assert (tmp_path / "database_tuning_record.json").stat().st_size > 0

    rng = np.random.default_rng(0)
    xbits = rng.integers(0, 2, (kx, m, n)).astype(np.uint8)
    wbits = rng.integers(0, 2, (kw, o, n)).astype(np.uint8)
    ax = np.array([1, 2], np.float32)
    aw = rng.integers(-3, 4, (kw, o)).astype(np.float32)
    bias = rng.integers(-3, 4, o).astype(np.float32)
    dev = tvm.cpu()
    args = [
        kernels.pack_rows(xbits),
        kernels.pack_weight_planes(wbits, lanes),
        ax,
        aw,
        bias,
        np.zeros((m, o), np.float32),
    ]
    tensors = [tvm.runtime.tensor(a, dev) for a in args]
    tvm.tirx.build(tuned, target=target)(*tensors)
    expect = kernels.lq_dense_reference(xbits, wbits, ax, aw, bias).astype(np.float32)
    np.testing.assert_array_equal(tensors[-1].numpy(), expect)

    records = (tmp_path / "database_tuning_record.json").read_text()
    tune_primfunc(func, target, trials=8, work_dir=tmp_path)
    assert (tmp_path / "database_tuning_record.json").read_text() == records, "no new trials"
