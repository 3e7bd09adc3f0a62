"""``measure`` and ``rpc-local`` from a user's directory: nothing written there unless asked, one JSON shape,
caches in the user's cache folder, no suggestion of a file the installed package lacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tvm_memplan.deploy.results import ResultsLog

from ..shared_inputs import REPO
from .test_plan import run_cli

MODEL = "zoo:mlp?hidden=16"
FAST = ("--repeat", "2", "--min-repeat-ms", "1")


def test_measure_writes_nothing_without_log_and_has_one_json_shape(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "measure", MODEL, *FAST, "--json")
    assert code == 0, err
    single = json.loads(out)
    assert list(tmp_path.iterdir()) == []  # no results/ folder, no lock file
    code, out, err = run_cli(capsys, "measure", MODEL, *FAST, "--compare", "--json", "--log", "log.jsonl")
    assert code == 0, err
    compared = json.loads(out)
    assert set(single) == {"memplan"} and set(compared) == {"stock", "memplan"}
    assert set(single["memplan"]) == set(compared["memplan"]) == set(compared["stock"])
    assert [r["pipeline"] for r in ResultsLog(tmp_path / "log.jsonl").records()] == ["stock", "memplan"]


def test_the_split_latency_cache_follows_xdg_cache_home(tmp_path):
    probe = (
        "from tvm_memplan.deploy.chain_latency import DEFAULT_CACHE, default_cache; "
        "print(DEFAULT_CACHE, default_cache())"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    printed = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert printed.split() == [str(tmp_path / "tvm_memplan" / "chain_latency.jsonl")] * 2


def test_rpc_local_suggests_only_commands_that_are_installed(capsys):
    code, out, err = run_cli(capsys, "rpc-local", "--servers", "0", "--lifetime", "0.1", "--port", "9390")
    assert code == 0, err
    assert "tvm-memplan measure MODEL --rpc-tracker" in out and "scripts/" not in out


def test_measure_runs_the_blocked_layout_as_planned(capsys):
    launches = {}
    for layout in ("nchw", "blocked"):
        code, out, err = run_cli(capsys, "measure", "zoo:mcu_cnn", *FAST, "--layout", layout, "--json")
        assert code == 0, err
        result = json.loads(out)["memplan"]
        assert result["correct"] and result["requested_bytes"] == result["planned_bytes"]
        launches[layout] = result["launches"]
    # channels padded to whole blocks: the only transforms are at the network's edges (the stem reads NCHW1c, a view)
    assert launches["nchw"] <= launches["blocked"] <= launches["nchw"] + 2


def test_split_plans_in_the_blocked_layout(capsys, tmp_path):
    cache = str(tmp_path / "c.jsonl")
    argv = ("plan", "zoo:mcu_cnn", "--split", "acg", "--layout", "blocked", "--split-cache", cache)
    # 60K: below the blocked coarse arena (80K with its 8-channel tensors padded to blocks), above NCHW's (40K)
    limits = ("--memory-limit", "60K", "--search-seconds", "10", "--order-seconds", "1")
    code, out, err = run_cli(capsys, *argv, *limits, "--verify", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["layout"].startswith("blocked (NCHW") and summary["split_subgraphs"]
    assert summary["arena_bytes"] <= 60 * 1024 and summary["verified"]


def test_build_says_why_its_split_search_kept_the_plan_unsplit(capsys, monkeypatch, tmp_path):
    """``build --split acg`` prints the split search's advice (as ``plan``) when every split missed the budget."""
    from tvm_memplan.deploy.chain_latency import ChainLatency

    monkeypatch.setattr(ChainLatency, "split_delta", lambda self, choice: 0.2 * self.unsplit_today(self.mod))
    # a decisive timing is timed again (the search's median of three): those timings cost as much
    monkeypatch.setattr(ChainLatency, "retime", lambda self, choice, attempt: 0.2 * self.unsplit_today(self.mod))
    split = ("--split", "acg", "--split-cache", str(tmp_path / "c.jsonl"), "--order-seconds", "1")
    code, out, err = run_cli(capsys, "build", "zoo:mcu_cnn", "-o", str(tmp_path / "mcu_cnn.so"), *split)
    assert code == 0, err
    assert "kept unsplit: the smallest plan found" in " ".join(out.split())
