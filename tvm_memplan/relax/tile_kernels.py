"""One kernel per split chain: every stage of a tile runs before the next tile starts, in one call.

The split rewriter outlines a chain whose tiles are to run as one kernel into a private Relax function
(:mod:`~tvm_memplan.relax.split.outline`), which TVM legalizes and fuses like ``main``: after ``FuseTIR``
(and :func:`~tvm_memplan.relax.tile_writes.WriteTilesInPlace`) it is a sequence of per-tile kernel
calls. :func:`MergeTileKernels` schedules each of those kernels as :class:`~tvm_memplan.schedule.
DefaultCPUSchedule` would and turns them into one PrimFunc that loops over the tiles. Tiles differ in
the rows they read and write, that is in integer constants of their buffer accesses' indices; every
tile's statement (its kernels' bodies in call order) is anti-unified with those of the tiles before it
(:func:`_tile_classes`): tiles whose statements are equal up to those constants are one class, one
body in the loop, each of its differing constants an expression of the tile index (affine where the
constants are, else a small table). The first and last tiles (padding), tiles of another height
(uneven row ranges) and a worker's first tile of a line buffer (no rows kept yet) are classes of their
own, so the kernel holds a handful of bodies however many tiles there are, and its compile time no
longer grows with them (the stages of one tile, or each stage's own parallel loops, as below).

The chain's inputs and its output are that PrimFunc's parameters; every tensor that lives only inside
the chain (tile buffers) becomes a view into one scratch parameter, at offsets planned by the arena
allocators over the kernels' sequence; a tensor a kernel only copies out of a chain input (a tile's
rows of it, :func:`_copy_view`) is no buffer at all: the kernels reading it read the input in place,
through a strided view at the tile's offset. The scratch is a second output of the call, so the arena
planner places it like any tensor and the VM allocates exactly the plan (no ``TVMBackendAllocWorkspace``).
Halo rows are recomputed, as the per-kernel tiles do, or kept in a rolling line buffer
(:attr:`~tvm_memplan.split.chain.SplitChoice.rolling`): the rewriter then links each worker's tiles by
the rows they carry over, so a worker runs its run of tiles in order (:func:`_tile_groups` finds the
runs, one per worker; :func:`_tiles` the tiles, cut where ``place_rows`` takes the kept rows over).

A spatial chain's row tiles are independent (they share only the chain's inputs and its output, each
writing its own rows; :data:`~.split.outline.WORKERS_ATTR`): on a target with a thread pool the merged
kernel is one loop nest, ``for worker in parallel(W): for tile in its share: every stage of that tile``
(parallel over tiles),
the stages' own parallel loops run serially inside a tile (their vectorized loops stay), and each worker
has a scratch region of its own (W times one tile's buffers, which the simulator counts,
:attr:`~tvm_memplan.split.chain.SplitChoice.concurrent_tiles`). With one worker the tile loop is serial
and each stage keeps its parallel loops (parallel within a tile). A channel chain's tiles accumulate
into one output: its kernels run one after another, each stage parallel as scheduled (no tile loop).

Where the kernels cannot be merged (a call this pass does not model, a GPU target whose kernels are
bound to threads), the chain's calls go back into the caller one by one: the per-kernel tiles.

MCUNetV2 (Lin et al., NeurIPS 2021) and TinyEngine run a patch through the first stages the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.ir import Range
from tvm.ir.expr import TensorLoad, TensorRegion
from tvm.sym import Analyzer, detect_linear_equation

from ..planning import Buffer, Problem, align_up, plan_aliased
from ..schedule.cpu import CpuSpec, cpu_spec
from ..schedule.passes import schedule_function
from .inplace import inplace_safe
from .ir_utils import static_shape, top_level_bindings
from .module import referenced_globals, relax_functions, with_blocks
from .split.outline import TILES_ATTR, WORKERS_ATTR, rebind
from .tile_writes import CARRIED_ROWS_ATTR

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
_CALL_TIR_INPLACE = tvm.ir.Op.get("relax.call_tir_inplace")
_ALIGNMENT = 64
"""Byte alignment of every view in the scratch buffer (what the arena gives every tensor)."""
_VIEW_OFFSET = "input_view_offset"
"""Names the variable holding where a tile's view of a chain input starts (a hole of its tile class)."""


@dataclass
class _Kernel:
    func: tirx.PrimFunc
    tensors: list[relax.Expr]
    """The Relax tensor each parameter is, in parameter order (for an in-place call, the output is
    the input it overwrites)."""
    writes_new: bool
    """Its last parameter is a tensor it creates (``call_tir``), not one it updates in place."""


@dataclass
class MergedChain:
    func: tirx.PrimFunc
    """Parameters: the chain's inputs, its output, the scratch buffer."""
    inputs: list[relax.Expr]
    scratch: relax.TensorType


def _kernels(func: relax.Function, mod: tvm.IRModule) -> tuple[list[_Kernel], relax.Expr] | None:
    """The chain function's kernel calls, and the tensor it returns (its variables resolved through
    aliases and in-place calls), or None where it holds anything else."""
    root: dict[relax.Var, relax.Expr] = {}

    def resolve(expr: relax.Expr) -> relax.Expr:
        return root.get(expr, expr) if isinstance(expr, relax.Var) else expr

    kernels = []
    for binding in top_level_bindings(func):
        value = binding.value
        if isinstance(value, relax.Var):
            root[binding.var] = resolve(value)
            continue
        if not isinstance(value, relax.Call) or not isinstance(binding.var.ty, relax.TensorType):
            return None
        if not (value.op.same_as(_CALL_TIR) or value.op.same_as(_CALL_TIR_INPLACE)):
            return None
        prim = mod[value.args[0]]
        args = [resolve(a) for a in value.args[1].fields]
        tensors = all(isinstance(a, (relax.Var, tvm.ir.GenericConst)) for a in args)
        if not isinstance(prim, tirx.PrimFunc) or not tensors:
            return None
        if value.op.same_as(_CALL_TIR):
            kernels.append(_Kernel(prim, [*args, binding.var], True))
        else:
            (index,) = [int(i) for i in value.attrs.inplace_indices]
            root[binding.var] = args[index]
            kernels.append(_Kernel(prim, args, False))
        if len(kernels[-1].tensors) != len(prim.params):
            return None
    return kernels, resolve(func.body.body)


@dataclass
class _InputView:
    """A tensor that a copy kernel cuts out of a chain input, read in place instead: the input's elements
    ``offset + sum(strides[k] * index[k])``."""

    source: relax.Var
    offset: int
    strides: list[int]


def _copy_view(func: tirx.PrimFunc, within: _InputView | None = None) -> tuple[int, list[int]] | None:
    """``(offset, strides)`` where the kernel ``func(input, output)`` only copies elements of its input to
    its output, each output element the input's flat element ``offset + sum(strides[k] * index[k])``
    (a row slice, a reshape or a blocking after it: a tile's rows of an input), else None; ``within``:
    the input is itself a view, the offset and strides are then of its source. Its stages are inlined
    into the last, whose value must then be a load of the input at indices affine in the output's."""
    if len(func.params) != 2:
        return None
    names: list[str] = []
    tvm_ffi.structural_walk(
        func.body, lambda n: names.append(n.name_hint) if isinstance(n, s_tir.SBlock) else None, order="pre"
    )
    names = [n for n in names if n != "root"]
    if not names:
        return None
    schedule = s_tir.Schedule(tvm.IRModule({"main": func}))
    try:
        for name in names[:-1]:
            schedule.compute_inline(schedule.get_sblock(name))
    except Exception:  # noqa: BLE001 - any stage that does not inline: not a plain copy
        return None
    blocks: list[s_tir.SBlock] = []
    tvm_ffi.structural_walk(
        schedule.mod["main"].body,
        lambda n: blocks.append(n) if isinstance(n, s_tir.SBlock) and n.name_hint != "root" else None,
        order="pre",
    )
    data, out = func.params
    if len(blocks) != 1 or blocks[0].init is not None:
        return None
    (block,) = blocks
    store, variables = block.body, [iv.var for iv in block.iter_vars]
    if not (isinstance(store, tirx.BufferStore) and isinstance(store.value, TensorLoad)):
        return None
    if not (store.buffer.same_as(out) and store.value.source.same_as(data)):
        return None
    if len(store.indices) != len(variables) or not all(
        i.same_as(v) for i, v in zip(store.indices, variables, strict=True)
    ):
        return None
    analyzer = Analyzer()
    for iv in block.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    index_type = variables[0].ty
    flat, stride = tirx.IntImm(index_type, within.offset if within else 0), 1
    strides = [tirx.IntImm(index_type, s) for s in within.strides] if within else []
    for k, (index, extent) in reversed(list(enumerate(zip(store.value.indices, data.ty.shape, strict=True)))):
        flat, stride = flat + index * (strides[k] if within else stride), stride * extent
    coefficients = detect_linear_equation(analyzer.simplify(flat), variables)
    if len(coefficients) != len(variables) + 1 or not all(isinstance(c, tirx.IntImm) for c in coefficients):
        return None
    *strides, offset = (int(c) for c in coefficients)
    return offset, strides


def _input_views(kernels: list[_Kernel], params: list[relax.Var]) -> dict[relax.Var, _InputView]:
    """The tensors that kernels of the chain copy out of its inputs (a tile's rows of an input: a row slice,
    the blocked layout's reshape of a stem's NCHW input to NCHW1c) that nothing writes afterwards: the
    kernels reading them can read the input in place, in the rows the tile needs, with no copy."""
    views: dict[relax.Var, _InputView] = {}
    for kernel in kernels:
        data, out = kernel.tensors if len(kernel.tensors) == 2 else (None, None)
        if not kernel.writes_new or not isinstance(data, relax.Var):
            continue
        if not (data in views or any(data.same_as(p) for p in params)) or str(data.ty.dtype) != str(out.ty.dtype):
            continue
        written = any(not k.writes_new and any(t.same_as(out) for t in k.tensors) for k in kernels)
        found = None if written else _copy_view(kernel.func, views.get(data))
        if found is not None:
            views[out] = _InputView(views[data].source if data in views else data, *found)
    return views


def _in_place_sources(kernels: list[_Kernel], inside: list[relax.Var]) -> dict[relax.Var, relax.Var]:
    """Tensor → the inner tensor it overwrites: a kernel's new output over an input read there for the
    last time, where the kernel reads it elementwise (the planner's in-place rule,
    :func:`~tvm_memplan.relax.inplace.inplace_safe`)."""
    last = {t: i for i, k in enumerate(kernels) for t in k.tensors if isinstance(t, relax.Var)}
    sources: dict[relax.Var, relax.Var] = {}
    for i, kernel in enumerate(kernels):
        if not kernel.writes_new:
            continue
        *reads, out = kernel.tensors
        for j, tensor in enumerate(reads):
            once = sum(t.same_as(tensor) for t in reads) == 1
            free = tensor in inside and last[tensor] == i and tensor not in sources.values()
            if once and free and inplace_safe(kernel.func, j, len(reads)):
                sources[out] = tensor
                break
    return sources


def _scratch_offsets(
    kernels: list[_Kernel], inside: list[relax.Var], output: relax.Var
) -> tuple[dict[relax.Var, int], set[relax.Var], int, str] | None:
    """Element offsets of the chain's inner tensors in one scratch buffer (planned over the kernels'
    sequence by the arena allocators, in-place outputs over their inputs), the inner tensors that
    live in the output instead (overwritten by it in place), the scratch's element count and dtype;
    None unless they share a dtype."""
    dtypes = {str(v.ty.dtype) for v in inside}
    if len(dtypes) != 1:
        return None
    (dtype,) = dtypes
    itemsize = np.dtype(dtype).itemsize
    sources = _in_place_sources(kernels, inside)

    def root(tensor: relax.Var) -> relax.Var:
        while tensor in sources:
            tensor = sources[tensor]
        return tensor

    in_output = {t for t in inside if root(output).same_as(root(t))}
    planned = [t for t in inside if t not in in_output]
    index = {t: i for i, t in enumerate(planned)}
    buffers = []
    for v in planned:
        steps = [i for i, k in enumerate(kernels) if any(t.same_as(v) for t in k.tensors)]
        buffers.append(Buffer(v, int(np.prod(static_shape(v.ty))) * itemsize, steps[0], steps[-1] + 1))
    aliases = {index[t]: (index[root(t)], 0) for t in planned if not root(t).same_as(t)}
    plan, _ = plan_aliased(Problem(buffers, alignment=_ALIGNMENT, aliases=aliases), time_budget=1.0)
    offsets = {v: offset // itemsize for v, offset in zip(planned, plan.offsets, strict=True)}
    return offsets, in_output, max(align_up(plan.arena_bytes, itemsize) // itemsize, 1), dtype


def _param(name: str, shape: tuple[int, ...], dtype: str) -> tvm.ir.Var:
    return tirx.decl_buffer([tirx.IntImm("int64", d) for d in shape], dtype, name)


def _substitute(stmt: tirx.Stmt, mapping: dict) -> tirx.Stmt:
    def swap(var: tvm.ir.Var) -> object:
        return next((new for old, new in mapping.items() if var.same_as(old)), var)

    return tvm_ffi.structural_map(stmt, [(tvm.ir.Var, swap)])


def _linked_runs(kernels: list[_Kernel], inside: list[relax.Var], cut_carries: bool) -> list[list[int]] | None:
    """The kernels linked by the inner tensors they share (with ``cut_carries``, save the rows a line
    buffer's ``place_rows``, :data:`~.tile_writes.CARRIED_ROWS_ATTR`, takes over from the tile before),
    each group a run of consecutive kernels; None where a group is not."""
    group = list(range(len(kernels)))

    def find(i: int) -> int:
        while group[i] != i:
            group[i] = group[group[i]]
            i = group[i]
        return i

    writer: dict[relax.Var, int] = {}
    for i, kernel in enumerate(kernels):
        carries = cut_carries and kernel.func.attrs is not None and CARRIED_ROWS_ATTR in kernel.func.attrs
        for j, tensor in enumerate(kernel.tensors):
            if tensor in inside and not (carries and j == 0):
                group[find(i)] = find(writer.setdefault(tensor, i))
    runs: list[list[int]] = []
    for i in range(len(kernels)):
        if runs and find(runs[-1][-1]) == find(i):
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs if len(runs) == len({find(i) for i in range(len(kernels))}) else None


def _tile_groups(kernels: list[_Kernel], inside: list[relax.Var]) -> list[list[int]] | None:
    """The kernels of each independent run of tiles (tile-major): one per tile, or with a line buffer a
    run per chain of tiles that carry rows to the next; None where there are not two or more. Runs share
    only the chain's inputs and output, so they may run at once (each writes its own rows)."""
    runs = _linked_runs(kernels, inside, cut_carries=False)
    return runs if runs is not None and len(runs) > 1 else None


def _tiles(kernels: list[_Kernel], inside: list[relax.Var]) -> list[list[int]] | None:
    """The kernels of each tile (a run of consecutive kernels, tile-major), or None where the chain's kernels
    do not fall into two or more (a channel chain's tiles share its running sum)."""
    runs = _linked_runs(kernels, inside, cut_carries=True)
    return runs if runs is not None and len(runs) > 1 else None


def _serial(stmt: tirx.Stmt) -> tirx.Stmt:
    """``stmt`` with its parallel loops run serially (its tile runs on one worker thread); vectorized
    and unrolled loops stay."""

    def serial(loop: tirx.For) -> tirx.For:
        if loop.kind != tirx.ForKind.PARALLEL:
            return loop
        return tirx.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.SERIAL, loop.body, None, loop.annotations)

    return tvm_ffi.structural_map(stmt, [(tirx.For, serial)])


def _holes(stmt: tirx.Stmt, holes: dict[tuple[int, str], tirx.Var]) -> tuple[tirx.Stmt, list[tirx.IntImm]]:
    """``stmt`` with every integer constant of its buffer accesses' indices replaced by a hole (the k-th
    hole of a dtype is ``holes[(k, dtype)]``, the same variable for every tile), and the constants, in
    order: tiles of one chain differ in the rows they read and write, that is in these constants."""
    found: list[tirx.IntImm] = []

    def hole(imm: tirx.IntImm) -> tirx.Var:
        key = (len(found), str(imm.ty))
        found.append(imm)
        return holes.setdefault(key, tirx.Var(f"tile_hole{key[0]}", imm.ty))

    def indices(exprs) -> list[tirx.Expr]:
        return [tvm_ffi.structural_map(e, [(tirx.IntImm, hole)]) for e in exprs]

    def store(node: tirx.BufferStore, mutator: tvm_ffi.StructuralMutator):
        node = mutator.default_mutate(node)
        return tirx.BufferStore(node.buffer, node.value, indices(node.indices))

    def load(node: TensorLoad, mutator: tvm_ffi.StructuralMutator):
        node = mutator.default_mutate(node)
        return tirx.BufferLoad(node.source, indices(node.indices))

    def region(node: TensorRegion, mutator: tvm_ffi.StructuralMutator):
        node = mutator.default_mutate(node)
        mins = indices([r.min for r in node.region])
        ranges = [Range.from_min_extent(m, r.extent) for m, r in zip(mins, node.region, strict=True)]
        return tirx.BufferRegion(node.source, ranges)

    def let(node: tirx.LetStmt, mutator: tvm_ffi.StructuralMutator):
        node = mutator.default_mutate(node)
        if node.var.name == _VIEW_OFFSET and isinstance(node.value, tirx.IntImm):  # where an input view starts
            return tirx.LetStmt(node.var, hole(node.value))
        return node

    done = tvm_ffi.structural_mutate(
        stmt, ((tirx.BufferStore, store), (TensorLoad, load), (TensorRegion, region), (tirx.LetStmt, let))
    )
    return done, found


@dataclass
class _TileClass:
    """Tiles whose statements differ only in the constants of their accesses' indices."""

    members: list[int]
    template: tirx.Stmt
    holes: list[tirx.Var]
    values: list[list[int]]
    """Per member, the constant at each hole."""


def _fill(template: tirx.Stmt, holes: list[tirx.Var], values: list) -> tirx.Stmt:
    mapping = dict(zip(holes, values, strict=True))
    return tvm_ffi.structural_map(template, [(tvm.ir.Var, lambda var: mapping.get(var, var))])


def _tile_classes(tiles: list[tirx.Stmt]) -> list[_TileClass]:
    """The tiles grouped into classes (anti-unification of their statements): a tile joins the first class
    whose template, its holes filled with the tile's own constants, is the tile's statement exactly."""
    shared: dict[tuple[int, str], tirx.Var] = {}
    classes: list[_TileClass] = []
    for t, stmt in enumerate(tiles):
        template, found = _holes(stmt, shared)
        holes = [shared[(k, str(imm.ty))] for k, imm in enumerate(found)]
        for cls in classes:
            same_holes = len(cls.holes) == len(holes) and all(
                a.same_as(b) for a, b in zip(cls.holes, holes, strict=True)
            )
            if same_holes and tvm_ffi.structural_equal(_fill(cls.template, holes, found), stmt):
                cls.members.append(t)
                cls.values.append([int(imm.value) for imm in found])
                break
        else:
            classes.append(_TileClass([t], template, holes, [[int(imm.value) for imm in found]]))
    return classes


def _table(index: tirx.Expr, keys: list[int], values: list[int], dtype: str) -> tirx.Expr:
    """``values[i]`` where ``index == keys[i]``: ``a + b * index`` where the values are affine in the
    keys, else a chain of selects (outside the keys: the last value)."""
    const = lambda v: tirx.IntImm(dtype, v)  # noqa: E731
    if len(set(values)) == 1:
        return const(values[0])
    index = index if str(index.ty) == dtype else tirx.Cast(dtype, index)
    (k0, v0), (k1, v1) = (keys[0], values[0]), (keys[1], values[1])
    step, rest = divmod(v1 - v0, k1 - k0)
    if not rest and all(v == v0 + step * (k - k0) for k, v in zip(keys, values, strict=True)):
        return const(v0 - step * k0) + index * const(step)
    expr = const(values[-1])
    for k, v in zip(reversed(keys[:-1]), reversed(values[:-1]), strict=True):
        expr = tirx.Select(tirx.EQ(index, tirx.IntImm(index.ty, k)), const(v), expr)
    return expr


def _one_of(index: tirx.Expr, members: list[int]) -> tirx.Expr:
    """``index`` is one of ``members`` (ascending)."""
    const = lambda v: tirx.IntImm(index.ty, v)  # noqa: E731
    if len(members) == 1:
        return tirx.EQ(index, const(members[0]))
    step = members[1] - members[0]
    if members == list(range(members[0], members[-1] + 1, step)):
        inside = tirx.And(tirx.GE(index, const(members[0])), tirx.LE(index, const(members[-1])))
        if step == 1:
            return inside
        return tirx.And(inside, tirx.EQ(tirx.floormod(index - const(members[0]), const(step)), const(0)))
    condition = tirx.EQ(index, const(members[0]))
    for m in members[1:]:
        condition = tirx.Or(condition, tirx.EQ(index, const(m)))
    return condition


def _dispatch(index: tirx.Expr, classes: list[_TileClass]) -> tirx.Stmt:
    """Tile ``index``'s statement: its class's template, the holes filled from ``index``."""
    bodies = []
    for cls in classes:
        columns = list(zip(*cls.values, strict=True)) if cls.holes else []
        filled = [_table(index, cls.members, list(col), str(h.ty)) for h, col in zip(cls.holes, columns, strict=True)]
        bodies.append(_fill(cls.template, cls.holes, filled))
    stmt = tirx.IfThenElse(_one_of(index, classes[-1].members), bodies[-1], None)
    for cls, body in zip(reversed(classes[:-1]), reversed(bodies[:-1]), strict=True):
        stmt = tirx.IfThenElse(_one_of(index, cls.members), body, stmt)
    return stmt


def _tile_loop(tiles: list[tirx.Stmt], runs: list[list[int]] | None, worker: tirx.Var, workers: int) -> tirx.Stmt:
    """The tiles as one loop over the tile index, each class of alike tiles (:func:`_tile_classes`) one
    body: ``for tile in range(T): that tile's stages`` (each stage's loops as scheduled), or with
    ``runs`` (the tiles of each independent run, in order) ``for worker in parallel(workers): for each of
    its tiles (a contiguous share of the runs, in order): that tile's stages``; a worker's tiles reuse its
    scratch region."""
    classes = _tile_classes(tiles)
    zero = tirx.IntImm("int64", 0)
    if runs is None:
        tile = tirx.Var("tile", "int64")
        return tirx.For(tile, zero, tirx.IntImm("int64", len(tiles)), tirx.ForKind.SERIAL, _dispatch(tile, classes))
    share = -(-len(runs) // workers)
    owned = [[t for run in runs[w * share : (w + 1) * share] for t in run] for w in range(workers)]
    owned = [own for own in owned if own]  # fewer runs than workers (or shares rounded up): the rest idle
    workers = len(owned)
    starts, ends = [own[0] for own in owned], [own[-1] + 1 for own in owned]
    step = tirx.Var("tile_step", "int64")
    tile = _table(worker, list(range(workers)), starts, "int64") + step
    longest = max(e - s for s, e in zip(starts, ends, strict=True))
    body = _dispatch(tile, classes)
    if any(e - s < longest for s, e in zip(starts, ends, strict=True)):
        body = tirx.IfThenElse(tirx.LT(tile, _table(worker, list(range(workers)), ends, "int64")), body, None)
    inner = tirx.For(step, zero, tirx.IntImm("int64", longest), tirx.ForKind.SERIAL, body)
    return tirx.For(worker, zero, tirx.IntImm("int64", workers), tirx.ForKind.PARALLEL, inner)


def merge_chain(
    func: relax.Function, mod: tvm.IRModule, spec: CpuSpec | None, threads: bool = True
) -> MergedChain | None:
    """The chain function's kernels as one PrimFunc (see the module docstring), each scheduled for
    ``spec`` first (None: as they are); None where this pass cannot merge them. With ``threads`` (a
    target with a thread pool), independent tiles run on :data:`~.split.outline.WORKERS_ATTR` workers."""
    found = _kernels(func, mod)
    if found is None or len(found[0]) < 2:
        return None
    kernels, output = found
    if not isinstance(output, relax.Var) or any(output.same_as(p) for p in func.params):
        return None
    input_views = _input_views(kernels, list(func.params))
    kernels = [k for k in kernels if not (k.writes_new and k.tensors[-1] in input_views)]
    if len(kernels) < 2:
        return None
    inputs: list[relax.Expr] = []
    inside: list[relax.Var] = []
    for kernel in kernels:
        for tensor in kernel.tensors:
            if tensor in input_views:
                tensor = input_views[tensor].source
            outside = isinstance(tensor, tvm.ir.GenericConst) or any(tensor.same_as(p) for p in func.params)
            group = inputs if outside else inside
            if not tensor.same_as(output) and not any(tensor.same_as(t) for t in group):
                group.append(tensor)
    if not inside or any(static_shape(t.ty) is None for t in [*inputs, *inside, output]):
        return None
    planned = _scratch_offsets(kernels, inside, output)
    if planned is None:
        return None
    offsets, in_output, elements, dtype = planned
    workers = int(func.attrs[WORKERS_ATTR]) if threads and WORKERS_ATTR in func.attrs else 1
    groups = _tile_groups(kernels, inside) if workers > 1 and spec is not None else None
    # kernels that write rows of the output other workers own run before the workers start
    whole = [i for i, k in enumerate(kernels) if _writes_whole_output(k, output, in_output)]
    first: list[int] = []
    if groups is not None and whole:
        if all(i in groups[0] for i in whole):
            first = groups[0][: groups[0].index(max(whole)) + 1]
            groups = [g for g in [groups[0][len(first) :], *groups[1:]] if g]
        else:
            groups = None  # tiles run in turn
    worker = tirx.Var("worker", "int64")
    regions = min(workers, len(groups)) if groups is not None else 1
    params = [_param(f"input{i}", static_shape(t.ty), str(t.ty.dtype)) for i, t in enumerate(inputs)]
    out = _param("output", static_shape(output.ty), str(output.ty.dtype))
    scratch = _param("scratch", (elements * regions,), dtype)
    scheduled: dict[tirx.PrimFunc, tirx.PrimFunc] = {}
    bodies = []
    for kernel in kernels:
        key = kernel.func
        if key not in scheduled:
            done = schedule_function(kernel.func, spec) if spec is not None else None
            scheduled[key] = done[0] if done is not None else kernel.func
        prim = s_tir.renew_defs(scheduled[key])  # each copy with variables and buffers of its own
        views, mapping = [], {}
        for param, tensor in zip(prim.params, kernel.tensors, strict=True):
            ty = param.ty
            index_type = ty.shape[0].ty if len(ty.shape) else "int64"
            if tensor in input_views:  # the tile's rows of an input, read in place
                view = input_views[tensor]
                offset = tirx.Var(_VIEW_OFFSET, index_type)
                target = params[next(i for i, t in enumerate(inputs) if t.same_as(view.source))]
                strided = tirx.decl_buffer(
                    list(ty.shape),
                    ty.dtype,
                    param.name,
                    strides=[tirx.IntImm(index_type, s) for s in view.strides],
                    elem_offset=offset,
                )
                views.append(tirx.LetStmt(offset, tirx.IntImm(index_type, view.offset)))
                views.append(tirx.DeclBuffer(strided, data=tirx.buffer_data(target)))
                mapping[param] = strided
                continue
            if tensor.same_as(output) or tensor in in_output:
                target, offset = out, tirx.IntImm(index_type, 0)
            elif any(tensor.same_as(t) for t in inside):
                target = scratch
                offset = tirx.IntImm(index_type, next(o for v, o in offsets.items() if v.same_as(tensor)))
                if groups is not None:  # each worker's tiles in a region of their own
                    offset = offset + tirx.Cast(index_type, worker) * tirx.IntImm(index_type, elements)
            else:
                target = params[next(i for i, t in enumerate(inputs) if t.same_as(tensor))]
                offset = tirx.IntImm(index_type, 0)
            view = tirx.decl_buffer(list(ty.shape), ty.dtype, param.name, elem_offset=offset)
            views.append(tirx.DeclBuffer(view, data=tirx.buffer_data(target)))
            mapping[param] = view
        body = _substitute(prim.body, mapping)
        bodies.append(tirx.SeqStmt([*views, _serial(body) if groups is not None else body]))
    tiles = _tiles(kernels, inside) if not first else None
    if tiles is not None and (groups is None or all(any(t[0] == g[0] for t in tiles) for g in groups)):
        stmts = [tirx.SeqStmt([bodies[i] for i in t]) if len(t) > 1 else bodies[t[0]] for t in tiles]
        runs = [[j for j, t in enumerate(tiles) if g[0] <= t[0] <= g[-1]] for g in groups] if groups else None
        bodies = [_tile_loop(stmts, runs, worker, regions)]
    elif groups is not None:
        hoisted = [_substitute(bodies[i], {worker: tirx.IntImm("int64", 0)}) for i in first]  # worker 0's region
        bodies = [
            *hoisted,
            _tile_loop(
                [tirx.SeqStmt([bodies[i] for i in g]) for g in groups],
                [[i] for i in range(len(groups))],
                worker,
                regions,
            ),
        ]
    root = s_tir.SBlock([], [], [], "root", tirx.SeqStmt(bodies) if len(bodies) > 1 else bodies[0])
    merged = tirx.PrimFunc([*params, out, scratch], s_tir.SBlockRealize([], True, root))
    merged = merged.with_attrs({"tir.is_scheduled": True, "tirx.noalias": True})
    return MergedChain(merged, inputs, relax.TensorType((elements * regions,), dtype))


def _writes_whole_output(kernel: _Kernel, output: relax.Var, in_output: set[relax.Var]) -> bool:
    """``kernel`` makes all the rows of the chain's output (or of a tensor in its bytes), not one tile's.
    The blocked layout makes the first tile's rows in a whole blocked tensor and unblocks all of it
    (:mod:`~.tile_layout`) where the chain's result leaves it NCHW: run in parallel with other workers'
    tiles, that copy would overwrite their rows, so the first worker's kernels up to it run before the
    workers start."""
    written = kernel.tensors[-1]
    if not kernel.writes_new or not (written.same_as(output) or written in in_output):
        return False
    read, made, whole = (static_shape(t.ty) for t in (kernel.tensors[0], written, output))
    if any(s is None or len(s) < 3 for s in (read, made, whole)):
        return False
    # a change of layout (NCHW[x]c to NCHW) of all the output's rows; a tile's kernel that writes its
    # rows through the whole output's buffer keeps its layout, even where its input has as many rows
    return len(read) != len(made) and read[2] == made[2] == whole[2]


def _inlined(call: relax.Call, var: relax.Var, func: relax.Function) -> list[relax.Binding]:
    """The bindings of the chain function ``func`` in place of ``var = func(args)``: the per-kernel tiles."""
    func = relax.utils.copy_with_new_vars(func)
    mapping = dict(zip(func.params, call.args, strict=True))
    bindings = [relax.VarBinding(b.var, rebind(b.value, mapping)) for b in top_level_bindings(func)]
    return [*bindings, relax.VarBinding(var, rebind(func.body.body, mapping))]


def _merged_call(
    call: relax.Call, var: relax.Var, func: relax.Function, merged: MergedChain, gvar: tvm.ir.GlobalVar
) -> list[relax.Binding]:
    """``var = func(args)`` as one call of the merged kernel ``gvar``, which also returns the scratch."""
    args = [rebind(t, dict(zip(func.params, call.args, strict=True))) for t in merged.inputs]
    kind = relax.DataflowVar if isinstance(var, relax.DataflowVar) else relax.Var
    both = kind(f"{var.name}_scratch", relax.TupleType([var.ty, merged.scratch]))
    return [
        relax.VarBinding(both, relax.call_tir(gvar, args, out_ty=[var.ty, merged.scratch])),
        relax.VarBinding(var, relax.TupleGetItem(both, 0)),
    ]


def MergeTileKernels(target: tvm.target.Target, schedule: str = "default") -> tvm.transform.Pass:  # noqa: N802
    """Each outlined chain as one kernel call on ``llvm`` and ``c`` targets, else its per-kernel tiles
    back in the caller (see the module docstring). Kernels are scheduled first unless ``schedule`` is
    ``none``."""
    cpu = target.kind.name in ("llvm", "c")
    spec = cpu_spec(target) if cpu and schedule != "none" else None

    @tvm.transform.module_pass(opt_level=0, name="tvm_memplan.MergeTileKernels")
    def _pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        chains = {gvar: f for gvar, f in relax_functions(mod) if f.attrs is not None and TILES_ATTR in f.attrs}
        if not chains:
            return mod
        builder = relax.BlockBuilder(mod)
        kernels = {}
        for gvar, func in chains.items():
            merged = merge_chain(func, mod, spec, target.kind.name == "llvm") if cpu else None
            if merged is not None:
                kernels[gvar] = (merged, builder.add_func(merged.func, f"{gvar.name_hint}_fused"))
        updates = {}
        for gvar, func in relax_functions(mod):
            if gvar in chains:
                continue
            blocks = []
            for block in func.body.blocks:
                bindings = []
                for b in block.bindings:
                    chain = b.value.op if isinstance(b.value, relax.Call) else None
                    if chain not in chains:
                        bindings.append(b)
                    elif chain in kernels:
                        bindings.extend(_merged_call(b.value, b.var, chains[chain], *kernels[chain]))
                    else:
                        bindings.extend(_inlined(b.value, b.var, chains[chain]))
                blocks.append(type(block)(bindings))
            updates[gvar] = builder.normalize(with_blocks(func, blocks))
        functions = {**dict(builder.get().functions), **updates}
        kept = tvm.IRModule({g: f for g, f in functions.items() if g not in chains}, attrs=mod.attrs)
        used = referenced_globals(kept)
        return tvm.IRModule(
            {g: f for g, f in kept.functions.items() if not isinstance(f, tirx.PrimFunc) or g.name_hint in used},
            attrs=mod.attrs,
        )

    return _pass
