import json
import re
import subprocess
import sys

import pytest
import tvm

from tvm_memplan.cli.main import main
from tvm_memplan.deploy import targets
from tvm_memplan.relax.layout import channel_block

from ..backends.conftest import device_ready
from ..shared_inputs import MINIMALLOC_CHALLENGING as CHALLENGING


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_plan_json_has_the_documented_keys_and_reaches_the_bound(capsys, small_onnx):
    code, out, _ = run_cli(capsys, "plan", small_onnx, "--json")
    assert code == 0
    report = json.loads(out)
    for key in (
        "model",
        "tensors",
        "naive_bytes",
        "tvm_default_bytes",
        "lower_bound_bytes",
        "arena_bytes",
        "plan_seconds",
        "verified",
    ):
        assert key in report
    assert report["verified"] is None
    assert report["lower_bound_bytes"] <= report["arena_bytes"] <= report["naive_bytes"]
    assert report["arena_bytes"] == report["lower_bound_bytes"]


def test_plan_verify_and_plot(capsys, small_onnx, tmp_path):
    picture = tmp_path / "layout.png"
    code, out, _ = run_cli(capsys, "plan", small_onnx, "--verify", "--plot", str(picture))
    assert code == 0
    assert "PASS" in out and "memplan arena" in out
    assert picture.stat().st_size > 10_000
    code, out, _ = run_cli(capsys, "plan", small_onnx, "--verify", "--json")
    report = json.loads(out)
    assert report["verified"] is True
    assert sorted(report["verify"]["vm_storage_bytes"]) == sorted(report["verify"]["planned_storage_bytes"])


@pytest.mark.parametrize(
    "content, message",
    [(None, "no such model file"), (b"not a protobuf at all", "not a valid ONNX model")],
)
def test_bad_model_files_give_one_line_and_exit_2(capsys, tmp_path, content, message):
    path = tmp_path / "model.onnx"
    if content is not None:
        path.write_bytes(content)
    code, out, err = run_cli(capsys, "plan", str(path))
    assert code == 2
    assert message in err and err.count("\n") == 1


def test_unsupported_operator_is_named(capsys, unsupported_onnx):
    code, _, err = run_cli(capsys, "plan", unsupported_onnx)
    assert code == 2 and "Det" in err and err.count("\n") == 1


def test_solve_reports_and_writes_offsets(capsys, tmp_path):
    problem = tmp_path / "p.csv"
    problem.write_text("id,lower,upper,size\n0,0,2,64\n1,1,3,128\n2,2,4,64\n3,3,5,128\n")
    out_csv = tmp_path / "offsets.csv"
    code, out, _ = run_cli(capsys, "solve", str(problem), "--json", "-o", str(out_csv))
    assert code == 0
    report = json.loads(out)
    assert report["arena_bytes"] == report["lower_bound_bytes"] == 192
    rows = out_csv.read_text().splitlines()
    assert rows[0] == "id,lower,upper,size,offset" and len(rows) == 5


@pytest.mark.parametrize(
    "content, message",
    [
        ("a,b,c\n1,2,3\n", "header"),
        ("id,lower,upper,size\n0,0,x,64\n", "integers"),
        ("id,lower,upper,size\n0,5,2,64\n", "lower < upper"),
    ],
)
def test_bad_csv_gives_one_line_and_exit_2(capsys, tmp_path, content, message):
    problem = tmp_path / "bad.csv"
    problem.write_text(content)
    code, _, err = run_cli(capsys, "solve", str(problem))
    assert code == 2 and message in err and err.count("\n") == 1


@pytest.mark.skipif(not CHALLENGING.exists(), reason="shared benchmarks not beside the checkout")
def test_solve_challenging_instance_stays_within_budget(capsys):
    code, out, _ = run_cli(capsys, "solve", str(CHALLENGING / "A.1048576.csv"), "--json", "--time-budget", "5")
    report = json.loads(out)
    assert code == 0 and report["lower_bound_bytes"] <= report["arena_bytes"]


def test_console_script_is_installed():
    result = subprocess.run([sys.executable, "-m", "tvm_memplan.cli.main", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "plan" in result.stdout


def test_plan_split_json_reports_peaks_latencies_and_the_front(capsys, tmp_path):
    cache = str(tmp_path / "latency.jsonl")
    # NCHW: the 30K are below NCHW's coarse arena (NCHW16c pads 8 channels to 16; the blocked split has its
    # own test in test_deploy.py)
    split_under_30k = ("plan", "zoo:mcu_cnn", "--split", "acg", "--memory-limit", "30K", "--split-cache", cache)
    split_under_30k += ("--layout", "nchw")
    code, out, err = run_cli(capsys, *split_under_30k, "--verify", "--json", "--order-seconds", "1")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["verified"] is True
    assert summary["peak_after_bytes"] <= 30 * 1024 < summary["peak_before_bytes"]
    assert summary["arena_bytes"] <= 30 * 1024
    assert summary["split_subgraphs"] and all(s["parts"] >= 2 for s in summary["split_subgraphs"])
    assert summary["latency_before_ms"] > 0 and summary["latency_after_ms"] > 0
    assert summary["pareto_front"][-1]["parts"] == {}  # the unsplit model is on the front
    # what limits the plan now, by operator and shape (the simulator's tensor names are kept too)
    assert len(summary["bottleneck_described"]) == len(summary["bottleneck"])
    assert all(" of " in d or "x" in d for d in summary["bottleneck_described"])
    assert any("conv2d" in d or "pool" in d for d in summary["bottleneck_described"])
    # the report (not JSON) prints the same search as tables
    plot = tmp_path / "tiles.png"
    refresh = "--refresh-confirmations"  # the chains' times come from the cache, the whole model's are timed again
    code, out, _ = run_cli(capsys, *split_under_30k, "--order-seconds", "1", "--plot", str(plot), refresh)
    assert code == 0 and "Pareto front" in out and "from the cache" in out
    assert "cached whole-model times timed again" in " ".join(out.split())  # (the table wraps it)
    assert plot.stat().st_size > 0  # the layout of the split plan: its tiles at their offsets


def test_plan_split_in_the_blocked_layout_fits_its_limit_in_one_search(capsys, monkeypatch, tmp_path):
    """The simulator sizes tensors as the blocked build pads them (8 channels take a block of 16 with
    AVX-512), so the split it fits under 34K plans within 34K: no search again under a lowered limit."""
    import tvm_memplan.cli.plan as plan_cli

    searched = []
    search = plan_cli._search_split
    monkeypatch.setattr(plan_cli, "_search_split", lambda *a: searched.append(a[2]) or search(*a))
    argv = ("plan", "zoo:mcu_cnn", "--split", "acg", "--memory-limit", "34K", "--layout", "blocked", "--json")
    code, out, err = run_cli(capsys, *argv, "--order-seconds", "1", "--split-cache", str(tmp_path / "c.jsonl"))
    assert code == 0, err
    summary = json.loads(out)
    assert searched == [34 * 1024]
    # the arena may sit a few percent above the split's liveness bound (the offsets depend on the order
    # the timed order search finds), but within the limit the search met
    assert summary["peak_after_bytes"] <= summary["arena_bytes"] <= 34 * 1024 < summary["peak_before_bytes"]


def test_plan_split_with_fused_tiles_verifies(capsys, tmp_path):
    """``--fused-tiles on``: the chains that can run as one kernel do, and the plan verifies."""
    code, out, err = run_cli(
        capsys,
        "plan",
        "zoo:mcu_cnn",
        "--split",
        "acg",
        "--memory-limit",
        "30K",
        "--fused-tiles",
        "on",
        "--layout",
        "nchw",  # the 30K are NCHW's (NCHW16c pads 8 channels to 16)
        "--split-cache",
        str(tmp_path / "latency.jsonl"),
        "--verify",
        "--json",
        "--order-seconds",
        "1",
    )
    assert code == 0, err
    summary = json.loads(out)
    assert summary["verified"] is True and summary["arena_bytes"] <= 30 * 1024
    # which chains the search keeps depends on its timings; every kept one that can be fused is
    # (spatial chains written in place, single-branch channel chains with a reducing tail)
    chosen = summary["split_subgraphs"]
    assert chosen and all(
        s["fused"]
        == (
            (s["kind"] == "spatial" and "gathered" not in s["chain"])
            or (s["kind"] == "temporal" and "branches" not in s["chain"])
        )
        for s in chosen
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--latency-budget", "-0.5"], "must not be negative"),
        (["--memory-limit", "1K"], "no split plan fits"),
    ],
)
def test_plan_split_bad_requests_give_one_line_and_exit_2(capsys, tmp_path, argv, message):
    code, _, err = run_cli(
        capsys, "plan", "zoo:mcu_cnn", "--split", "acg", "--split-cache", str(tmp_path / "c.jsonl"), *argv
    )
    assert code == 2 and message in err and err.count("\n") == 1
    if "--memory-limit" in argv:  # the smallest plan found, its cost, and what may reach the limit
        assert "the smallest found peaks at" in err and "latency (estimated); try" in err
        blocked = channel_block(tvm.target.Target.from_device("cpu")) is not None
        assert ("--layout nchw" in err) == blocked and "a larger --memory-limit" in err
        assert "--fused-tiles" not in err  # the default, auto, timed fused tiles already


def test_a_split_search_that_keeps_the_plan_unsplit_says_why_and_what_to_try(capsys, monkeypatch, tmp_path):
    """Every split over the latency budget (each chain's tiles timed at +20 % of the model, as a blocked
    MobileNetV2-0.35's missed 5 %): the report names the smallest plan found, its cost, and the options
    that would take a smaller plan; NCHW where the search ran blocked."""
    from tvm_memplan.deploy.chain_latency import ChainLatency

    monkeypatch.setattr(ChainLatency, "split_delta", lambda self, choice: 0.2 * self.unsplit_today(self.mod))
    # and so is each timing again of a decisive split (the search charges the median of three)
    monkeypatch.setattr(ChainLatency, "retime", lambda self, choice, attempt: 0.2 * self.unsplit_today(self.mod))
    argv = ("plan", "zoo:mcu_cnn", "--split", "acg", "--split-cache", str(tmp_path / "c.jsonl"), "--order-seconds", "1")
    code, out, err = run_cli(capsys, *argv, "--fused-tiles", "off", "--floor-guided", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["split_subgraphs"] == [] and summary["peak_after_bytes"] == summary["peak_before_bytes"]
    smallest, unsplit = summary["pareto_front"][0], summary["pareto_front"][-1]
    assert smallest["peak_bytes"] < unsplit["peak_bytes"] and unsplit["parts"] == {}
    advice = summary["split_advice"]
    assert advice.startswith("kept unsplit: the smallest plan found peaks at") and "+20.0% (estimated)" in advice
    assert re.search(r"--latency-budget 0\.21\b", advice)  # the next hundredth over +20 %: a budget that admits it
    assert ("--layout nchw" in advice) == summary["layout"].startswith("blocked")
    assert "--fused-tiles auto" in advice  # the search ran per kernel (asked for) on a float model
    # the simulator's floor, latency ignored, that the search was guided toward
    assert 0 < summary["peak_floor_bytes"] <= smallest["peak_bytes"]
    code, out, _ = run_cli(capsys, *argv, "--floor-guided")  # the text report: the same line in the split rows
    assert code == 0 and "smaller plan" in out and "kept unsplit: the smallest plan found" in " ".join(out.split())
    assert "simulated floor" in out


def test_plan_split_of_a_model_without_chains_keeps_the_plan(capsys, tmp_path):
    code, out, err = run_cli(
        capsys, "plan", "zoo:mlp", "--split", "acg", "--split-cache", str(tmp_path / "c.jsonl"), "--json"
    )
    assert code == 0, err
    summary = json.loads(out)
    assert summary["split_subgraphs"] == [] and "no chain to split" in summary["split_reason"]
    assert summary["peak_after_bytes"] == summary["peak_before_bytes"]
    # --layout auto blocks on AVX2/AVX-512, a split plan as the rest
    block = channel_block(tvm.target.Target.from_device("cpu"))
    assert summary["layout"] == ("nchw" if block is None else f"blocked (NCHW{block}c)")


def test_memory_limit_must_be_a_byte_count(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "zoo:mcu_cnn", "--split", "acg", "--memory-limit", "lots"])
    assert exit_info.value.code == 2
    assert "not a byte count" in capsys.readouterr().err


def test_an_internal_failure_is_one_line_and_exit_1(capsys, monkeypatch, small_onnx):
    import tvm_memplan.cli.plan as plan_cli

    def broken(*args, **kwargs):
        raise AssertionError("emit_te now only supports Tensor that has ShapeExpr shape")

    monkeypatch.setattr(plan_cli, "run_plan", broken)
    monkeypatch.delenv("TVM_MEMPLAN_TRACEBACK", raising=False)
    assert main(["plan", small_onnx]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "tvm-memplan: internal error (AssertionError): emit_te now only supports Tensor that has "
        "ShapeExpr shape (set TVM_MEMPLAN_TRACEBACK=1 for the traceback)"
    ]


def test_a_planned_arena_over_the_memory_limit_searches_again_then_fails_in_one_line(monkeypatch):
    """The simulator may fit a plan whose planned arena misses the limit: the search is repeated
    under a limit lowered by the overshoot, and a plan that still misses is an error, never a
    silent 'fits'."""
    import argparse

    import tvm_memplan.cli.plan as plan_cli
    import tvm_memplan.planner as planner
    from tvm_memplan.errors import UserError

    class Plan:
        def __init__(self, arena):
            self.arena = arena

        def total(self, key):
            return self.arena

    class Split:
        def prepare(self):
            return None

    limits = []
    monkeypatch.setattr(plan_cli, "_search_split", lambda args, model, limit: limits.append(limit) or Split())
    args = argparse.Namespace(memory_limit=1000, target="host")
    monkeypatch.setattr(plan_cli, "model_planner_kwargs", lambda a: {})
    model = argparse.Namespace(name="m")

    arenas = iter([900])
    monkeypatch.setattr(planner, "plan_model", lambda *a, **k: Plan(next(arenas)))
    plan, _ = plan_cli._fit_planned_arena(args, model, Plan(1250), Split())
    assert plan.arena == 900 and limits == [800]  # 1000 * 1000 / 1250

    limits.clear()
    arenas = iter([1100, 1050])
    monkeypatch.setattr(planner, "plan_model", lambda *a, **k: Plan(next(arenas)))
    with pytest.raises(UserError, match="planned arena is 1,050 bytes"):
        plan_cli._fit_planned_arena(args, model, Plan(1250), Split())
    assert limits == [800, 727]

    def nothing_fits(args, model, limit):
        raise UserError(f"m: no split plan fits in {limit:,} bytes")

    monkeypatch.setattr(plan_cli, "_search_split", nothing_fits)  # the lowered limit is explained
    explained = r"fits in 800 bytes \(searched under 800 bytes: .* planned an arena of 1,250\)"
    with pytest.raises(UserError, match=explained):
        plan_cli._fit_planned_arena(args, model, Plan(1250), Split())


@pytest.mark.parametrize("target", ["opencl", "vulkan"])
def test_plan_verify_runs_on_the_targets_device(capsys, target):
    """Both programs are built for the GPU target and run on its device (PoCL, lavapipe here): the
    outputs match stock TVM and onnxruntime, and the device's storage requests are the plan."""
    if not device_ready(target):
        pytest.skip(f"no {target} device: run tvm-memplan setup-gpu")
    code, out, err = run_cli(capsys, "plan", "zoo:mcu_cnn", "--verify", "--target", target, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["verified"] is True and report["target"] == target
    verify = report["verify"]
    assert verify["device"] == f"{target}:0" and verify["identical_to_stock"]
    assert verify["max_abs_diff_vs_onnxruntime"] < 1e-4
    assert sorted(verify["vm_storage_bytes"]) == sorted(verify["planned_storage_bytes"])
    assert verify["vm_storage_bytes"][0] == report["arena_bytes"]


@pytest.mark.parametrize("target", ["opencl", "vulkan"])
def test_plan_verify_without_the_runtime_says_to_run_setup_gpu(capsys, monkeypatch, target):
    monkeypatch.setattr(targets, "runtime_loaded", lambda device: False)
    code, _, err = run_cli(capsys, "plan", "zoo:mlp?hidden=16", "--verify", "--target", target)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "tvm-memplan setup-gpu" in err


def test_split_report_in_instructions_says_no_milliseconds():
    """The split rows and the front table read the unit-named fields of a device search (--device qemu-*)."""
    from tvm_memplan.cli.plan import _front_table, _split_rows

    summary = {
        "peak_before_bytes": 2048, "peak_after_bytes": 1024, "latency_unit": "instructions",
        "latency_before_instructions": 1_000_000, "latency_after_instructions": 1_048_000,
        "split_subgraphs": [{"chain": "lv..lv9", "parts": 2, "fused": False}], "split_candidates": 3,
        "search_seconds": 1.0, "plans_simulated": 5, "latency_measurements": 3, "latency_cache_hits": 1,
        "split_reason": "memory limit met", "bottleneck_described": [],
        "pareto_front": [{"peak_bytes": 1024, "latency_instructions": 1_048_000, "parts": {"lv..lv9": 2}}],
    }  # fmt: skip
    rows = dict(_split_rows(summary))
    assert rows["instructions (emulated core)"] == "1,000,000 -> 1,048,000  (+4.8%)"
    assert "instruction counts measured" in rows["split search"]
    table = _front_table(summary)
    assert [c.header for c in table.columns] == ["peak", "instructions", "chains (parts)"]
    assert list(table.columns[1].cells) == ["1,048,000"]
