"""One GPU launch per group (layer grouping, docs/design.md): horizontal fusion of a group's kernels.

The arena planner knows the groups (:func:`~tvm_memplan.relax.grouping.kernel_groups`) and plans
with the F-predicate, so no two tensors a group touches share bytes and its kernels may run at once.
:func:`FuseGroupKernels` then replaces each group's destination-passing calls by one call of a fused
PrimFunc, each member keeping its own (already applied) schedule: ``blockIdx.x`` runs over the sum
of the members' block counts (their block grids flattened), the thread axes over the launch's thread
shape (:func:`launch_shape`), and each block takes the branch of the member its index falls in, with
the block index rebased and the member's threads mapped onto the launch's (below). Allocations stay
exactly as planned: only calls move (to the group's last member), so the VM still requests what the
plan says.

Branching on the block index is uniform within a block (marked ``tvm_thread_invariant`` so that TVM
may place barriers inside it); a thread guard is not. So the launch runs at the thread count of its
synchronising members (shared memory, barriers), which must all have it; a member that does not
synchronise joins at any count, its thread axes flattened onto the launch's flattened index ``t`` (x
fastest): with fewer threads under ``if t < T_i``, with more in a serial loop over its own flattened
index (``t + k * T`` for ``k < ceil(T_i / T)``). A member that reduces across threads keeps its own
thread loops (TVM lowers the reduction from them), nested in the launch's loops over the same axes,
so the launch takes its thread shape (extent per axis) or one its loops are split into, as a schedule
would split them (:func:`_placement`): a reduction over X*Y lanes runs on X x Y threads (TVM flattens
a reduction's lanes x fastest, so the reduction tree is the same), and beside it one over X lanes runs
its rows Y at a time in a serial loop, or, with one row per block, Y of its blocks per launch block.
Each output is computed by the same operations in the same order as in the member alone, so outputs
stay bit-identical to the ungrouped build (dlight's 64-lane and 32x8 reductions on Vulkan share a
32x2 launch; on OpenCL its 256-lane and 64-lane ones a 64x4 launch). Members a fused launch cannot take
form further fused launches among themselves or stay their own launch: PrimFuncs that are not one
loop nest under ``blockIdx`` axes (several kernels, no block axis, a thread axis bound with two
extents, virtual threads, scalar or dynamic-shape parameters), and whatever would push the fused
grid past :data:`MAX_BLOCKS`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.tirx import buffer as tir_buffer

from .inplace import prim_func_of
from .ir_utils import top_level_bindings
from .module import referenced_globals, relax_functions, with_blocks

GROUPS_ATTR = "tvm_memplan.kernel_groups"
"""Function attribute the arena planner leaves: the group index of each kernel call, in call order."""
FUSION_PASS_NAME = "tvm_memplan.FuseGroupKernels"
BLOCK_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
THREAD_TAGS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")
MAX_BLOCKS = 65535
"""Fused grid limit: the smallest ``maxComputeWorkGroupCount[0]`` Vulkan allows (CUDA and OpenCL allow more)."""
_SYNC_OPS = ("tirx.tvm_storage_sync", "tirx.tvm_thread_allreduce", "tirx.tvm_warp_shuffle")
_COMM_REDUCE = 2
_MOVABLE_OPS = tuple(
    tvm.ir.Op.get(name)
    for name in (
        "relax.memory.alloc_tensor",
        "relax.builtin.alloc_tensor",
        "relax.memory.ensure_zero_offset",
        "relax.reshape",
        "relax.memory.view",
    )
)
"""Bindings a fused call may move past: they launch nothing and read no tensor's bytes."""


@dataclass
class KernelNest:
    """A PrimFunc that is one thread-bound loop nest: what fusion needs of it."""

    func: tirx.PrimFunc
    blocks: dict[str, tuple[tvm.ir.Var, int]]
    """Block axis tag → (loop variable, extent)."""
    threads: dict[str, tuple[tvm.ir.Var, int]]
    """Thread axis tag → (loop variable, extent)."""
    body: tirx.Stmt
    """Everything inside the nest, inner loops over the same thread axes folded into the outer ones."""
    alloc_buffers: list = field(default_factory=list)
    uniform: bool = False
    """The body synchronises its threads: every thread of a block must take the same branch."""
    reduces_across_threads: bool = False
    """A reduction across threads: TVM lowers it from the thread loops around it, so ``body`` keeps
    the thread loops below the blocks and the launch must have this nest's thread shape or one they
    split into (:func:`_placement`)."""
    bound_above: tuple[str, ...] = ()
    """Thread tags bound above everything: their loop variables are free in ``body`` (all tags
    where the inner thread loops are folded into them)."""
    reduced: tuple[str, ...] = ()
    """Thread tags a reduction runs across (the other axes index independent rows)."""

    @property
    def block_count(self) -> int:
        return math.prod(extent for _, extent in self.blocks.values())

    @property
    def thread_count(self) -> int:
        return math.prod(extent for _, extent in self.threads.values())

    @property
    def thread_shape(self) -> tuple[tuple[str, int], ...]:
        """(tag, extent) per thread axis, x first."""
        return tuple((tag, self.threads[tag][1]) for tag in THREAD_TAGS if tag in self.threads)


def _is_const(expr: object) -> bool:
    return isinstance(expr, tirx.IntImm)


def _is_thread_loop(node: object) -> bool:
    return isinstance(node, tirx.For) and int(node.kind) == int(tirx.ForKind.THREAD_BINDING)


def _walk(node: object, on_node) -> None:
    """Call ``on_node`` on every object under ``node`` (pre-order)."""
    tvm_ffi.structural_walk(node, on_node, order="pre")


def _uses(expr: object, variables: Sequence[tvm.ir.Var]) -> bool:
    hits = []
    _walk(
        expr,
        lambda n: hits.append(True) if isinstance(n, tvm.ir.Var) and any(n.same_as(v) for v in variables) else None,
    )
    return bool(hits)


def _synchronisation(
    body: tirx.Stmt, alloc_buffers: Sequence, threads: dict[str, tuple[tvm.ir.Var, int]]
) -> tuple[bool, tuple[str, ...]]:
    """(threads synchronise: shared memory, a barrier or a reduction across threads; the thread
    tags reductions run across)."""
    shared = [any(str(b.ty.storage_scope).startswith("shared") for b in alloc_buffers)]
    reduced: set[str] = set()

    def visit(node: object) -> None:
        if isinstance(node, s_tir.SBlock):
            shared[0] |= any(str(b.ty.storage_scope).startswith("shared") for b in node.alloc_buffers)
        elif isinstance(node, s_tir.SBlockRealize):
            for iv, value in zip(node.block.iter_vars, node.iter_values, strict=True):
                if int(iv.iter_type) == _COMM_REDUCE:
                    reduced.update(tag for tag, (var, _) in threads.items() if _uses(value, [var]))
        elif isinstance(node, tvm.ir.Call) and isinstance(node.op, tvm.ir.Op):
            shared[0] |= node.op.name in _SYNC_OPS

    _walk(body, visit)
    return shared[0] or bool(reduced), tuple(tag for tag in THREAD_TAGS if tag in reduced)


def kernel_nest(func: tirx.PrimFunc) -> KernelNest | None:
    """``func`` as one loop nest over ``blockIdx`` axes, its thread axes bound anywhere below them
    with one extent each (cooperative fetches and dlight's reductions bind them more than once),
    virtual threads of extent 1 allowed; None where it is anything else."""
    if not all(tir_buffer.is_buffer_var(p) and all(_is_const(d) for d in p.ty.shape) for p in func.params):
        return None
    root = func.body
    if not isinstance(root, s_tir.SBlockRealize):
        return None
    block = root.block
    if len(block.iter_vars) or len(block.match_buffers) or block.init is not None:
        return None
    stmt = block.body
    axes: dict[str, tuple[tvm.ir.Var, int]] = {}
    mapping: dict = {}
    while _is_thread_loop(stmt):
        tag = str(stmt.thread_binding.thread_tag)
        if tag in axes or not (_is_const(stmt.min) and int(stmt.min.value) == 0 and _is_const(stmt.extent)):
            return None
        if tag.startswith("vthread"):
            if int(stmt.extent.value) != 1:
                return None
            mapping[stmt.loop_var] = tirx.const(0, stmt.loop_var.ty)
        elif tag in BLOCK_TAGS or tag in THREAD_TAGS:
            axes[tag] = (stmt.loop_var, int(stmt.extent.value))
        else:
            return None
        stmt = stmt.body
    blocks = {t: axes[t] for t in BLOCK_TAGS if t in axes}
    threads = {t: axes[t] for t in THREAD_TAGS if t in axes}
    if not blocks:
        return None
    inner: list = []
    _walk(stmt, lambda n: inner.append(n) if _is_thread_loop(n) else None)
    for loop in inner:  # threads bound below the blocks (dlight's reductions bind them twice)
        tag = str(loop.thread_binding.thread_tag)
        if tag not in THREAD_TAGS or not (_is_const(loop.extent) and _is_const(loop.min) and int(loop.min.value) == 0):
            return None  # blocks below blocks: a second kernel
        threads.setdefault(tag, (loop.loop_var, int(loop.extent.value)))
        if int(loop.extent.value) != threads[tag][1]:
            return None  # one axis bound with two extents: no single thread count serves both
        mapping[loop.loop_var] = threads[tag][0]
    body = _substitute(stmt, mapping, unroll_thread_loops=True)
    alloc_buffers = list(block.alloc_buffers)
    uniform, reduced = _synchronisation(body, alloc_buffers, threads)
    if not reduced:
        return KernelNest(func, blocks, threads, body, alloc_buffers, uniform, False, tuple(threads))
    # TVM lowers a reduction across threads from the thread loops around it: keep them
    outer = {var: value for var, value in mapping.items() if not any(var.same_as(loop.loop_var) for loop in inner)}
    above = tuple(tag for tag in threads if tag in axes)
    return KernelNest(func, blocks, threads, _substitute(stmt, outer), alloc_buffers, uniform, True, above, reduced)


def _substitute(stmt: tirx.Stmt, mapping: dict, unroll_thread_loops: bool = False) -> tirx.Stmt:
    """``stmt`` with variables replaced (loop variables by expressions, buffers by buffers) and,
    with ``unroll_thread_loops``, every thread-bound loop replaced by its body."""
    if not mapping and not unroll_thread_loops:
        return stmt

    def swap(var: tvm.ir.Var) -> object:
        for old, new in mapping.items():
            if var.same_as(old):
                return new
        return var

    callbacks = [(tvm.ir.Var, swap)]
    if unroll_thread_loops:
        callbacks.append((tirx.For, lambda loop: loop.body if _is_thread_loop(loop) else loop))
    return tvm_ffi.structural_map(stmt, callbacks)


def _as(dtype: object, expr: tirx.Expr) -> tirx.Expr:
    return expr if expr.ty == dtype else tirx.Cast(dtype, expr)


ThreadShape = tuple[tuple[str, int], ...]
"""(thread tag, extent) per thread axis of a launch, x first."""


def _lanes_rows(nest: KernelNest) -> tuple[int, int]:
    """A reduction's threads as (``threadIdx.x`` extent, ``threadIdx.y`` extent)."""
    return nest.threads.get(THREAD_TAGS[0], (None, 1))[1], nest.threads.get(THREAD_TAGS[1], (None, 1))[1]


def _placement(nest: KernelNest, shape: ThreadShape) -> str | None:
    """How a reduction across threads runs in a launch of thread shape ``shape``, None where it cannot.

    Each is what a schedule's split of a thread loop gives, so TVM lowers the same reduction tree and
    every output is computed by the same operations in the same order:
    ``"same"``: its own shape; ``"lanes"``: its ``threadIdx.x`` loops (X*Y lanes) split into
    ``threadIdx.y`` (Y) x ``threadIdx.x`` (X), x fastest as TVM flattens the lanes of a reduction;
    ``"rows"``: its ``threadIdx.y`` loops (R independent rows) split into a serial loop of R/Y around
    ``threadIdx.y`` (Y); ``"pack"``: one row per block, so Y of its blocks share a launch block,
    one per ``threadIdx.y``."""
    if nest.thread_shape == shape:
        return "same"
    if nest.bound_above or nest.reduced != THREAD_TAGS[:1] or not set(nest.threads) <= set(THREAD_TAGS[:2]):
        return None
    lanes, rows = _lanes_rows(nest)
    x, y = dict(shape).get(THREAD_TAGS[0], 1), dict(shape).get(THREAD_TAGS[1], 1)
    if len(shape) > 2 or y == 1:
        return None
    if lanes == x * y and rows == 1:
        return "lanes"
    if lanes == x and rows > y and rows % y == 0:
        return "rows"
    if lanes == x and rows == 1 and nest.block_count % y == 0:
        return "pack"
    return None


def _launch_blocks(nest: KernelNest, shape: ThreadShape) -> int:
    """The launch's blocks ``nest`` takes in a launch of thread shape ``shape``."""
    packed = nest.reduces_across_threads and _placement(nest, shape) == "pack"
    return nest.block_count // dict(shape)[THREAD_TAGS[1]] if packed else nest.block_count


def _joins(nest: KernelNest, shape: ThreadShape) -> bool:
    """Whether ``nest`` can run in a launch of thread shape ``shape`` (see the module docstring)."""
    if nest.reduces_across_threads:
        return _placement(nest, shape) is not None
    return not nest.uniform or nest.thread_count == math.prod(extent for _, extent in shape)


def _candidates(nests: Sequence[KernelNest]) -> list[ThreadShape]:
    """Launch thread shapes to try, most threads first: each reduction's own shape, X x Y for two
    reductions of X and X*Y lanes, each synchronising member's count, and the largest count."""
    largest = max(n.thread_count for n in nests)
    across = [n for n in nests if n.reduces_across_threads]
    shapes = {n.thread_shape for n in across}
    lanes = {_lanes_rows(n)[0] for n in across}
    shapes |= {
        ((THREAD_TAGS[0], x), (THREAD_TAGS[1], wide // x))
        for x in lanes
        for wide in lanes
        if wide > x and wide % x == 0
    }
    shapes |= {((THREAD_TAGS[0], n.thread_count),) for n in nests if n.uniform or n.thread_count == largest}
    return sorted(shapes, key=lambda shape: (-math.prod(extent for _, extent in shape), shape))


def _members(nests: Sequence[KernelNest], shape: ThreadShape) -> list[int]:
    """The nests that join a launch of ``shape``, in order, within :data:`MAX_BLOCKS` and with one
    index type for the reductions across threads (they nest in the launch's thread loops)."""
    chosen, blocks, index_type = [], 0, None
    for i, nest in enumerate(nests):
        if not _joins(nest, shape) or blocks + _launch_blocks(nest, shape) > MAX_BLOCKS:
            continue
        if nest.reduces_across_threads:
            own = str(next(iter(nest.threads.values()))[0].ty)
            if index_type not in (None, own):
                continue
            index_type = own
        chosen.append(i)
        blocks += _launch_blocks(nest, shape)
    return chosen


def launch_shape(nests: Sequence[KernelNest]) -> ThreadShape:
    """The thread shape a fused launch of ``nests`` runs with: the first of :func:`_candidates` all
    of them join (reductions across threads fix it, then members that synchronise, else the largest
    count wins, so no member loops over its threads)."""
    return next(shape for shape in _candidates(nests) if len(_members(nests, shape)) == len(nests))


def select_members(nests: Sequence[KernelNest]) -> list[int]:
    """Which of a group's fusable kernels join, in order: those of the launch thread shape most
    kernels can run with (see :func:`_candidates`; on a tie the one with more threads, so fewer
    members loop), the fused grid within :data:`MAX_BLOCKS`."""
    best: list[int] = []
    for shape in _candidates(nests):
        chosen = _members(nests, shape)
        if len(chosen) > len(best):
            best = chosen
    return best


def _flat_index(flat: tirx.Expr, axes: dict[str, tuple[tvm.ir.Var, int]], tags: Sequence[str], total: int) -> dict:
    """Each axis variable as a function of the flattened index (the first tag varies fastest)."""
    mapping, stride = {}, 1
    for tag in tags:
        if tag not in axes:
            continue
        var, extent = axes[tag]
        dtype = flat.ty
        index = tirx.floordiv(flat, tirx.const(stride, dtype)) if stride > 1 else flat
        if stride * extent < total:
            index = tirx.floormod(index, tirx.const(extent, dtype))
        mapping[var] = tirx.const(0, var.ty) if extent == 1 else _as(var.ty, index)
        stride *= extent
    return mapping


def fuse_nests(
    nests: Sequence[KernelNest], args: Sequence[Sequence[relax.Expr]]
) -> tuple[tirx.PrimFunc, list[relax.Expr]]:
    """One PrimFunc running every nest in its own range of blocks, and the arguments to call it with.

    Parameters are the union of the members'; a Relax variable two members take through buffers of
    the same type is passed once.
    """
    across = [n for n in nests if n.reduces_across_threads]
    # a reduction across threads nests in the launch's thread loops: they take its index type
    dtype = next(iter(across[0].threads.values()))[0].ty if across else next(iter(nests[0].blocks.values()))[0].ty
    shape = launch_shape(nests)
    threads = math.prod(extent for _, extent in shape)
    total = sum(_launch_blocks(n, shape) for n in nests)
    block_var = tirx.Var("group_block", dtype)
    thread_vars = {tag: tirx.Var(f"group_thread_{tag[-1]}", dtype) for tag, _ in shape}
    (fastest, stride), *slower = shape
    flat = thread_vars[fastest]  # the launch's flattened thread index, x fastest
    for tag, extent in slower:
        flat = flat + thread_vars[tag] * tirx.const(stride, dtype)
        stride *= extent
    params: list[tvm.ir.Var] = []
    call_args: list[relax.Expr] = []
    branches: list[tuple[int, tirx.Stmt]] = []
    alloc_buffers: list = []
    start = 0
    for nest, member_args in zip(nests, args, strict=True):
        mapping: dict = {}
        for param, arg in zip(nest.func.params, member_args, strict=True):
            shared = next(
                (
                    p
                    for p, a in zip(params, call_args, strict=True)
                    if a.same_as(arg) and tvm_ffi.structural_equal(p.ty, param.ty, map_free_vars=True)
                ),
                None,
            )
            if shared is None:
                params.append(param)
                call_args.append(arg)
            else:
                mapping[param] = shared
        local = block_var - tirx.const(start, dtype) if start else block_var
        placement = _placement(nest, shape) if nest.reduces_across_threads else None
        if placement == "pack":  # Y of its blocks per launch block, one per threadIdx.y
            rows = dict(shape)[THREAD_TAGS[1]]
            local = local * tirx.const(rows, dtype) + thread_vars[THREAD_TAGS[1]]
        mapping.update(_flat_index(local, nest.blocks, BLOCK_TAGS, nest.block_count))
        if placement is not None:  # its own thread loops, reshaped, nest in the launch's
            mapping.update(
                {nest.threads[tag][0]: _as(nest.threads[tag][0].ty, thread_vars[tag]) for tag in nest.bound_above}
            )
            body = _reshape_threads(_substitute(nest.body, mapping), placement, shape)
        else:
            body = _thread_range(nest, mapping, flat, threads)
        alloc_buffers += nest.alloc_buffers
        start += _launch_blocks(nest, shape)
        branches.append((start, body))
    # one branch per member, its condition bounded on both sides (buffer compaction reads the
    # bounds, so members' local buffers keep their sizes) and the same for every thread of a block
    # (barriers inside stay legal); chained with else: with a run of separate ifs, PoCL computed a
    # member with barriers wrong here
    begin, conditions = 0, []
    for end, _ in branches:
        inside = tirx.LT(block_var, tirx.const(end, dtype))
        if begin:
            inside = tirx.And(tirx.GE(block_var, tirx.const(begin, dtype)), inside)
        conditions.append(tirx.op.tvm_thread_invariant(inside))
        begin = end
    dispatch = tirx.IfThenElse(conditions[-1], branches[-1][1], None)
    for condition, (_, body) in reversed(list(zip(conditions, branches, strict=True))[:-1]):
        dispatch = tirx.IfThenElse(condition, body, dispatch)
    for tag, extent in shape:  # x innermost
        dispatch = _thread_loop(thread_vars[tag], tag, extent, dispatch)
    outer = _thread_loop(block_var, BLOCK_TAGS[0], total, dispatch)
    root = s_tir.SBlock([], [], [], "root", outer, alloc_buffers=alloc_buffers)
    attrs = {"tirx.is_scheduled": True, "tirx.noalias": True}
    return tirx.PrimFunc(params, s_tir.SBlockRealize([], True, root)).with_attrs(attrs), call_args


def _reshape_threads(body: tirx.Stmt, placement: str, shape: ThreadShape) -> tirx.Stmt:
    """``body``'s thread loops as :func:`_placement` describes for ``placement`` in a launch of
    thread shape ``shape`` (x = ``threadIdx.x`` extent, y = ``threadIdx.y`` extent)."""
    if placement == "same":
        return body
    x, y = dict(shape)[THREAD_TAGS[0]], dict(shape)[THREAD_TAGS[1]]

    def reshape(loop: tirx.For) -> tirx.Stmt:
        if not _is_thread_loop(loop):
            return loop
        tag, var, extent = str(loop.thread_binding.thread_tag), loop.loop_var, int(loop.extent.value)
        dtype = var.ty
        if tag == THREAD_TAGS[1] and extent == 1:  # "pack": threadIdx.y picks the block instead
            return _substitute(loop.body, {var: tirx.const(0, dtype)})
        if placement == "lanes" and tag == THREAD_TAGS[0]:
            lane, row = tirx.Var(f"{var.name}_x", dtype), tirx.Var(f"{var.name}_y", dtype)
            inner = _substitute(loop.body, {var: lane + row * tirx.const(x, dtype)})
            return _thread_loop(row, THREAD_TAGS[1], y, _thread_loop(lane, THREAD_TAGS[0], x, inner))
        if placement == "rows" and tag == THREAD_TAGS[1]:
            row, step = tirx.Var(f"{var.name}_y", dtype), tirx.Var(f"{var.name}_round", dtype)
            inner = _substitute(loop.body, {var: row + step * tirx.const(y, dtype)})
            return tirx.For(
                step,
                tirx.const(0, dtype),
                tirx.const(extent // y, dtype),
                tirx.ForKind.SERIAL,
                _thread_loop(row, THREAD_TAGS[1], y, inner),
            )
        return loop

    return tvm_ffi.structural_map(body, [(tirx.For, reshape)])


def _thread_range(nest: KernelNest, mapping: dict, flat: tirx.Expr, threads: int) -> tirx.Stmt:
    """``nest``'s body for every thread index it has, run by a block of ``threads`` threads whose
    flattened index is ``flat``: guarded where it has fewer, in a serial loop where it has more."""
    dtype = flat.ty
    count = nest.thread_count
    rounds = -(-count // threads)
    step = tirx.Var("group_round", dtype)
    index = flat + step * tirx.const(threads, dtype) if rounds > 1 else flat
    mapping = {**mapping, **_flat_index(index, nest.threads, THREAD_TAGS, max(count, threads))}
    body = _substitute(nest.body, mapping)
    if count % threads:
        body = tirx.IfThenElse(tirx.LT(index, tirx.const(count, dtype)), body, None)
    if rounds > 1:
        body = tirx.For(step, tirx.const(0, dtype), tirx.const(rounds, dtype), tirx.ForKind.SERIAL, body)
    return body


def _thread_loop(var: tvm.ir.Var, tag: str, extent: int, body: tirx.Stmt) -> tirx.For:
    dtype = var.ty
    binding = tirx.IterVar(None, tirx.Var(tag.replace(".", "_"), dtype), tirx.IterVar.ThreadIndex, tag)
    return tirx.For(var, tirx.const(0, dtype), tirx.const(extent, dtype), tirx.ForKind.THREAD_BINDING, body, binding)


def _movable(binding: relax.Binding) -> bool:
    value = binding.value
    if isinstance(value, (relax.Var, relax.TupleGetItem)):
        return True
    return isinstance(value, relax.Call) and any(value.op.same_as(op) for op in _MOVABLE_OPS)


@dataclass(eq=False)
class _Member:
    block: int
    position: int
    binding: relax.VarBinding
    nest: KernelNest | None


def _fuse_function(func: relax.Function, mod: tvm.IRModule, group_of: Sequence[int], add) -> relax.Function:
    """``func`` with each fusable group's calls replaced by one call of a fused PrimFunc (``add``
    puts it into the module and returns its GlobalVar)."""
    blocks = list(func.body.blocks)
    calls = [
        (b, i, binding)
        for b, block in enumerate(blocks)
        for i, binding in enumerate(block.bindings)
        if prim_func_of(binding.value, mod) is not None
    ]
    if len(calls) != len(group_of):
        return func  # not the function the planner saw
    members: dict[int, list[_Member]] = {}
    for (b, i, binding), group in zip(calls, group_of, strict=True):
        members.setdefault(group, []).append(_Member(b, i, binding, None))
    removed: dict[int, set[int]] = {}
    placed: dict[tuple[int, int], relax.VarBinding] = {}
    for group in members.values():
        if len(group) < 2 or len({m.block for m in group}) != 1:
            continue
        for m in group:  # fresh variables and buffers: a group may call one PrimFunc twice
            m.nest = kernel_nest(s_tir.renew_defs(prim_func_of(m.binding.value, mod)))
        candidates = [m for m in group if m.nest is not None]
        in_group = {m.position for m in group}
        while len(candidates) > 1:  # kernels one fused launch cannot take may form another
            chosen = [candidates[i] for i in select_members([m.nest for m in candidates])]
            if len(chosen) < 2:
                break
            candidates = [m for m in candidates if m not in chosen]
            block, first, last = chosen[0].block, chosen[0].position, chosen[-1].position
            if not all(i in in_group or _movable(blocks[block].bindings[i]) for i in range(first, last)):
                break
            fused, args = fuse_nests([m.nest for m in chosen], [list(m.binding.value.args) for m in chosen])
            if not s_tir.analysis.verify_well_formed(fused, assert_mode=False):
                break  # a construct this pass does not foresee: the members stay as they are
            call = relax.Call(add(fused), args)
            placed[(block, last)] = relax.VarBinding(relax.Var("group_launch", chosen[-1].binding.var.ty), call)
            removed.setdefault(block, set()).update(m.position for m in chosen)
    if not placed:
        return func
    new_blocks = []
    for b, block in enumerate(blocks):
        bindings = []
        for i, binding in enumerate(block.bindings):
            if (b, i) in placed:
                bindings.append(placed[(b, i)])
            elif i not in removed.get(b, ()):
                bindings.append(binding)
        new_blocks.append(type(block)(bindings))
    return with_blocks(func, new_blocks)


def FuseGroupKernels() -> tvm.transform.Pass:  # noqa: N802 - named like TVM's passes
    """Every group the arena planner recorded runs as one launch (see the module docstring).

    Runs after ``ArenaPlanBlockMemory`` (and ``KernelOffsetParams``) on GPU targets; functions
    without the planner's group attribute, and groups with fewer than two fusable kernels, are left
    as they are. PrimFuncs no call uses any more are dropped.
    """

    @tvm.transform.module_pass(opt_level=0, name=FUSION_PASS_NAME)
    def _pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        functions = dict(mod.functions)
        taken = {gvar.name_hint for gvar in functions}
        replaced: set[str] = set()

        def add(prim: tirx.PrimFunc) -> tvm.ir.GlobalVar:
            name = next(f"group_kernel{i}" for i in range(len(taken) + 1) if f"group_kernel{i}" not in taken)
            taken.add(name)
            gvar = relax.BlockBuilder().add_func(prim, name)  # a GlobalVar typed as Relax calls need
            functions[gvar] = prim
            return gvar

        for gvar, func in relax_functions(mod):
            attrs = func.attrs
            if attrs is None or GROUPS_ATTR not in attrs:
                continue
            new_func = _fuse_function(func, mod, [int(g) for g in attrs[GROUPS_ATTR]], add)
            if not new_func.same_as(func):
                functions[gvar] = new_func
                replaced |= {
                    b.value.op.name_hint for b in top_level_bindings(func) if prim_func_of(b.value, mod) is not None
                }
        if not replaced:
            return mod
        new_mod = tvm.IRModule(functions, attrs=mod.attrs)
        unused = replaced - referenced_globals(new_mod)
        return tvm.IRModule({g: f for g, f in functions.items() if g.name_hint not in unused}, attrs=mod.attrs)

    return _pass
