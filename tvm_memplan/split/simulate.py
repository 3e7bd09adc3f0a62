"""The memory simulator of fine-grained splitting: peaks of a program before and after its chains are split.

A :class:`Program` is kernels in execution order, each writing one tensor and reading others;
a tensor is live from the step that writes it to the last step that reads it (its active
period ``[t1, t2)``). Model inputs, constants and outputs live outside the arena and do not
count. :func:`split_program` builds the fine-grained program of a set of split chains without
touching any IR, so the search can try thousands of candidates; the arena the planner really
produces is computed for the plan the search keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..planning.lifetimes import tensor_lifetimes
from .chain import SPATIAL_PARTS, Branch, Chain, ChannelChain, RowChain, SpatialChain, SplitChoice, disjoint

__all__ = [
    "SPATIAL_PARTS",
    "Branch",
    "Chain",
    "ChannelChain",
    "Peak",
    "Program",
    "RowChain",
    "SpatialChain",
    "SplitChoice",
    "Step",
    "blocked_bytes",
    "disjoint",
    "in_place",
    "peak",
    "split_program",
]


def blocked_bytes(shape: Sequence[int], itemsize: int, block: int | None = None) -> int:
    """Bytes of a tensor of ``shape`` as the arena holds it. In a blocked channel layout (NCHW[x]c,
    ``block`` channels a block) a batch-1 4-D tensor's channels are rounded up to whole blocks: the
    layout pass pads the last block (:mod:`~tvm_memplan.relax.channel_pad`), and the planner sizes the
    blocked tensor, padding included."""
    size = itemsize
    for i, extent in enumerate(shape):
        size *= -(-extent // block) * block if block and i == 1 and len(shape) == 4 and shape[0] == 1 else extent
    return size


@dataclass(frozen=True)
class Step:
    """One kernel; as an :class:`~tvm_memplan.planning.lifetimes.Operator` of the planner's graph it
    has ``inputs`` (its reads) and ``outputs`` (the one tensor it writes)."""

    name: str
    """The binding that runs at this step (tiles: ``name#t``)."""
    writes: str
    reads: tuple[str, ...]
    overwrites: tuple[str, ...] = ()
    """Tensors the step reads only at the index it writes: an in-place kernel's output takes over
    the bytes of the first of them that dies at this step and is as large."""

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.reads

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.writes,)


@dataclass
class Program:
    steps: list[Step]
    sizes: dict[str, int]
    """Bytes of every tensor the arena holds (absent: outside the arena)."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Binding name → the tensor it writes (fused elementwise ops write their producer's)."""
    layout_copies: frozenset[str] = frozenset()
    """Inputs the arena holds as a copy in the build's blocked layout for the whole kernels that read them. A
    tile slices its rows out of the NCHW input and transforms the slice (both live at the transform), so a
    copy that only tiles read is not made."""

    def tensor(self, binding: str) -> str:
        return self.aliases.get(binding, binding)


@dataclass(frozen=True)
class Peak:
    bytes: int
    step: int
    live: tuple[str, ...]
    """Tensors live at the peak step, largest first."""
    steps_at_peak: int = 1
    """Steps whose live bytes equal the peak: a move that removes one of several equal
    bottlenecks is progress even though the peak stays."""


def peak(program: Program) -> Peak:
    """Largest sum of live tensor bytes over the steps, with the planner's lifetimes
    (:func:`~tvm_memplan.planning.lifetimes.tensor_lifetimes`: from the first step that touches a
    tensor to the last) and its in-place kernels (:func:`in_place`)."""
    lifetimes = {t: span for t, span in tensor_lifetimes(program.steps).items() if t in program.sizes}
    events: dict[int, int] = {}
    for name, (start, end) in lifetimes.items():
        events[start] = events.get(start, 0) + program.sizes[name]
        events[end] = events.get(end, 0) - program.sizes[name]
    inside = {name: (start, end) for name, (_, start, end) in in_place(program, lifetimes).items()}
    for name, (start, end) in inside.items():
        events[start] -= program.sizes[name]
        events[end] = events.get(end, 0) + program.sizes[name]
    best, best_step, running, ties = 0, 0, 0, 0
    for i in range(len(program.steps) + 1):
        running += events.get(i, 0)
        if running > best:
            best, best_step, ties = running, i, 1
        elif running == best:
            ties += 1
    shared = {n for n, (start, end) in inside.items() if start <= best_step < end}  # in an input's bytes
    live = sorted(
        (n for n, (start, end) in lifetimes.items() if start <= best_step < end and n not in shared),
        key=lambda n: -program.sizes[n],
    )
    return Peak(best, best_step, tuple(live), ties)


def in_place(program: Program, lifetimes: dict[str, tuple[int, int]]) -> dict[str, tuple[str, int, int]]:
    """Tensors written in place of an input (the planner's in-place kernels), each with that input
    and the steps ``[start, end)`` where both share its bytes: from the tensor's first step (a fused
    kernel's first operator) to the step where the input dies."""
    inside: dict[str, tuple[str, int, int]] = {}
    taken: set[str] = set()
    for i, step in enumerate(program.steps):
        written = step.writes
        if not step.overwrites or written in inside or written not in program.sizes:
            continue
        start = lifetimes[written][0]
        for source in step.overwrites:
            if (
                source in program.sizes
                and source not in taken
                and program.sizes[source] == program.sizes[written]
                and lifetimes[source][0] < start
                and lifetimes[source][1] == i + 1
            ):
                inside[written] = (source, start, i + 1)
                taken.add(source)
                break
    return inside


def split_program(program: Program, choices: list[SplitChoice]) -> Program:
    """The program with every chosen chain run tile by tile: each branch's tiles where its head
    ran (a branching chain run as one kernel: all of them where its last head ran), or a chain with
    an anchor right after the anchor (as the rewriter emits them), the chains' other bindings gone."""
    position = {step.name: i for i, step in enumerate(program.steps)}
    at: dict[int, list[tuple[SplitChoice, Branch]]] = {}
    anchored: dict[str, SplitChoice] = {}
    for choice in choices:
        if choice.chain.anchor is not None:
            anchored[choice.chain.anchor] = choice
            continue
        for branch in choice.chain.branches:
            if choice.fused:  # one kernel: every branch where the last head ran, as the rewriter emits them
                last = max(position[b.head] for b in choice.chain.branches)
                at.setdefault(last, []).append((choice, branch))
            else:
                at.setdefault(position[branch.head], []).append((choice, branch))
    inside = {name for c in choices for name in c.chain.bindings}
    steps: list[Step] = []
    sizes = dict(program.sizes)
    written: set[str] = set()  # final tensors already written: later tiles accumulate into them

    def emit(choice: SplitChoice, branch: Branch) -> list[str]:
        if isinstance(choice.chain, SpatialChain):
            steps.extend(_spatial_steps(program, choice, sizes))
        else:
            steps.extend(_branch_steps(program, choice, branch, sizes, written))
        return list(choice.chain.bindings) if branch is choice.chain.branches[-1] else []

    for i, step in enumerate(program.steps):
        done = []
        if i in at:
            start = len(steps)
            done = [name for choice, branch in at[i] for name in emit(choice, branch)]
            if any(choice.fused and len(choice.chain.branches) > 1 for choice, _ in at[i]):
                _inputs_live_to_the_end(steps, start)
        elif step.name not in inside:
            steps.append(step)
            done = [step.name]
        while done:  # anchored chains whose anchor has just run (an anchor may itself be in a chain)
            name = done.pop()
            if name in anchored:
                choice = anchored.pop(name)
                done.extend(emit(choice, choice.chain.branches[0]))
    for choice in choices:
        chain = choice.chain
        for name in {program.tensor(b) for b in chain.tiled} - {program.tensor(chain.final)}:
            sizes.pop(name, None)
    for name in program.layout_copies:  # read by tiles alone, which slice the NCHW input: no whole copy
        if not any(name in s.reads for s in steps if s.name in position):
            sizes.pop(name, None)
    return Program(steps, sizes, dict(program.aliases), program.layout_copies)


def _inputs_live_to_the_end(steps: list[Step], start: int) -> None:
    """A branching chain run as one kernel (``steps[start:]``) takes every branch's inputs as arguments of
    one call: they live until its last step, not only until their branch's last tile."""
    inner = {s.writes for s in steps[start:]}
    outer = [r for s in steps[start:] for r in s.reads if r not in inner]
    last = steps[-1]
    steps[-1] = replace(last, reads=tuple(dict.fromkeys(last.reads + tuple(outer))))


def _branch_steps(
    program: Program, choice: SplitChoice, branch: Branch, sizes: dict[str, int], written: set[str]
) -> list[Step]:
    """A channel or row chain's branch tile by tile: its own tensors, then the ones after a concat
    (channel chains), each tile ending in the chain's final tensor."""
    chain, parts = choice.chain, choice.parts
    by_name = {s.name: s for s in program.steps}
    final = program.tensor(chain.final)
    links = (branch.head, *branch.mids)
    joined = []
    if isinstance(chain, ChannelChain):
        # a concat's tile is the branch's last tile: a tensor of its own only where the branch writes into it
        concat = [program.tensor(chain.concat)] if chain.concat else []
        own_tensors = {program.tensor(b) for b in links}
        joined = [t for t in concat if t in own_tensors] + [program.tensor(b) for b in chain.post]
    shared = [t for t in dict.fromkeys(joined) if t != final]
    group = {program.tensor(b) for b in chain.tiled}
    own = [t for t in dict.fromkeys(program.tensor(b) for b in links) if t not in shared and t != final]
    readers = links + ((branch.pool,) if branch.pool else ())
    outer = list(dict.fromkeys(r for b in readers for r in by_name[b].reads if r not in group))
    share = branch.channels / sum(b.channels for b in chain.branches)
    pooled = program.tensor(branch.pool) if branch.pool else None
    steps: list[Step] = []
    for t in range(parts):
        fraction = branch.tile_fraction(parts, t)
        previous: tuple[str, ...] = tuple(outer)
        for position, name in enumerate(own + shared):
            tile = f"{name}#{branch.head}#{t}"
            if name in program.sizes:
                size = program.sizes[name] * (1 if name in own else share)
                sizes[tile] = max(1, int(size * fraction))
            if position == 0 and pooled is not None:  # the head's partial sums over pooled slices
                for part in range(parts):
                    piece = f"{pooled}#{branch.head}#{t}#{part}"
                    sizes[piece] = max(1, program.sizes.get(pooled, 0) // parts)
                    steps.append(Step(piece, piece, tuple(outer)))
                    steps.append(Step(tile, tile, (piece, *outer) + ((tile,) if part else ())))
            else:
                steps.append(Step(tile, tile, previous))
            previous = (tile, *outer)
        steps.append(Step(f"{final}#{branch.head}#{t}", final, previous + ((final,) if final in written else ())))
        written.add(final)
    return steps


def _spatial_steps(program: Program, choice: SplitChoice, sizes: dict[str, int]) -> list[Step]:
    """A spatial chain tile by tile: each operator on its rows (fused elementwise operators in
    their producer's tile; a convolution reads its rows of an outside tensor in place), the last
    operator writing its rows of the chain's final tensor (or all last tiles concatenated at the
    end). With a line buffer (:attr:`~.chain.SplitChoice.rolling`) a tile's buffer also holds the
    rows its previous tile kept: those are cut out after their last reader in that tile (a tensor
    of their own until the next tile's buffer takes them in)."""
    chain: SpatialChain = choice.chain
    ops = chain.ops
    by_name = {s.name: s for s in program.steps}
    group = {program.tensor(op.name) for op in ops}
    final = program.tensor(ops[-1].name)
    steps: list[Step] = []
    last_tiles = []
    at_once = choice.concurrent_tiles  # fused tiles on several workers: each worker's tile buffers live
    if choice.rolling:
        plan = chain.rolling_rows(choice.parts, at_once)
        held = [{name: r.held for name, r in tile.items()} for tile in plan]
    else:
        plan, held = None, chain.tile_rows(choice.parts)
    # the last operator of each tensor (whose rows its readers read), and the last step reading it
    owner = {program.tensor(op.name): op.name for op in ops}
    last_use = {program.tensor(op.name): i for i, op in enumerate(ops)}
    for i, op in enumerate(ops):
        for r in op.reads:
            last_use[program.tensor(r)] = i
    carried: dict[str, str] = {}  # tensor → the rows its previous tile kept for this one
    for t, need in enumerate(held):
        tile_of: dict[str, str] = {}
        for i, op in enumerate(ops):
            if op.name in need:
                steps.extend(
                    _spatial_op_steps(program, choice, op, t, need, plan, tile_of, carried, sizes, by_name, group)
                )
            if plan is not None and t + 1 < len(plan):  # cut the rows the next tile keeps after their last reader
                for name, used in last_use.items():
                    following = plan[t + 1].get(owner[name])
                    if used == i and name in tile_of and following is not None and following.kept is not None:
                        if following.kept == need[owner[name]]:  # all of it carried: the buffer itself
                            carried[name] = tile_of[name]
                            continue
                        kept = f"{name}#{chain.head}#{t + 1}#kept"
                        sizes[kept] = (following.kept[1] - following.kept[0]) * _row_bytes(ops, owner[name]) * at_once
                        steps.append(Step(kept, kept, (tile_of[name],)))
                        carried[name] = kept
        last_tiles.append(tile_of[final])
    if chain.gathered:
        steps.append(Step(f"gather#{chain.head}", final, tuple(last_tiles)))
    return steps


def _row_bytes(ops: tuple, name: str) -> int:
    return next(op.row_bytes for op in ops if op.name == name)


def _spatial_op_steps(
    program: Program,
    choice: SplitChoice,
    op,
    t: int,
    need: dict,
    plan: list | None,
    tile_of: dict[str, str],
    carried: dict[str, str],
    sizes: dict[str, int],
    by_name: dict[str, Step],
    group: set[str],
) -> list[Step]:
    """The steps of one operator of a spatial chain in tile ``t`` (see :func:`_spatial_steps`)."""
    chain: SpatialChain = choice.chain
    final = program.tensor(chain.ops[-1].name)
    at_once = choice.concurrent_tiles
    tensor = program.tensor(op.name)
    into_final = tensor == final and not chain.gathered
    tile = tile_of.setdefault(tensor, final if into_final else f"{tensor}#{chain.head}#{t}")
    if not into_final:
        lo, hi = need[op.name]
        sizes[tile] = max(sizes.get(tile, 1), (hi - lo) * op.row_bytes * at_once)
    steps: list[Step] = []
    placed = ()
    if tensor in carried:  # its buffer starts with the rows kept from the previous tile
        steps.append(Step(f"{tile}#placed", tile, (carried.pop(tensor),)))
        placed = (tile,)
    if plan is not None and plan[t][op.name].computed[0] >= plan[t][op.name].computed[1]:
        return steps  # every row it holds was kept: it reads nothing in this tile
    outer = tuple(r for r in by_name[op.name].reads if r not in group)
    reads = tuple(dict.fromkeys(tile_of[program.tensor(r)] for r in op.reads if program.tensor(r) != tensor))
    if op.copied_row_bytes and op.window is not None:
        lo, hi = op.window.input_rows(need[op.name])[0]
        if (lo, hi) != (0, op.window.rows_in):
            copy = f"{op.outside[0]}#{chain.head}#{t}"
            sizes[copy] = (hi - lo) * op.copied_row_bytes * at_once
            if op.outside[0] in program.layout_copies:  # the NCHW slice, then its blocked copy
                sizes[f"{copy}#nchw"] = sizes[copy]
                steps.append(Step(f"{copy}#nchw", f"{copy}#nchw", outer))
                steps.append(Step(copy, copy, (f"{copy}#nchw",)))
            else:
                steps.append(Step(copy, copy, outer))
            reads += (copy,)
    accumulated = (final,) if into_final and t else ()
    steps.append(Step(f"{tensor}#{chain.head}#{t}", tile, reads + outer + accumulated + placed))
    return steps
