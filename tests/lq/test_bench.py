"""Benchmark plumbing on small shapes: the kernel rows' fields and the Markdown tables (no timing assertions)."""

from __future__ import annotations

from tvm_memplan.lq import bench

QUICK = bench.Timing(number=1, repeat=1, min_repeat_ms=1)


def test_kernel_rows_have_the_issue_fields_and_bounds():
    target = bench.default_target()
    limits = bench.machine_limits(target, QUICK, dram_bytes=1 << 22, l3_bytes=1 << 20)
    assert all(value > 0 for value in limits.values())
    rows = bench.kernel_rows(target, shapes=[(100, 40)], rows=[1, 4], bits=[(2, 2)], timing=QUICK, limits=limits)
    assert [(r["M"], r["N"], r["O"]) for r in rows] == [(1, 100, 40), (4, 100, 40)]
    for row in rows:
        for key in ("wbits", "abits", "lq_us", "fp32_tvm_us", "fp32_numpy_us", "popcount_bound_us", "dram_bound_us"):
            assert key in row
        assert row["lq_weight_bytes"] * 8 <= row["fp32_weight_bytes"]
    text = bench.markdown({"rows": [], "kernels": rows, "machine": {"threads": 1, "target": "t", **limits}})
    assert "| 4 | 100→40 | W2A2 |" in text and "G popcount steps/s" in text


def test_markdown_rows_compare_with_the_float_row():
    rows = [
        {"wbits": 32, "abits": 32, "accuracy": 0.97, "size_bytes": 1000, "latency_us": 20.0},
        {"wbits": 2, "abits": 2, "accuracy": 0.965, "size_bytes": 70, "latency_us": 5.0},
    ]
    text = bench.markdown({"rows": rows, "kernels": []})
    assert "| fp32 | 97.00 % | +0.00 |" in text
    assert "| W2A2 | 96.50 % | -0.50 | 70 | 0.0700 | 5.0 |" in text
