import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_memplan
from tvm_memplan.relax import ARENA_PASS_NAME, REORDER_PASS_NAME
from tvm_memplan.verify import run_vm

from .modules import chain_with_view, dynamic_batch, random_input, two_functions


def compile_both(mod, target, **options):
    reports = []
    planned = tvm.compile(mod, target, relax_pipeline=tvm_memplan.pipeline(target, on_report=reports.append, **options))
    stock = tvm.compile(mod, target, relax_pipeline=relax.get_default_pipeline(target))
    return planned, stock, reports


def test_view_regression_outputs_match_stock(target):
    planned, stock, reports = compile_both(chain_with_view(), target)
    x = random_input((64, 64))
    out, trace = run_vm(planned, [x])
    ref, _ = run_vm(stock, [x])
    np.testing.assert_array_equal(out[0], ref[0])
    (report,) = reports
    assert report.arena_bytes == report.lower_bound_bytes
    # The VM asks for the arena and the output, nothing else.
    assert sorted(trace.storage_bytes) == sorted([report.arena_bytes, out[0].nbytes])


def test_every_function_gets_an_arena(target):
    planned, stock, reports = compile_both(two_functions(), target)
    assert {r.function for r in reports} == {"main", "second"}
    x = random_input((4, 32))
    for report in reports:
        out, trace = run_vm(planned, [x], function=report.function)
        ref, _ = run_vm(stock, [x], function=report.function)
        np.testing.assert_array_equal(out[0], ref[0])
        assert report.arena_bytes in trace.storage_bytes


def test_dynamic_shapes_fall_back_to_spbm_and_run(target):
    planned, stock, reports = compile_both(dynamic_batch(), target)
    x, w = random_input((3, 16)), random_input((16, 16), seed=1)
    out, trace = run_vm(planned, [x, w])
    ref, _ = run_vm(stock, [x, w])
    np.testing.assert_array_equal(out[0], ref[0])
    assert reports[0].tensors >= 2 and reports[0].arena_bytes in trace.storage_bytes


def test_offsets_are_aligned_and_alignment_option_applies(target):
    _, _, reports = compile_both(two_functions(), target, alignment=256)
    for report in reports:
        for arena in report.arenas:
            assert all(t["offset"] % 256 == 0 for t in arena["tensors"])


def test_scoped_config_reaches_the_pass(target):
    reports = []
    with tvm_memplan.config(alignment=128):
        tvm.compile(two_functions(), target, relax_pipeline=tvm_memplan.pipeline(target, on_report=reports.append))
    assert all(r.alignment == 128 for r in reports)


def test_disabled_pass_falls_back_to_stock_planning(target):
    reports = []
    with tvm.transform.PassContext(disabled_pass=[ARENA_PASS_NAME, REORDER_PASS_NAME]):
        pipeline = tvm_memplan.pipeline(target, on_report=reports.append)
        exe = tvm.compile(two_functions(), target, relax_pipeline=pipeline)
    assert reports == []
    out, _ = run_vm(exe, [random_input((4, 32))])
    assert out[0].shape == (4,)


def test_unknown_option_is_a_user_error(target):
    with pytest.raises(tvm_memplan.errors.UserError, match="unknown tvm_memplan option"):
        tvm_memplan.pipeline(target, colour="blue")
