"""The DefaultCPUSchedule pass in the pipeline: tuned kernels kept, ``schedule="none"`` honoured,
whole models still correct and still allocating exactly the plan."""

from __future__ import annotations

import pytest
import tvm
from tvm import tirx

from tvm_memplan.frontend import load_model
from tvm_memplan.options import MemplanOptions
from tvm_memplan.planner import plan_model
from tvm_memplan.relax.pipeline import schedule_passes
from tvm_memplan.schedule import DefaultCPUSchedule, ScheduleReport
from tvm_memplan.verify.check import verify_plan

from ..c_build import assert_c_build_matches_onnxruntime


def _prim_funcs(mod: tvm.IRModule) -> dict[str, tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}


@pytest.fixture(scope="module")
def mcu_plan():
    return plan_model(load_model("zoo:mcu_cnn"), order_seconds=1)


def test_every_kernel_of_a_model_is_scheduled_and_tuned_ones_are_kept(mcu_plan) -> None:
    staged = mcu_plan.planned
    tuned_name = next(name for name in _prim_funcs(staged) if "conv2d" in name)
    gvar = staged.get_global_var(tuned_name)
    tuned = staged[gvar].with_attr("tir.is_scheduled", True)  # as MetaScheduleApplyDatabase leaves it
    staged = tvm.IRModule({**dict(staged.functions), gvar: tuned}, attrs=staged.attrs)
    reports: list[ScheduleReport] = []
    scheduled = DefaultCPUSchedule(mcu_plan.target, reports.append)(staged)
    (report,) = reports
    assert report.kept == [tuned_name] and not report.unscheduled
    assert set(report.rules) | {tuned_name} == set(_prim_funcs(staged))
    tvm.ir.assert_structural_equal(scheduled[gvar], tuned)
    assert all(f.attrs.get("tir.is_scheduled") for f in _prim_funcs(scheduled).values())


def test_schedule_none_and_gpu_targets_add_no_pass() -> None:
    cpu = tvm.target.Target.from_device("cpu")
    assert len(schedule_passes(cpu, MemplanOptions())) == 1
    assert schedule_passes(cpu, MemplanOptions(schedule="none")) == []
    assert schedule_passes(tvm.target.Target({"kind": "cuda", "arch": "sm_75"}), MemplanOptions()) == []


def test_unknown_schedule_is_a_user_error() -> None:
    from tvm_memplan.errors import UserError

    with pytest.raises(UserError, match="unknown schedule"):
        MemplanOptions(schedule="fast")


@pytest.mark.parametrize("spec", ["zoo:mcu_cnn", "zoo:mobilenet_v2?width=0.35&resolution=96"])
def test_scheduled_models_match_onnxruntime_and_the_plan(spec: str) -> None:
    result = verify_plan(plan_model(load_model(spec), order_seconds=1))
    assert result.ok, result.problems
    assert result.max_abs_diff_vs_onnxruntime is not None and result.max_abs_diff_vs_onnxruntime < 1e-3


def test_scheduled_c_build_of_a_model_with_an_inplace_residual_is_correct(tmp_path) -> None:
    """Regression: a 1x1 conv whose input has the output's shape was planned in place; its
    scheduled tiles overwrote the input before later tiles read it."""
    model = load_model("zoo:mcu_cnn")
    plan = plan_model(model, tvm.target.Target({"kind": "c"}), order_seconds=1)
    assert_c_build_matches_onnxruntime(plan, model, tmp_path)
