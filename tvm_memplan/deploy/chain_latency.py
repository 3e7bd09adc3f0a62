"""The measurer of fine-grained splitting: latency of a chain before and after splitting, cached on disk.

A chain is compiled alone (its outside tensors as inputs) with the same pipeline and default
schedules as the whole model, run here or on an RPC device, and timed with the VM's
``time_evaluator``. Measurements are keyed by what the latency depends on: the chain's
operators, attributes and shapes (not its weights or names), the number of parts, the target
and the device. Identical blocks of a network (and a second search of the same model) reuse
them; the cache is an append-only JSON-lines log that a crash cannot corrupt.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from ..errors import UserError
from ..paths import cache_dir
from ..relax.split import chain_module, chain_signature, split_chains
from ..schedule.cpu import cpu_spec
from ..split.chain import FUSED_TILES, Chain, SplitChoice
from .measure import Device
from .results import ResultsLog
from .targets import DeployTarget


def default_cache() -> Path:
    """The user's latency cache: ``$XDG_CACHE_HOME/tvm_memplan/chain_latency.jsonl`` on Linux."""
    return cache_dir() / "chain_latency.jsonl"


DEFAULT_CACHE = default_cache()


class ChainLatency:
    """``ChainLatency(mod, target, device)(chain, parts)`` → measured ms added by the split (with
    ``fused_tiles``: of the fused tiles, or of the faster of fused and per-kernel tiles)."""

    def __init__(
        self,
        mod: tvm.IRModule,
        target: DeployTarget,
        device: Device,
        cache: Path | None = DEFAULT_CACHE,
        repeat: int = 5,
        min_repeat_ms: int = 20,
        schedule: str = "default",
        fused_tiles: str = "off",
    ) -> None:
        if fused_tiles not in FUSED_TILES:
            raise UserError(f"unknown fused tiles setting {fused_tiles!r}; choose one of {', '.join(FUSED_TILES)}")
        self.fused_tiles = fused_tiles
        self.fused: dict[tuple[Chain, int], bool] = {}
        """(chain, parts) → whether its tiles run as one kernel (what was measured)."""
        self.mod, self.target, self.device = mod, target, device
        self.workers = self._workers()
        """Threads the fused tiles of a spatial chain run on (the target's cores)."""
        self.repeat, self.min_repeat_ms, self.schedule = repeat, min_repeat_ms, schedule
        self.log = ResultsLog(cache) if cache is not None else None
        self.known: dict[str, float] = {}
        if self.log is not None:
            for record in self.log.records():
                self.known[record["key"]] = record["ms"]
        self.hits = self.misses = 0
        self.timers: dict[str, object] = {}

    def __call__(self, chain: Chain, parts: int) -> float:
        alone = chain_module(self.mod, chain)
        wanted = {"off": [False], "on": [True], "auto": [False, True]}[self.fused_tiles]
        variants = [fused for fused in wanted if chain.fusable or not fused] or [False]
        times = {
            fused: self.time_ms(split_chains(alone, [SplitChoice(chain, parts, fused, self.workers)]), f"split{parts}")
            for fused in variants
        }
        fused = min(times, key=times.get)
        self.fused[(chain, parts)] = fused
        return times[fused] - self.time_ms(alone, "whole")

    def choice(self, chain: Chain, parts: int) -> SplitChoice:
        """The split of ``chain`` into ``parts`` as measured: fused where that was chosen."""
        return SplitChoice(chain, parts, self.fused.get((chain, parts), False), self.workers)

    def _workers(self) -> int:
        target = self.target.tvm_target()
        return cpu_spec(target).threads if target.kind.name == "llvm" else 1  # C code has no thread pool

    def time_ms(self, mod: tvm.IRModule, variant: str) -> float:
        key = "|".join((chain_signature(mod), variant, self.target.name, self.device.name, self.schedule))
        if key in self.known:
            self.hits += 1
            return self.known[key]
        self.misses += 1
        ms = self._measure(mod)
        self.known[key] = ms
        if self.log is not None:
            self.log.append({"key": key, "ms": ms})
        return ms

    def _measure(self, mod: tvm.IRModule) -> float:
        return float(np.median(self.timer(mod)()))

    def timer(self, mod: tvm.IRModule):
        """A callable returning ``repeat`` timings (ms) of ``mod`` on the device (compiled once
        per module and measurer)."""
        key = chain_signature(mod)
        if key not in self.timers:
            self.timers[key] = self._compile(mod)
        return self.timers[key]

    def compare(self, *modules: tvm.IRModule, rounds: int = 3) -> list[list[float]]:
        """Timings (ms) of each module in interleaved rounds (not cached): drift on a busy
        machine hits all alike."""
        timers = [self.timer(mod) for mod in modules]
        samples: list[list[float]] = [[] for _ in modules]
        for _ in range(rounds):
            for timer, into in zip(timers, samples, strict=True):
                into.extend(timer())
        return samples

    def _compile(self, mod: tvm.IRModule):
        from ..relax.pipeline import pipeline

        target = self.target.tvm_target()
        with target:
            executable = tvm.compile(
                mod, target, relax_pipeline=pipeline(target, order="program", schedule=self.schedule, layout="nchw")
            )
        session = self.device.session
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / "chain.so"
            self.target.export(executable, str(path))
            remote_name = f"chain-{uuid.uuid4().hex[:8]}.so"
            session.upload(str(path), remote_name)
        dev = session.device(self.target.device, 0)
        vm = relax.VirtualMachine(session.load_module(remote_name), dev)
        rng = np.random.default_rng(0)
        args = [
            tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.ty.shape.values]).astype(str(p.ty.dtype)), dev)
            for p in mod["main"].params
        ]
        evaluator = vm.time_evaluator("main", dev, number=1, repeat=self.repeat, min_repeat_ms=self.min_repeat_ms)
        return lambda: [float(r) * 1e3 for r in evaluator(*args).results]
