"""The measurer of fine-grained splitting: latency of a chain before and after splitting, cached on disk.

A chain is compiled alone (its outside tensors as inputs) with the same pipeline and default
schedules as the whole model, run here or on an RPC device, and timed with the VM's
``time_evaluator``. Measurements are keyed by what the latency depends on: the chain's
operators, attributes and shapes (not its weights or names), the number of parts, the target,
the device and the activation layout (a chain times as the model is built: in NCHW[x]c where the
target's layout is blocked). Identical blocks of a network (and a second search of the same model) reuse
them; the cache is an append-only JSON-lines log that a crash cannot corrupt.

On an emulated microcontroller (:class:`DeviceInstructions`, ``--device qemu-cortex-m7``) the cost is
instead the instructions the core retires: the model is written as standalone C with the candidate
split (``build --emit-c``, the int8 C kernels of a QDQ model included, as the full build compiles it),
run under ``qemu-system-arm -icount shift=0``, and the chain's cost is the whole program's difference
with and without the split, which ``-icount`` makes exact and repeatable.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..errors import UserError
from ..paths import cache_dir
from ..relax.layout import layout_block
from ..relax.split import chain_module, chain_signature, split_chains
from ..relax.split.spatial_chains import SPATIAL_WINDOWS
from ..schedule.cpu import cpu_spec
from ..split.chain import FUSED_TILES, Chain, SpatialChain, SplitChoice
from .measure import Device
from .results import ResultsLog
from .standalone import DEVICES
from .targets import DeployTarget


def default_cache() -> Path:
    """The user's latency cache: ``$XDG_CACHE_HOME/tvm_memplan/chain_latency.jsonl`` on Linux."""
    return cache_dir() / "chain_latency.jsonl"


DEFAULT_CACHE = default_cache()

STALE_RATIO = 1.0
"""A cached whole-model time (the unsplit model's cost, a confirmation's samples) is measured again when the
unsplit model timed now is more than ``1 + STALE_RATIO`` times faster or slower than the time it was read
against: a verdict timed during a load spike (the unsplit model 20x slower than on a quiet machine) says
nothing about today. Not less: at load 3 to 4 on the 2-core development VM the unsplit model's median
swung 2.2x between one timing and the next (zoo:mcu_cnn, 16 to 36 µs), and every such swing would
drop the cache."""


class ChainLatency:
    """``ChainLatency(mod, target, device)(chain, parts)`` → measured ms added by the split (with
    ``fused_tiles``: of the fused tiles, or of the faster of fused and per-kernel tiles)."""

    TODAY_ROUNDS = 3
    """Rounds of ``repeat`` runs the unsplit model is timed in (:meth:`unsplit_today`): one round caught
    in a load spike would widen the budget of the whole search."""

    def __init__(
        self,
        mod: tvm.IRModule,
        target: DeployTarget,
        device: Device,
        cache: Path | None = DEFAULT_CACHE,
        repeat: int = 25,
        min_repeat_ms: int = 0,
        schedule: str = "default",
        fused_tiles: str = "off",
        refresh_confirmations: bool = False,
        stale_ratio: float = STALE_RATIO,
        layout: str = "nchw",
    ) -> None:
        if fused_tiles not in FUSED_TILES:
            raise UserError(f"unknown fused tiles setting {fused_tiles!r}; choose one of {', '.join(FUSED_TILES)}")
        self.fused_tiles = fused_tiles
        self.chosen: dict[tuple[Chain, int], SplitChoice] = {}
        """(chain, parts) → the fastest way its tiles ran when ``self(chain, parts)`` measured them."""
        self.mod, self.target, self.device = mod, target, device
        self.layout = layout
        """The activation layout chains and models are built and timed in (the ``layout`` option)."""
        self.windows_in_place = layout_block(target.tvm_target(), layout) is None
        """How split tiles read rows from outside their chain (:func:`~tvm_memplan.relax.split.split_chains`)."""
        self.workers = self._workers()
        """Threads the fused tiles of a spatial chain run on (the target's cores)."""
        self.repeat, self.min_repeat_ms, self.schedule = repeat, min_repeat_ms, schedule
        self.log = ResultsLog(cache) if cache is not None else None
        self.known: dict[str, float] = {}
        self.compared: dict[str, tuple[list[float], list[float]]] = {}
        """Whole-model confirmations (:meth:`compare_split`) by the split model's signature."""
        if self.log is not None:
            for record in self.log.records():
                if "ms" in record:
                    self.known[record["key"]] = record["ms"]
                elif "before" in record:
                    self.compared[record["key"]] = (record["before"], record["after"])
        self.hits = self.misses = 0
        self.refresh_confirmations, self.stale_ratio = refresh_confirmations, stale_ratio
        self.stale = 0
        """Cached whole-model times measured again: stale (:data:`STALE_RATIO`) or refreshed on request."""
        self.today: float | None = None
        """The unsplit model timed by this measurer (:meth:`unsplit_today`)."""
        self.timers: dict[str, object] = {}

    @property
    def round_samples(self) -> int:
        """Samples a side per interleaved round of :meth:`compare_split` (the confirmation reads them round by
        round: :func:`~tvm_memplan.deploy.split.overhead_and_noise`)."""
        return self.repeat

    def __call__(self, chain: Chain, parts: int) -> float:
        """The fastest of the variants (:meth:`splits`) as measured; :meth:`choice` says which."""
        times = {split: self.split_delta(split) for split in self.splits(chain, parts)}
        fastest = min(times, key=times.get)
        self.chosen[(chain, parts)] = fastest
        return times[fastest]

    def split_delta(self, choice: SplitChoice) -> float:
        """Measured ms added by one way of splitting a chain (one of :meth:`splits`): the chain alone, whole
        and split, timed side by side in interleaved rounds (:meth:`compare`), fastest against fastest. Load
        only ever adds time; medians timed minutes apart (the whole chain's was timed once per chain) put
        MobileNetV2-0.35's chain deltas between -0.42 and +1.46 ms at load 3 to 4 on 2 cores, against a 5 %
        budget of about 0.1 ms."""
        return self._side_by_side(choice, 0)

    def retime(self, choice: SplitChoice, attempt: int) -> float:
        """An independent timing of :meth:`split_delta` (its rounds timed anew), cached as the ``attempt``-th:
        the search takes the median of a decisive split's timings (:func:`~tvm_memplan.split.search.robust_delta`),
        and a second search with the same cache reads the same ones."""
        return self._side_by_side(choice, attempt)

    def _side_by_side(self, choice: SplitChoice, attempt: int) -> float:
        alone = chain_module(self.mod, choice.chain)
        split = split_chains(alone, [choice], self.windows_in_place)

        def side_by_side() -> float:
            whole, tiled = self.compare(alone, split)
            return min(tiled) - min(whole)

        again = (f"again{attempt}",) if attempt else ()  # the first timing keeps the key it always had
        return self._cached(self._key(split, f"beside-whole{choice.parts}", *again), side_by_side)

    def choice(self, chain: Chain, parts: int) -> SplitChoice:
        """The split of ``chain`` into ``parts`` as measured by ``self(chain, parts)``: the faster variant."""
        return self.chosen.get((chain, parts), SplitChoice(chain, parts, False, self.workers))

    def splits(self, chain: Chain, parts: int) -> list[SplitChoice]:
        """The ways ``fused_tiles`` lets ``chain`` run in ``parts`` tiles, none timed yet: per-kernel tiles
        (``off``, ``auto``), fused tiles (``on``, ``auto``; where :attr:`Chain.fusable`) with halos
        recomputed and, for a spatial chain whose tiles share rows, kept in a rolling line buffer."""
        per_kernel = SplitChoice(chain, parts, False, self.workers)
        if self.fused_tiles == "off" or not chain.fusable:
            return [per_kernel]
        fused = [SplitChoice(chain, parts, True, self.workers)]
        rolling = (
            SplitChoice(chain, parts, True, self.workers, rolling=True) if isinstance(chain, SpatialChain) else None
        )
        if rolling is not None and chain.has_halo(parts, rolling.concurrent_tiles):  # else the same kernel
            fused.append(rolling)
        return fused if self.fused_tiles == "on" else [per_kernel, *fused]

    def _workers(self) -> int:
        target = self.target.tvm_target()
        return cpu_spec(target).threads if target.kind.name == "llvm" else 1  # C code has no thread pool

    def model_cost(self, mod: tvm.IRModule) -> float:
        """The whole model's cost (``mod`` unsplit), cached; a cached cost that is stale against the model
        timed now (:meth:`is_stale`) is replaced by today's."""
        key = self._key(mod, "model")
        if key in self.known and self.is_stale(self.known[key], mod):
            self.stale += 1
            del self.known[key]
        return self._cached(key, lambda: self.unsplit_today(mod))

    def unsplit_today(self, mod: tvm.IRModule) -> float:
        """The unsplit model ``mod`` timed now (fastest of :attr:`TODAY_ROUNDS` rounds of ``repeat`` runs, as the
        chains' deltas are read; the search's budget in ms is a share of it;
        once per measurer, never cached on disk): the search's base and the reference that cached
        whole-model times are checked against."""
        if self.today is None:
            timer = self.timer(mod)
            self.today = min(min(timer()) for _ in range(self.TODAY_ROUNDS))
        return self.today

    def is_stale(self, then_ms: float, mod: tvm.IRModule) -> bool:
        """Whether a whole-model time read against the unsplit model at ``then_ms`` is to be measured again:
        always with ``refresh_confirmations``, else when the unsplit model ``mod`` timed now is more than
        ``1 + stale_ratio`` times faster or slower than ``then_ms``."""
        if self.refresh_confirmations:
            return True
        today = self.unsplit_today(mod)
        return max(today, then_ms) > (1 + self.stale_ratio) * min(today, then_ms)

    def compare_split(
        self, mod: tvm.IRModule, choices: list[SplitChoice], rounds: int = 3
    ) -> tuple[list[float], list[float]]:
        """Samples of the whole model without and with the split ``choices``, side by side, in at least
        ``rounds`` interleaved rounds (:meth:`compare`); cached like the chains' times, so that a second
        search with the same cache confirms (and keeps) the same plan, unless the cached samples are
        stale (:meth:`is_stale`: their unsplit model's fastest run against today's). Cached samples of fewer
        rounds are timed on to ``rounds`` and cached with the new ones."""
        split = split_chains(mod, choices, self.windows_in_place)
        key = self._key(mod, chain_signature(split), "confirm")
        cached = self.compared.get(key)
        if cached is not None and self.is_stale(min(cached[0]), mod):
            self.stale += 1
            cached = None
        done = len(cached[0]) // self.repeat if cached is not None else 0
        if cached is not None and done >= rounds:
            self.hits += 1
            return cached
        self.misses += 1
        before, after = self.compare(mod, split, rounds=rounds - done)
        if cached is not None:
            before, after = cached[0] + before, cached[1] + after
        self.compared[key] = (before, after)
        if self.log is not None:
            self.log.append({"key": key, "before": before, "after": after})
        return before, after

    def _key(self, mod: tvm.IRModule, *parts: str) -> str:
        layout = () if self.layout == "nchw" else (self.layout,)  # NCHW keys as they were before layouts
        return "|".join((chain_signature(mod), *parts, self.target.name, self.device.name, self.schedule, *layout))

    def time_ms(self, mod: tvm.IRModule, variant: str) -> float:
        return self._cached(self._key(mod, variant), lambda: self._measure(mod))

    def _cached(self, key: str, measure: Callable[[], float]) -> float:
        """``measure()`` once per ``key``, in memory and in the cache log (what a later search reuses)."""
        if key in self.known:
            self.hits += 1
            return self.known[key]
        self.misses += 1
        value = float(measure())
        self.known[key] = value
        if self.log is not None:
            self.log.append({"key": key, "ms": value})
        return value

    def _measure(self, mod: tvm.IRModule) -> float:
        return float(np.median(self.timer(mod)()))

    def timer(self, mod: tvm.IRModule):
        """A callable returning ``repeat`` timings (ms) of ``mod`` on the device (compiled once
        per module and measurer). By default each timing is one run (no ``min_repeat_ms``): on a
        shared machine the fastest of many single runs finds the quiet moments that a mean over
        20 ms of runs averages away (MobileNetV2-0.35, 1.6 ms quiet: the fastest of 15 such means
        ranged 1.6 to 5.7 ms between confirmations at load 3 to 4)."""
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
            passes = pipeline(target, order="program", schedule=self.schedule, layout=self.layout)
            executable = tvm.compile(mod, target, relax_pipeline=passes)
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


DEVICE_CORES = {device: core for device, core in DEVICES.items() if core is not None}
"""The emulated microcontrollers the split search can count instructions on, and their cores (targets)."""


def require_arm_tools(device: str) -> None:
    """One-line UserError when ``device`` is an emulated core and its toolchain or emulator is missing."""
    missing = [tool for tool in ("make", "arm-none-eabi-gcc", "qemu-system-arm") if shutil.which(tool) is None]
    if missing:
        raise UserError(
            f"--device {device} counts instructions on qemu but {', '.join(missing)} "
            "is not installed (Debian: apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm)"
        )


class DeviceInstructions(ChainLatency):
    """``DeviceInstructions(...)(chain, parts)`` → instructions the emulated core retires more with
    ``chain`` in ``parts`` tiles than without: the model ``spec`` is written as standalone C (as
    ``build --emit-c`` writes it, with ``emit_options``) with and without the split, each program run
    once under ``qemu-system-arm -icount shift=0`` and checked against onnxruntime. Cached by the split
    chain's signature (a chain's kernels cost the same in any model), the whole programs by theirs.
    ``rewrite(choices)`` is the planner's ``prepare`` for a split (the search's order, then the split).
    """

    def __init__(
        self,
        mod: tvm.IRModule,
        spec: str,
        device: str,
        rewrite: Callable[[list[SplitChoice]], Callable[[tvm.IRModule], tvm.IRModule]],
        cache: Path | None = DEFAULT_CACHE,
        schedule: str = "default",
        fused_tiles: str = "off",
        plan_options: dict[str, Any] | None = None,
        emit_options: dict[str, Any] | None = None,
    ) -> None:
        if device not in DEVICE_CORES:
            raise UserError(f"unknown device {device!r}; choose one of {', '.join(DEVICE_CORES)}")
        require_arm_tools(device)
        from .targets import get_target

        super().__init__(mod, get_target(DEVICE_CORES[device]), None, cache, schedule=schedule, fused_tiles=fused_tiles)
        self.spec, self.device_name, self.rewrite = spec, device, rewrite
        # kernel instructions do not depend on the execution order or the arena's offsets: the
        # programs measured keep the search's order (no order search per candidate) and a quick plan
        self.plan_options = {**(plan_options or {}), "order": "program", "groups": None, "layout": "nchw"}
        self.plan_options["time_budget"] = min(self.plan_options.get("time_budget") or 1.0, 1.0)
        self.emit_options = dict(emit_options or {})
        checks = "checks" if self.emit_options.get("kernel_checks", True) else "no-checks"
        fixed = [] if self.emit_options.get("requantize", "exact") == "exact" else ["fixed"]  # (the caches' old keys)
        self.context = "|".join((self.target.name, device, schedule, checks, *fixed, "instructions"))

    def splits(self, chain: Chain, parts: int) -> list[SplitChoice]:
        """The ways of :meth:`ChainLatency.splits` within the host's limits (spatial chains of at most
        :data:`~tvm_memplan.relax.split.spatial_chains.SPATIAL_WINDOWS` windows in at most
        :attr:`SpatialChain.max_parts` tiles: each recomputes its halos), and for a spatial chain whose tiles
        share rows, per-kernel tiles with a rolling line buffer (TinyEngine's and MCUNetV2's way on a core
        where a kernel call costs a few instructions): the longer chains and more tiles of
        :data:`~tvm_memplan.relax.split.spatial_chains.LINE_BUFFER_WINDOWS` and
        :attr:`SpatialChain.line_buffer_parts` run that way only."""
        if not isinstance(chain, SpatialChain):
            return super().splits(chain, parts)
        windows = sum(op.window is not None for op in chain.ops)
        within = windows <= SPATIAL_WINDOWS and parts <= chain.max_parts
        variants = super().splits(chain, parts) if within else []
        if chain.has_halo(parts):
            variants.append(SplitChoice(chain, parts, rolling=True))
        return variants

    def split_delta(self, choice: SplitChoice) -> float:
        alone = chain_module(self.mod, choice.chain)
        key = "|".join((chain_signature(split_chains(alone, [choice])), f"delta{choice.parts}", self.context))
        return self._cached(key, lambda: self._program([choice]) - self._program([]))

    def retime(self, choice: SplitChoice, attempt: int) -> float:
        """Instruction counts are exact: timing again would count the same."""
        return self.split_delta(choice)

    def model_cost(self, mod: tvm.IRModule) -> float:
        return self._program([])

    def compare_split(
        self, mod: tvm.IRModule, choices: list[SplitChoice], rounds: int = 3
    ) -> tuple[list[float], list[float]]:
        """Instruction counts are exact: one of each (more rounds would repeat them)."""
        return [self._program([])], [self._program(choices)]

    def _program(self, choices: list[SplitChoice]) -> float:
        """Instructions of the whole program with ``choices`` split, cached."""
        key = "|".join((chain_signature(split_chains(self.mod, choices)), "model", self.context))
        return self._cached(key, lambda: self.instructions(choices))

    def instructions(self, choices: list[SplitChoice]) -> int:
        """Build the standalone C with ``choices`` split and count its instructions on the device."""
        from .emit_c import emit_c
        from .standalone import measure_c

        with tempfile.TemporaryDirectory(prefix="memplan-chain-") as scratch:
            emit_c(
                self.spec,
                scratch,
                self.target.name,
                prepare=self.rewrite(list(choices)),
                **self.emit_options,
                **self.plan_options,
            )
            result = measure_c(scratch, self.device_name)
        if not result.correct or result.instructions is None:
            split = ", ".join(f"{len(c.chain.ops)}-operator chain in {c.parts}" for c in choices) or "unsplit"
            raise UserError(
                f"{self.spec} ({split}) on {self.device_name}: "
                + (result.error or f"outputs differ from onnxruntime by {result.max_abs_diff:.3g}")
            )
        return result.instructions
