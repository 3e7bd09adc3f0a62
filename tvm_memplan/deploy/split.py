"""Fine-grained splitting end to end (axis-connection-graph splitting, as MAGIS and MCUNetV2 split):
analyse a model's chains, search splits with the simulator and measured latencies, and hand the chosen
rewrite to the planner."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from ..errors import UserError
from ..frontend import LoadedModel, to_relax
from ..planner import plan_model
from ..planning import DEFAULT_ALIGNMENT
from ..relax.ir_utils import top_level_bindings
from ..relax.layout import layout_block
from ..relax.pipeline import resolve_target
from ..relax.split import describe_tensors, find_chains, in_order, memory_order, normalize, program_of, split_chains
from ..relax.split.spatial_chains import LINE_BUFFER_WINDOWS
from ..split.chain import LINE_BUFFER_PARTS, Chain, SpatialChain, SplitChoice, in_channel_blocks
from ..split.search import (
    NOTHING_WITHIN,
    Point,
    SearchOptions,
    SearchResult,
    search,
    search_phased,
    simulated_floor,
    with_original,
)
from ..split.simulate import Program, peak, split_program
from .chain_latency import DEFAULT_CACHE, STALE_RATIO, ChainLatency, DeviceInstructions
from .measure import Device
from .targets import get_target


@dataclass
class SplitOutcome:
    model: str
    chains: list[Chain]
    """Every candidate chain the axis connection graph found."""
    result: SearchResult
    latency_before_ms: float
    latency_after_ms: float
    """Medians measured end to end (the whole model compiled with and without the split, timed
    in interleaved rounds), in :attr:`unit` (instructions on an emulated core, despite the names)."""
    samples_before_ms: list[float]
    samples_after_ms: list[float]
    cache_hits: int
    cache_misses: int
    bottleneck: list[str]
    """What is live at the kept plan's peak, largest first, as operators and shapes."""
    order: tuple[str, ...] = ()
    """``main``'s bindings in the order the search simulated (:func:`~tvm_memplan.relax.split.memory_order`)."""
    coarse_arena_bytes: int = 0
    """The planner's arena for the unsplit model."""
    arena_bytes: int = 0
    """The planner's arena for the kept plan (the coarse arena when it is unsplit)."""
    unit: str = "ms"
    """What the latencies count: ``ms`` (timed here or over RPC) or ``instructions`` (an emulated core)."""
    remeasured: int = 0
    """Cached whole-model times (the unsplit cost, confirmations) timed again: stale against the unsplit
    model timed today, or refreshed on request (``refresh_confirmations``)."""
    budget: float | None = None
    """The latency budget the kept plan was held to (None under a memory limit, which ignores it)."""
    block: int | None = None
    """The blocked layout's channels per block the search split in (None: NCHW)."""
    overhead: float = 0.0
    """The whole model's slowdown with the kept plan as its confirmation judged it (:func:`overhead_and_noise`:
    fastest runs, round by round; 0 unsplit)."""
    fusable: bool = False
    """The search ran each chain's tiles per kernel (``--fused-tiles off``) on a model whose chains can run
    fused (a float model timed here), so ``--fused-tiles auto`` may keep a smaller plan."""
    floor: Point | None = None
    """With ``floor_guided``: the simulator's floor (:func:`~tvm_memplan.split.search.simulated_floor`),
    latency ignored, whose plan's moves the search timed first."""

    @property
    def choices(self) -> list[SplitChoice]:
        return list(self.result.best.choices)

    def prepare(self) -> Callable[[tvm.IRModule], tvm.IRModule]:
        """The rewrite for :func:`tvm_memplan.planner.plan_model` (``prepare=``)."""
        return split_rewriter(self.order, self.choices)


def split_rewriter(order: tuple[str, ...], choices: list[SplitChoice]) -> Callable[[tvm.IRModule], tvm.IRModule]:
    """The ``prepare`` step of :func:`~tvm_memplan.planner.plan_model` for a split plan: normalize, put
    ``main`` in the simulated order, split the chosen chains."""
    return lambda mod: split_chains(in_order(normalize(mod), order) if order else normalize(mod), choices)


def default_fused_tiles(model: LoadedModel, target: str, mcu_device: str | None) -> str:
    """``auto`` where the search times a float model's chains for an ``llvm`` CPU target (a fused chain pays no
    launch per tile: a blocked MobileNetV2-0.35 export keeps 3.49x, per-kernel tiles 1.07x); ``off`` for int8
    models (no merged tile kernel for them), the ``c`` targets and GPUs, and an emulated core, where a call
    costs a few instructions and the per-kernel tiles keep a line buffer."""
    from ..quant.reference import is_quantized

    host_cpu = get_target(target).kind == "llvm"
    return "auto" if host_cpu and mcu_device is None and not is_quantized(model.onnx_model) else "off"


FLOOR_SHARE = 0.2
"""The share of ``--search-seconds`` the simulated floor may take (SqueezeNet's: 24 s on a 2-core Zen 5);
the floor search ends sooner where no split lowers its peak any more."""


REBASES = 2
"""Times the search goes on from its confirmed plan, its estimate re-based on the whole model's time."""


def _rebased(
    program: Program,
    chains: list[Chain],
    result: SearchResult,
    overhead: float,
    budget: float,
    measurer: ChainLatency,
    limits: SearchOptions,
) -> SearchResult | None:
    """The search again from ``result``'s confirmed plan, with that plan's cost as the whole model measured
    it (``overhead``) in place of the sum of its chains' costs timed alone; None when the whole model left no
    more of the budget than the sum did. Chains timed alone each carry their own launches and layout changes
    at their borders: SqueezeNet's seven chains summed to +4.6 % where the model with them all measured
    +1.2 to +2.3 %, and the search had stopped there with its floor's cheap chains (+1.4 %) left out."""
    unsplit = result.original.latency_ms
    estimated = result.best.latency_ms - unsplit
    confirmed = unsplit * overhead
    if confirmed >= estimated:
        return None
    # the same allowance (unsplit x (1 + budget)) over a base that makes the kept plan cost what was confirmed
    base = unsplit + confirmed - estimated
    if base <= 0:  # its chains timed alone summed to more than the whole model (a tiny model, a loaded machine)
        return None
    options = {**limits, "budget": unsplit * (1 + budget) / base - 1}
    again = search(program, chains, base, measurer, start_from=result.best.choices, **options)
    front = [p for p in again.front if p.choices]
    return replace(
        again,
        original=result.original,
        front=with_original(front, result.original),
        evaluated=result.evaluated + again.evaluated,
        measured=result.measured + again.measured,
        seconds=result.seconds + again.seconds,
        stopped=f"{again.stopped} (re-based on the whole model's {overhead:+.1%} with {len(result.best.choices)} "
        f"chains split, estimated {estimated / unsplit:+.1%})",
    )


def search_split(
    model: LoadedModel,
    target: str = "host",
    device: Device | None = None,
    budget: float = 0.05,
    seconds: float = 60.0,
    memory_limit: int | None = None,
    cache: Path | None = DEFAULT_CACHE,
    schedule: str = "default",
    progress: Callable[[int, int], None] | None = None,
    fused_tiles: str = "off",
    plan_options: Mapping[str, Any] | None = None,
    io_in_arena: bool = False,
    mcu_device: str | None = None,
    spec: str | None = None,
    emit_options: Mapping[str, Any] | None = None,
    refresh_confirmations: bool = False,
    stale_ratio: float = STALE_RATIO,
    floor_guided: bool = False,
) -> SplitOutcome:
    """Search the split plan of ``model``; latencies are measured on ``device`` (default: here).
    ``progress(candidates timed, lowest peak so far)`` follows the search. ``fused_tiles`` (``off``,
    ``on``, ``auto``: per chain, the faster as measured) runs a chain's tiles as one kernel
    (:data:`~tvm_memplan.split.chain.FUSED_TILES`).

    The simulator reads ``main`` in the order the planner's order search gives it. The kept plan is
    planned (:func:`~tvm_memplan.planner.plan_model` with ``plan_options``) and kept only when its
    arena is below the unsplit model's: the simulator's estimate is checked, never trusted. With
    ``io_in_arena`` (``build --io-in-arena``) the simulator counts the model's inputs as arena tensors.

    ``mcu_device`` (``qemu-cortex-m7``, ``qemu-cortex-m4``, ``qemu-cortex-m55``): costs are the instructions
    the emulated core retires running the model ``spec`` as standalone C (:class:`DeviceInstructions`,
    with :func:`~tvm_memplan.deploy.emit_c.emit_c`'s ``emit_options``), and the budget is in instructions.

    With ``floor_guided`` the simulator's floor is computed first (:data:`FLOOR_SHARE` of ``seconds``) and the
    moves of its plan are timed before the others (:func:`~tvm_memplan.split.search.search`'s ``toward``): on
    a 2-core Zen 5, SqueezeNet in NCHW16c kept 4.35x-4.95x guided against 2.73x, but MobileNetV2 2.14x against
    4.04x (``results/bench_split_floor_guided.md``), so it is asked for, not the default.

    Cached whole-model times (the unsplit model's cost, the confirmations) are timed again when the
    unsplit model timed now is more than ``1 + stale_ratio`` times faster or slower than what they were
    read against (:data:`~.chain_latency.STALE_RATIO`), or all of them with ``refresh_confirmations``."""
    if budget < 0:
        raise UserError(f"--latency-budget must not be negative (got {budget})")
    if seconds <= 0:
        raise UserError(f"--search-seconds must be positive (got {seconds})")
    from ..quant.reference import is_quantized

    if fused_tiles != "off" and is_quantized(model.onnx_model):
        # the merged tile kernel of an int8 chain planned twice the unsplit arena on a small QDQ model
        # (21,056 bytes against 11,520; its per-kernel tiles: 5,504), though its outputs were identical
        raise UserError(
            f"{model.name}: --fused-tiles {fused_tiles} does not take int8 (QDQ) models yet; use --fused-tiles off"
        )
    fusable = fused_tiles == "off" and mcu_device is None and not is_quantized(model.onnx_model)
    deploy_target = get_target(target)
    device = device or Device()
    options = dict(plan_options or {})
    alignment = options.get("alignment") or DEFAULT_ALIGNMENT
    mod = normalize(to_relax(model))
    planning_target = target if target == "host" else deploy_target.tvm_target()
    layout = options.get("layout") or "auto"
    # the simulator sizes tensors as the model is built: a blocked layout pads channels to whole blocks
    block = layout_block(resolve_target(planning_target), layout) if mcu_device is None else None
    if options.get("order", "search") == "search" and options.get("groups") is None:
        order = tuple(memory_order(mod, options.get("order_seconds", 10.0), alignment, block))
    else:  # the planner keeps (or sorts) the program order: so does the simulator
        order = tuple(b.var.name for b in top_level_bindings(mod["main"]))
    mod = in_order(mod, order)
    if mcu_device is None:
        chains = find_chains(mod, block)
    else:  # longer spatial chains in more tiles, which keep a line buffer (DeviceInstructions.splits)
        chains = [
            replace(c, line_buffer_parts=LINE_BUFFER_PARTS) if isinstance(c, SpatialChain) else c
            for c in find_chains(mod, block, LINE_BUFFER_WINDOWS)
        ]
    if block is not None:  # a blocked layout cuts channels in whole blocks
        chains = in_channel_blocks(chains, block)
    if mcu_device is not None:
        if spec is None:
            raise ValueError("measuring on an emulated core needs the model's spec")
        measurer: ChainLatency = DeviceInstructions(
            mod,
            spec,
            mcu_device,
            lambda choices: split_rewriter(order, choices),
            cache=cache,
            schedule=schedule,
            fused_tiles=fused_tiles,
            plan_options=options,
            emit_options={**(emit_options or {}), "io_in_arena": io_in_arena},
        )
    else:
        measurer = ChainLatency(
            mod,
            deploy_target,
            device,
            cache=cache,
            schedule=schedule,
            fused_tiles=fused_tiles,
            refresh_confirmations=refresh_confirmations,
            stale_ratio=stale_ratio,
            layout=layout if block is not None else "nchw",
        )
    before = measurer.model_cost(mod)
    program = program_of(mod, alignment, inputs_in_arena=io_in_arena, block=block)
    started = time.monotonic()
    floor = simulated_floor(program, chains, seconds * FLOOR_SHARE, fused_tiles != "off") if floor_guided else None
    left = max(seconds - (time.monotonic() - started), seconds * (1 - FLOOR_SHARE))
    limits = SearchOptions(
        budget=budget, seconds=left, memory_limit=memory_limit, progress=progress, toward=floor.choices if floor else ()
    )
    result = search_phased(program, chains, before, measurer, **limits)
    if memory_limit is not None and result.best.peak_bytes > memory_limit:
        at_peak = "; ".join(describe_tensors(mod, list(result.bottleneck.live[:4])))
        smallest = smallest_point(result)
        raise UserError(
            f"{model.name}: no split plan fits in {memory_limit:,} bytes: the smallest found peaks at "
            f"{smallest.peak_bytes:,} bytes ({at_peak} live at its peak) for "
            f"{smallest.latency_ms / result.original.latency_ms - 1:+.1%} latency (estimated); "
            + unmet_limit_hint(result, block, fusable)
        )
    before, after, result = _confirm(mod, result, measurer, budget if memory_limit is None else None)
    for _ in range(REBASES if memory_limit is None else 0):
        left = seconds - (time.monotonic() - started)
        overhead = overhead_and_noise(before, after, measurer.round_samples)[0]
        if left <= 0 or not result.stopped.startswith(NOTHING_WITHIN) or not result.best.choices:
            break
        rebased = _rebased(program, chains, result, overhead, budget, measurer, {**limits, "seconds": left})
        if rebased is None:
            break
        more_before, more_after, rebased = _confirm(mod, rebased, measurer, budget)
        if rebased.best.peak_bytes >= result.best.peak_bytes:
            break
        before, after, result = more_before, more_after, rebased
    coarse, arena, result = _planned(model, planning_target, options, order, result)
    if not result.best.choices:
        after = before
    result.bottleneck = peak(split_program(program, list(result.best.choices)))
    return SplitOutcome(
        model.name,
        chains,
        result,
        float(np.median(before)),
        float(np.median(after)),
        before,
        after,
        measurer.hits,
        measurer.misses,
        describe_tensors(mod, list(result.bottleneck.live[:6])),
        order,
        coarse,
        arena,
        "ms" if mcu_device is None else "instructions",
        measurer.stale,
        budget if memory_limit is None else None,
        block,
        overhead_and_noise(before, after, measurer.round_samples)[0],
        fusable,
        floor,
    )


def smallest_point(result: SearchResult) -> Point:
    """The point of the search's front with the lowest simulated peak (the faster of equal ones)."""
    return min(result.front, key=lambda p: (p.peak_bytes, p.latency_ms))


def smaller_plan_options(result: SearchResult, block: int | None, fusable: bool = False) -> list[str]:
    """Options that may take a smaller plan than the search kept: fused tiles where the search ran without
    them (``fusable``: a chain's tiles as one kernel pay no launch per tile; MobileNetV2-0.35 in NCHW16c kept
    1.07x per kernel, 3.49x fused), NCHW in a blocked layout (slower kernels but cheaper tiles, channels split
    finer than blocks and none padded), more search time when it ran out."""
    options = ["--fused-tiles auto (each chain's tiles as one kernel where that is faster)"] if fusable else []
    if block is not None:
        options.append(f"--layout nchw (slower kernels, cheaper tiles, no channels padded to blocks of {block})")
    if "search time limit" in result.stopped:
        options.append("a larger --search-seconds (the search stopped at its time limit)")
    return options


def unmet_limit_hint(result: SearchResult, block: int | None, fusable: bool = False) -> str:
    """What may reach a memory limit the search missed."""
    return "try " + ", or ".join([*smaller_plan_options(result, block, fusable), "a larger --memory-limit"])


def _planned(
    model: LoadedModel, target: Any, options: Mapping[str, Any], order: tuple[str, ...], result: SearchResult
) -> tuple[int, int, SearchResult]:
    """The planner's arenas for the unsplit model and for the kept plan, and the search's result with
    the kept plan replaced by the unsplit one when its arena is not below the unsplit model's (the
    simulator's estimate, checked by the planner that produces the real plan). Both in the ``layout``
    option's layout, as the model is built."""
    coarse = plan_model(model, target, **options).total("arena_bytes")
    if not result.best.choices:
        return coarse, coarse, result
    arena = plan_model(model, target, prepare=split_rewriter(order, list(result.best.choices)), **options).total(
        "arena_bytes"
    )
    if arena < coarse:
        return coarse, arena, result
    stopped = (
        f"{result.stopped}; the kept split plan's planned arena ({arena:,} bytes) is not below the coarse "
        f"plan's ({coarse:,} bytes), kept unsplit"
    )
    return coarse, coarse, replace(result, best=result.original, stopped=stopped)


def overhead_and_noise(before: list[float], after: list[float], per_round: int | None = None) -> tuple[float, float]:
    """The whole model's slowdown with a split and how far the samples let it move. The slowdown is read
    round by round (``per_round`` samples a side per interleaved round; None: all in one round), fastest run
    against fastest as the search's chain deltas are read (load only adds time), and the median of the
    rounds is taken: one lucky run of either side in one round moves the fastest of all samples, but
    not the median of the rounds. How far it may move: the two sides' interquartile ranges relative to
    their medians, averaged (0 when each side is one sample, as an instruction count is)."""
    (b25, b50, b75), (a25, a50, a75) = np.percentile(before, [25, 50, 75]), np.percentile(after, [25, 50, 75])
    size = min(per_round or len(before), len(before))
    rounds = [min(after[i : i + size]) / min(before[i : i + size]) - 1 for i in range(0, len(before) - size + 1, size)]
    return float(np.median(rounds)), float(((b75 - b25) / b50 + (a75 - a25) / a50) / 2)


def confirmation_order(result: SearchResult, attempts: int) -> list[Point]:
    """The plans :func:`_confirm` times as whole models, in order: the kept plan, then the front's points of
    higher peaks, the next smaller saving first, and the channel phase's plan where its peak puts it (or
    last, beyond ``attempts``). A miss of the kept plan is often one decisive chain's tiles costing more in
    the model than alone: the points behind it that split that chain fewer ways are tried before the
    channel plan gives up every spatial tile (MobileNetV2-0.35 in NCHW16c fell back from 3.5x to 1.07x
    with the stem chain in 8 line-buffer tiles, 2.5x, on the front and never timed)."""
    rest = [p for p in result.front if p.choices and p.peak_bytes > result.best.peak_bytes]
    fallback = result.fallback
    if fallback is not None and fallback.choices and fallback is not result.best and fallback not in rest:
        rest.append(fallback)
    rest.sort(key=lambda p: (p.peak_bytes, p.latency_ms))
    candidates = [result.best, *rest][:attempts]
    if fallback in rest and fallback not in candidates:
        candidates.append(fallback)
    return candidates


def _confirm(
    mod: tvm.IRModule,
    result: SearchResult,
    measurer: ChainLatency,
    budget: float | None,
    attempts: int = 6,
    retimes: int = 2,
) -> tuple[list[float], list[float], SearchResult]:
    """Time the whole model with and without the kept split, side by side. The search's latency
    is a sum of chains timed alone; when the model as a whole misses the budget, fall back along
    the Pareto front to the next smaller savings, up to ``attempts`` plans, the channel phase's plan among
    them (:func:`confirmation_order`). A slowdown within the samples' noise of the budget
    (:func:`overhead_and_noise`, read round by round) is timed again, up to ``retimes`` times more, and
    judged on all its samples (a 5 % budget on a busy machine is within one confirmation's spread)."""
    candidates = confirmation_order(result, attempts)
    per_round = measurer.round_samples
    before: list[float] = []
    after: list[float] = []
    for point in candidates:
        if not point.choices:
            break
        before, after = measurer.compare_split(mod, list(point.choices))
        for again in range(1, retimes + 1 if budget is not None else 1):
            overhead, noise = overhead_and_noise(before, after, per_round)
            if abs(overhead - budget) > noise:
                break
            # a cached confirmation already timed on returns its samples as they are
            before, after = measurer.compare_split(mod, list(point.choices), rounds=3 * (1 + again))
        if budget is None or overhead_and_noise(before, after, per_round)[0] <= budget:
            if point is result.fallback and point is not result.best:
                result = replace(
                    result,
                    best=point,
                    stopped=f"{result.stopped}; the whole model missed the budget "
                    "with the points of the front tried, kept the channel chains' plan",
                )
            elif point is not result.best:
                result = replace(
                    result,
                    best=point,
                    stopped=f"{result.stopped}; the whole model missed the budget "
                    "with the smaller plans, kept the next point of the front",
                )
            return before, after, result
    original = result.original
    if result.best.choices:
        result = replace(
            result,
            best=original,
            stopped=f"{result.stopped}; every split plan tried made the whole model slower than the budget "
            f"(last: {overhead_and_noise(before, after, per_round)[0]:+.1%}), kept unsplit",
        )
    before = before or [measurer.model_cost(mod)]
    return before, before, result
