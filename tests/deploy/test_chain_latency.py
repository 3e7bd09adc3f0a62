"""The measurer's cached whole-model times: confirmations and the unsplit cost are timed again when
they are stale against the unsplit model timed today (a verdict from a load spike) or on request, and
a confirmation within noise of the budget is timed on. Timings are stubbed: these are the cache's rules,
not the device's."""

import json

import pytest

from tvm_memplan.deploy import split as split_module
from tvm_memplan.deploy.chain_latency import ChainLatency
from tvm_memplan.deploy.measure import Device
from tvm_memplan.deploy.targets import get_target
from tvm_memplan.frontend import load_model, to_relax
from tvm_memplan.relax.split import find_chains, normalize
from tvm_memplan.split.search import Point, SearchResult
from tvm_memplan.split.simulate import SplitChoice


@pytest.fixture(scope="module")
def mcu_mod():
    return normalize(to_relax(load_model("zoo:mcu_cnn")))


class Stubbed(ChainLatency):
    """A measurer whose unsplit model takes ``today`` ms now and whose confirmations time ``rounds``
    rounds of ``repeat`` samples at ``today`` and ``today * (1 + slowdown)``, counted in ``timed``."""

    def __init__(self, mod, cache, today: float, slowdown: float = 0.01, **options) -> None:
        super().__init__(mod, get_target("host"), Device(), cache=cache, **options)
        self.now, self.slowdown, self.timed = today, slowdown, []

    def timer(self, mod):
        return lambda: [self.now] * self.repeat

    def compare(self, *modules, rounds: int = 3):
        self.timed.append(rounds)
        n = rounds * self.repeat
        return [self.now] * n, [self.now * (1 + self.slowdown)] * n


def _split(mod):
    return [SplitChoice(next(c for c in find_chains(mod) if c.tail), 2)]


def test_a_confirmation_is_reused_while_the_unsplit_model_times_the_same(mcu_mod, tmp_path):
    cache = tmp_path / "latency.jsonl"
    first = Stubbed(mcu_mod, cache, today=2.0)
    before, after = first.compare_split(mcu_mod, _split(mcu_mod))
    assert first.timed == [3] and len(before) == 3 * first.repeat
    again = Stubbed(mcu_mod, cache, today=2.2)  # 10 % slower: within the noise
    assert again.compare_split(mcu_mod, _split(mcu_mod)) == (before, after)
    assert again.timed == [] and again.stale == 0 and again.hits == 1


def test_a_confirmation_from_a_load_spike_is_timed_again_and_replaced(mcu_mod, tmp_path):
    cache = tmp_path / "latency.jsonl"
    spike = Stubbed(mcu_mod, cache, today=40.0)  # the unsplit model 20x slower than today
    spike.compare_split(mcu_mod, _split(mcu_mod))
    today = Stubbed(mcu_mod, cache, today=2.0)
    before, _ = today.compare_split(mcu_mod, _split(mcu_mod))
    assert today.timed == [3] and today.stale == 1 and set(before) == {2.0}
    # the log keeps both records; the later one is what a third search reads
    records = [json.loads(line) for line in cache.read_text().splitlines()]
    assert [r["before"][0] for r in records] == [40.0, 2.0]
    third = Stubbed(mcu_mod, cache, today=2.0)
    assert third.compare_split(mcu_mod, _split(mcu_mod))[0] == before and third.timed == []


def test_the_unsplit_cost_from_a_load_spike_is_replaced_by_todays(mcu_mod, tmp_path):
    cache = tmp_path / "latency.jsonl"
    assert Stubbed(mcu_mod, cache, today=40.0).model_cost(mcu_mod) == 40.0
    steady = Stubbed(mcu_mod, cache, today=45.0)
    assert steady.model_cost(mcu_mod) == 40.0 and steady.stale == 0  # within the noise: the cached cost
    today = Stubbed(mcu_mod, cache, today=2.0)
    assert today.model_cost(mcu_mod) == 2.0 and today.stale == 1
    assert Stubbed(mcu_mod, cache, today=2.1).model_cost(mcu_mod) == 2.0


def test_refresh_confirmations_times_every_whole_model_time_again(mcu_mod, tmp_path):
    cache = tmp_path / "latency.jsonl"
    Stubbed(mcu_mod, cache, today=2.0).compare_split(mcu_mod, _split(mcu_mod))
    refreshed = Stubbed(mcu_mod, cache, today=2.0, refresh_confirmations=True)
    refreshed.model_cost(mcu_mod)
    refreshed.compare_split(mcu_mod, _split(mcu_mod))
    assert refreshed.timed == [3] and refreshed.stale == 1  # the cost was not cached: only the confirmation
    assert refreshed.misses == 2 and refreshed.hits == 0


def test_a_confirmation_asked_for_more_rounds_times_only_the_rounds_it_lacks(mcu_mod, tmp_path):
    cache = tmp_path / "latency.jsonl"
    measurer = Stubbed(mcu_mod, cache, today=2.0)
    measurer.compare_split(mcu_mod, _split(mcu_mod))
    before, _ = measurer.compare_split(mcu_mod, _split(mcu_mod), rounds=6)
    assert measurer.timed == [3, 3] and len(before) == 6 * measurer.repeat
    reread = Stubbed(mcu_mod, cache, today=2.0)
    assert reread.compare_split(mcu_mod, _split(mcu_mod), rounds=6)[0] == before and reread.timed == []


class NoisyTimer:
    """Confirmations of one plan whose samples spread over far more than the budget: the unsplit model's
    fastest run takes 1 ms, the split model's ``1 + slow`` ms, half of each side's runs 10 to 20 % more."""

    round_samples = 2

    def __init__(self, slow: float) -> None:
        self.slow, self.asked = slow, []

    def compare_split(self, mod, choices, rounds: int = 3):
        self.asked.append(rounds)
        return [1.0, 1.1] * rounds, [1.0 + self.slow, 1.2] * rounds


def _one_point_result():
    from tvm_memplan.split.simulate import Branch, Chain

    chain = Chain((Branch("c", (), 8, 8),), None, (), None, 100)
    original, split = Point((), 1000, 1.0), Point((SplitChoice(chain, 2),), 500, 1.04)
    return SearchResult(split, original, [split, original], 1, 1, 0.1, "done")


@pytest.mark.parametrize("slow, kept", [(0.02, True), (0.08, False)])
def test_a_confirmation_within_noise_of_the_budget_is_timed_on(slow, kept):
    """The first confirmation is within its noise of the budget: it is timed on (6, then 9 rounds) and
    judged on all its samples."""
    timer = NoisyTimer(slow)
    _, after, result = split_module._confirm("model", _one_point_result(), timer, budget=0.05)
    assert timer.asked == [3, 6, 9] and len(after) == 2 * 9
    assert bool(result.best.choices) is kept


def test_a_confirmation_clear_of_the_budget_is_judged_at_once():
    class Clear:
        asked: list[int] = []
        round_samples = 3

        def compare_split(self, mod, choices, rounds: int = 3):
            self.asked.append(rounds)
            return [1.0, 1.01, 0.99] * rounds, [1.2, 1.21, 1.19] * rounds

    _, _, result = split_module._confirm("model", _one_point_result(), Clear(), budget=0.05)
    assert Clear.asked == [3] and not result.best.choices


class Drifting(Stubbed):
    """Each side-by-side timing of a chain reads 0.1 ms more than the one before (``timed`` counts them)."""

    def compare(self, *modules, rounds: int = 3):
        self.timed.append(rounds)
        n = rounds * self.repeat
        return [1.0] * n, [1.0 + 0.1 * len(self.timed)] * n


def test_a_split_timed_again_is_a_new_timing_cached_per_attempt(mcu_mod, tmp_path):
    """The search takes the median of a decisive split's timings: each attempt is timed anew once, and a
    second search with the same cache reads the same ones without timing."""
    cache = tmp_path / "latency.jsonl"
    (choice,) = _split(mcu_mod)
    first = Drifting(mcu_mod, cache, today=1.0)
    timings = [first.split_delta(choice), first.retime(choice, 1), first.retime(choice, 2)]
    assert timings == pytest.approx([0.1, 0.2, 0.3]) and len(first.timed) == 3
    assert first.retime(choice, 1) == timings[1] and len(first.timed) == 3
    again = Drifting(mcu_mod, cache, today=1.0)
    assert [again.split_delta(choice), again.retime(choice, 1), again.retime(choice, 2)] == timings
    assert again.timed == []


def test_the_unsplit_model_is_timed_in_rounds_and_its_fastest_taken(mcu_mod, tmp_path):
    """One round caught in a load spike does not widen the search's budget."""
    rounds = iter([[9.0, 8.0], [2.0, 2.5], [7.0, 3.0]])

    class Spiky(Stubbed):
        def timer(self, mod):
            return lambda: next(rounds)

    measurer = Spiky(mcu_mod, None, today=0.0)
    assert measurer.unsplit_today(mcu_mod) == 2.0 and next(rounds, None) is None
