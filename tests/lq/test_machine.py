"""The machine's limits: the read bound per working-set level, the fastest of repeated probes, ISA names."""

from __future__ import annotations

import pytest

from tvm_memplan.errors import UserError
from tvm_memplan.lq import machine
from tvm_memplan.lq.calibrate import default_target


def test_read_bound_uses_the_working_set_level():
    curve = {16 << 10: 200e9, 1 << 20: 100e9, 64 << 20: 20e9, 256 << 20: 25e9}
    assert machine.read_time_bound(1 << 10, curve) == pytest.approx((1 << 10) / 200e9)
    assert machine.read_time_bound(4 << 20, curve) == pytest.approx((4 << 20) / 100e9)
    # noise made 256 MB faster than 64 MB: a larger working set is never faster, so 64 MB gets 25 GB/s
    assert machine.read_time_bound(100 << 20, curve) == pytest.approx((100 << 20) / 25e9)


def test_best_limits_keeps_the_fastest_measurement():
    slow = {"popcount_steps_per_s": 1.0, "fma_per_s": 4.0, "read_bytes_per_s": {16: 5.0, 64: 1.0}, "cpu": "x"}
    fast = {"popcount_steps_per_s": 2.0, "fma_per_s": 3.0, "read_bytes_per_s": {16: 4.0, 64: 2.0}, "cpu": "x"}
    best = machine.best_limits(slow, fast)
    assert (best["popcount_steps_per_s"], best["fma_per_s"], best["read_bytes_per_s"]) == (2.0, 4.0, {16: 5.0, 64: 2.0})
    assert best["cpu"] == "x"


def test_isa_names_and_a_bad_isa():
    assert machine.isa_name(default_target()) in ("AVX-512 (VPOPCNTDQ)", "AVX2", "NEON", "x86-64 (SSE)")
    with pytest.raises(UserError, match="--isa must be one of"):
        machine.isa_target("sse9")
    assert machine.cpu_name()
