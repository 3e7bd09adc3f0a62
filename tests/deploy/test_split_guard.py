"""The split search keeps a plan only when the planner's arena for it is below the unsplit model's,
and its simulator reads the model in the order the planner runs it (BERT-tiny's attention)."""

import pytest

from tvm_memplan.deploy import split as split_module
from tvm_memplan.frontend import load_model
from tvm_memplan.planner import plan_model
from tvm_memplan.relax.split import program_of
from tvm_memplan.split.simulate import SplitChoice


class TilesCost:
    """Latencies without a device: the whole model 1 ms, each tile of a split chain ``per_tile`` ms
    more (0.01: a 5 % budget allows four tiles on a chain, what the measured BERT-tiny search kept)."""

    hits = misses = stale = 0
    per_tile = 0.01
    round_samples = 1

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __call__(self, chain, parts: int) -> float:
        return self.per_tile * parts

    def choice(self, chain, parts: int) -> SplitChoice:
        return SplitChoice(chain, parts)

    def model_cost(self, mod) -> float:
        return 1.0

    def compare_split(self, mod, choices) -> tuple[list[float], list[float]]:
        return [1.0], [1.0]


@pytest.fixture(scope="module")
def bert():
    return load_model("zoo:bert_tiny")


def _search(monkeypatch, model, per_tile: float = 0.01):
    monkeypatch.setattr(TilesCost, "per_tile", per_tile)
    monkeypatch.setattr(split_module, "ChainLatency", TilesCost)
    return split_module.search_split(model, budget=0.05, seconds=10, cache=None, plan_options={"order_seconds": 2})


def test_a_split_plan_the_planner_finds_larger_is_not_kept(monkeypatch, bert):
    """The simulator as it was (program order): splitting the attention into four row tiles looks
    like a lower peak, but the planner's arena for it is above the unsplit one. The coarse plan is
    kept and the reason says so."""
    monkeypatch.setattr(split_module, "memory_order", lambda mod, *_: [s.name for s in program_of(mod).steps])
    outcome = _search(monkeypatch, bert)
    assert outcome.result.original.peak_bytes > outcome.coarse_arena_bytes  # the stale estimate
    assert not outcome.choices and "not below the coarse plan's" in outcome.result.stopped
    assert outcome.arena_bytes == outcome.coarse_arena_bytes


@pytest.mark.parametrize("per_tile", [0.01, 0.001])
def test_the_kept_plan_is_never_larger_than_the_coarse_one(monkeypatch, bert, per_tile):
    """The simulator in the planner's order: the coarse estimate is the planned arena, and the plan
    kept (unsplit at 0.01 ms a tile, row tiles at 0.001 ms) is planned no larger than the coarse one."""
    outcome = _search(monkeypatch, bert, per_tile)
    assert bool(outcome.choices) == (per_tile < 0.01)
    coarse = plan_model(bert, order_seconds=2).total("arena_bytes")
    assert outcome.coarse_arena_bytes == coarse == outcome.result.original.peak_bytes
    kept = plan_model(bert, prepare=outcome.prepare(), order_seconds=2).total("arena_bytes")
    assert kept == outcome.arena_bytes
    assert kept < coarse if outcome.choices else kept == coarse
