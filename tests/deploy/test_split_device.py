"""``--split acg --device qemu-cortex-m7``: the split search counts each candidate's instructions on the
emulated core (the int8 model as standalone C with and without the split, ``-icount``), caches them by
chain signature, and a second search with the same cache measures nothing and keeps the same plan."""

from __future__ import annotations

from pathlib import Path

from tvm_memplan.deploy.chain_latency import DeviceInstructions
from tvm_memplan.frontend import load_model, to_relax
from tvm_memplan.relax.split import find_chains, normalize, split_chains
from tvm_memplan.split.chain import SplitChoice

from .conftest import SPLIT_LIMIT, needs_arm, run_cli, run_cli_json


def _plan(capsys, model: Path, cache: Path) -> dict:
    return run_cli_json(
        capsys, "plan", str(model), "--target", "cortex-m7", "--order-seconds", "1", "--split", "acg",
        "--memory-limit", str(SPLIT_LIMIT), "--search-seconds", "30", "--split-cache", str(cache),
        "--device", "qemu-cortex-m7",
    )  # fmt: skip


@needs_arm
def test_device_search_counts_instructions_and_reuses_its_cache(capsys, int8_model, tmp_path):
    cache = tmp_path / "cache.jsonl"
    first = _plan(capsys, int8_model, cache)
    assert first["latency_unit"] == "instructions" and first["latency_measurements"] > 0
    assert first["split_subgraphs"] and first["arena_bytes"] <= SPLIT_LIMIT
    # instruction counts are exact: the chains' counts add up to the whole program's with the split
    counts = [first[f"latency_{k}_instructions"] for k in ("before", "after", "estimated")]
    assert all(isinstance(c, int) for c in counts) and counts[1] == counts[2] > counts[0]
    # no field says milliseconds where it holds instructions
    assert not [key for key in first if key.endswith("_ms")]
    assert all("latency_instructions" in point for point in first["pareto_front"])
    again = _plan(capsys, int8_model, cache)
    assert again["latency_measurements"] == 0 and again["latency_cache_hits"] > 0
    same = ("split_subgraphs", "arena_bytes", "latency_before_instructions", "latency_after_instructions")
    assert {k: again[k] for k in same} == {k: first[k] for k in same}


@needs_arm
def test_build_json_reports_the_device_search_in_instructions(capsys, int8_model, tmp_path):
    summary = run_cli_json(
        capsys, "build", str(int8_model), "--target", "cortex-m7", "--emit-c", str(tmp_path / "c"),
        "--order-seconds", "1", "--split", "acg", "--memory-limit", str(SPLIT_LIMIT), "--search-seconds", "30",
        "--split-cache", str(tmp_path / "cache.jsonl"), "--device", "qemu-cortex-m7",
    )  # fmt: skip
    search = summary["split_search"]
    assert search["latency_unit"] == "instructions" and search["split_subgraphs"]
    assert search["latency_after_instructions"] > search["latency_before_instructions"] > 0
    assert not [key for key in search if key.endswith("_ms")]


@needs_arm
def test_more_tiles_cost_more_instructions_and_a_line_buffer_fewer(int8_model, tmp_path):
    """Each tile repeats its halo rows and its kernel calls: on the core, 4 tiles cost more than 2; tiles that
    keep a line buffer recompute no halo and cost fewer, and the measurer offers and keeps them."""
    mod = normalize(to_relax(load_model(str(int8_model))))
    chain = next(c for c in find_chains(mod) if not c.gathered and c.kind == "spatial")
    measurer = DeviceInstructions(
        mod,
        str(int8_model),
        "qemu-cortex-m7",
        lambda choices: lambda m: split_chains(normalize(m), choices),
        cache=tmp_path / "cache.jsonl",
    )
    two, four = (measurer.split_delta(SplitChoice(chain, parts)) for parts in (2, 4))
    assert 0 < two < four
    assert measurer.misses == 5  # the unsplit program, two split programs, two chain costs
    rolling = SplitChoice(chain, 4, rolling=True)
    assert measurer.splits(chain, 4) == [SplitChoice(chain, 4), rolling]
    assert measurer.split_delta(rolling) < four
    assert measurer(chain, 4) == measurer.split_delta(rolling) and measurer.choice(chain, 4) == rolling
    assert measurer.misses == 7


def test_device_needs_its_core_as_target(capsys, int8_model):
    code, _, err = run_cli(
        capsys, "plan", str(int8_model), "--split", "acg", "--memory-limit", str(SPLIT_LIMIT),
        "--device", "qemu-cortex-m4",
    )  # fmt: skip
    assert code != 0 and "--target cortex-m4" in err and len(err.strip().splitlines()) == 1


def test_missing_arm_tools_is_one_line(capsys, int8_model, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    code, _, err = run_cli(
        capsys, "build", str(int8_model), "--target", "cortex-m7", "--emit-c", "unused", "--split", "acg",
        "--device", "qemu-cortex-m7",
    )  # fmt: skip
    assert code != 0 and "qemu-system-arm" in err and len(err.strip().splitlines()) == 1
