"""Benchmark plumbing on small shapes: the kernel rows' fields, the Markdown tables, and the limits' invariant."""

from __future__ import annotations

import pytest

from tvm_memplan.lq import bench, machine
from tvm_memplan.lq.timing import Timing

QUICK = Timing(number=1, repeat=1, min_repeat_ms=1)
SIZES = (16 << 10, 256 << 10, 4 << 20)
# Timing noise allowed when a kernel runs right at its limit on a shared two-core machine; a
# broken probe (a spilling register tile, a cold-DRAM bound for warm data) is 2-4x off.
NOISE = 1.25
# OpenBLAS kernel families that use AVX-512: numpy is no AVX2 baseline with these.
AVX512_BLAS = ("SkylakeX", "Cooperlake", "SapphireRapids")


def test_kernel_rows_have_the_issue_fields_and_bounds():
    target = bench.default_target()
    limits = machine.machine_limits(target, QUICK, read_sizes=SIZES)
    assert limits["popcount_steps_per_s"] > 0 and limits["fma_per_s"] > 0
    assert set(limits["read_bytes_per_s"]) == set(SIZES)
    rows = bench.kernel_rows(target, shapes=[(100, 40)], rows=[1, 4], bits=[(2, 2)], timing=QUICK, limits=limits)
    assert [(r["M"], r["N"], r["O"]) for r in rows] == [(1, 100, 40), (4, 100, 40)]
    for row in rows:
        for key in ("wbits", "abits", "lq_us", "fp32_tvm_us", "fp32_numpy_us", "popcount_bound_us", "read_bound_us"):
            assert key in row
        assert row["lq_weight_bytes"] * 8 <= row["fp32_weight_bytes"]
    info = machine.machine_info(target, limits)
    text = bench.markdown({"rows": [], "kernels": rows, "machine": info})
    assert "| 4 | 100→40 | W2A2 |" in text and "G popcount steps/s" in text
    assert info["isa"] in text and info["cpu"] in text


@pytest.mark.timing
@pytest.mark.parametrize("isa", machine.ISAS)
def test_no_limit_is_slower_than_an_achieved_kernel(isa):
    """The issue's invariant on whatever machine runs it: each bound <= the best achieved time of its kind."""
    if isa == "avx2" and not bench.tvm.target.codegen.target_has_features("avx2", bench.default_target()):
        pytest.skip("no AVX2 on this machine")
    target = machine.isa_target(isa)
    timing = Timing(number=3, repeat=3, min_repeat_ms=10)
    before = machine.machine_limits(target, timing, read_sizes=SIZES)
    rows = bench.kernel_rows(target, shapes=[(1024, 256)], rows=[1, 32], bits=[(2, 2), (1, 1)], timing=timing)
    limits = machine.best_limits(before, machine.machine_limits(target, timing, read_sizes=SIZES))
    for row in bench.add_bounds(rows, limits):
        where = f"M={row['M']} W{row['wbits']}A{row['abits']} on {machine.isa_name(target)}"
        lq_bound = max(row["popcount_bound_us"], row["read_bound_us"])
        assert lq_bound <= NOISE * row["lq_dense_us"], where
        numpy_same_isa = isa == "native" or machine.blas_core() not in AVX512_BLAS
        fp32 = min(row["fp32_tvm_us"], row["fp32_numpy_us"]) if numpy_same_isa else row["fp32_tvm_us"]
        assert max(row["fp32_fma_bound_us"], row["fp32_read_bound_us"]) <= NOISE * fp32, where


def test_markdown_rows_compare_with_the_float_row():
    rows = [
        {"wbits": 32, "abits": 32, "accuracy": 0.97, "size_bytes": 1000, "latency_us": 20.0},
        {"wbits": 2, "abits": 2, "accuracy": 0.965, "size_bytes": 70, "latency_us": 5.0},
    ]
    text = bench.markdown({"rows": rows, "kernels": []})
    assert "| fp32 | 97.00 % | +0.00 |" in text
    assert "| W2A2 | 96.50 % | -0.50 | 70 | 0.0700 | 5.0 |" in text
