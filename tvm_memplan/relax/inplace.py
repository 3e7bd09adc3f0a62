"""In-place kernels and concat elimination (docs/design.md), decided on a function after ``CallTIRRewrite``.

Two kinds of aliases are proposed to the planner:

- **merge** (concat): when the concat's inputs are contiguous slices of its output (batch-1
  NCHW on the channel axis, or any concat on the outermost non-unit axis), each input is
  allocated inside the output, the producers write straight into place and the concat call
  disappears;
- **in-place**: a kernel writes its output over an input that dies at that kernel, when the
  PrimFunc provably reads that input only at the output's own index (an elementwise tail such
  as conv + bias + residual add + relu).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import tvm
from tvm import relax, s_tir, tirx

from ..planning.concat import concat_slices
from .ir_utils import static_shape
from .tensor_types import static_nbytes

if TYPE_CHECKING:
    from .sites import AllocSite

_CONCAT_NAME = re.compile(r"^concatenate\d*$")


@dataclass
class AliasDecisions:
    """What the analysis decided for one function."""

    aliases: dict[relax.Var, tuple[relax.Var, int]] = field(default_factory=dict)
    """Allocation → (allocation it lives inside, byte offset)."""
    removed_calls: set[relax.Var] = field(default_factory=set)
    """Bindings of concat calls that no longer need to run."""
    concats_removed: int = 0
    concats_kept: dict[str, str] = field(default_factory=dict)
    inplace_ops: int = 0


def prim_func_of(value: relax.Expr, mod: tvm.IRModule) -> tirx.PrimFunc | None:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar) and value.op in mod:
        func = mod[value.op]
        if isinstance(func, tirx.PrimFunc):
            return func
    return None


def is_concat_kernel(name: str) -> bool:
    """An unfused concat PrimFunc: TVM names a lone legalized ``concat`` ``concatenate[N]``."""
    return bool(_CONCAT_NAME.match(name))


def _identity_access(region, iter_vars) -> bool:
    """The region is exactly one element at the block's spatial iterators, in order."""
    if len(region) != len(iter_vars):
        return False
    for rng, iv in zip(region, iter_vars, strict=True):
        if not (isinstance(rng.extent, tirx.IntImm) and int(rng.extent.value) == 1):
            return False
        if not rng.min.same_as(iv.var):
            return False
    return True


def _all_blocks(sch: s_tir.Schedule, parent) -> list:
    blocks = []
    for child in sch.get_child_blocks(parent):
        blocks.append(child)
        blocks.extend(_all_blocks(sch, child))
    return blocks


def _blocks_feeding_reductions(blocks: list) -> set[int]:
    """Positions of the blocks whose results reach a reduction block (blocks in program order)."""
    feeding: set[int] = set()
    needed: set = set()  # buffers read by a reduction or by a block that feeds one
    for position in range(len(blocks) - 1, -1, -1):
        block = blocks[position]
        reduces = any(int(iv.iter_type) != 0 for iv in block.iter_vars)
        if reduces or any(any(w.source.same_as(b) for b in needed) for w in block.writes):
            feeding.add(position)
            needed.update(read.source for read in block.reads)
    return feeding


def inplace_safe(func: tirx.PrimFunc, source_index: int, output_index: int) -> bool:
    """Whether writing parameter ``output_index`` over parameter ``source_index`` is safe.

    Proven from the PrimFunc's blocks: the source, and every intermediate computed from it, is
    only ever read elementwise (each block reading it has no reduction iterator and reads exactly
    its own index: a schedule inlines intermediates into the output's block, so a transpose of
    an intermediate would read elements already overwritten), the output is only
    written elementwise and never read, and no block reads the source after the first block
    that writes the output. Then every element is read before the write that replaces it.
    The source must also not feed a reduction (directly or through other blocks): a schedule
    (tvm_memplan's default CPU schedules, MetaSchedule) interleaves a reduction's tiles with
    the output writes of earlier tiles, so such a source could be overwritten before it is read.

    Under these conditions the kernel keeps its ``noalias`` promise: the only shared addresses
    are an element's read and the write that depends on it, which no compiler can reorder (the
    promise withdrawn made every in-place kernel about twice as slow).
    """
    params = list(func.params)
    source, output = params[source_index], params[output_index]
    shapes = [source.shape, output.shape]
    if any(not isinstance(d, tirx.IntImm) for shape in shapes for d in shape):
        return False  # a symbolic extent (cumsum's scratch buffers): nothing can be proven
    if [int(d) for d in source.shape] != [int(d) for d in output.shape] or str(source.dtype) != str(output.dtype):
        return False
    try:
        sch = s_tir.Schedule(func)
        blocks = [sch.get(b) for b in _all_blocks(sch, sch.get_sblock("root"))]
    except Exception:  # not a block-structured PrimFunc: nothing can be proven
        return False
    feeding = _blocks_feeding_reductions(blocks)
    last_source_read = first_output_write = None
    derived = [source]  # the source and every intermediate computed from it
    for position, block in enumerate(blocks):
        spatial = all(int(iv.iter_type) == 0 for iv in block.iter_vars)
        reads_derived = False
        for read in block.reads:
            if read.source.same_as(output):
                return False
            if any(read.source.same_as(d) for d in derived):
                # read at the block's own index, also from intermediates: a schedule inlines them
                # into the output's block, and a transpose in between would read overwritten elements
                if position in feeding or not (spatial and _identity_access(read.region, block.iter_vars)):
                    return False
                reads_derived = True
                last_source_read = position
        if reads_derived:
            derived.extend(write.source for write in block.writes if not write.source.same_as(output))
        for write in block.writes:
            if write.source.same_as(source):
                return False
            if write.source.same_as(output):
                if not (spatial and _identity_access(write.region, block.iter_vars)):
                    return False
                if first_output_write is None:
                    first_output_write = position
    if first_output_write is None:
        return False
    return last_source_read is None or last_source_read <= first_output_write


def _itemsize(site: AllocSite) -> int:
    return tvm.runtime.DataType(site.dtype).bits // 8


def decide_aliases(
    bindings: list[relax.Binding],
    sites: dict[relax.Var, AllocSite],
    owners: dict[relax.Var, frozenset[relax.Var]],
    lifetimes: dict[relax.Var, tuple[int, int]],
    mod: tvm.IRModule,
    alignment: int,
) -> AliasDecisions:
    """Walk the kernels in execution order and pin concat inputs and in-place outputs."""
    decisions = AliasDecisions()
    group_end: dict[relax.Var, int] = {var: end for var, (_, end) in lifetimes.items() if var in sites}

    def root(var: relax.Var) -> relax.Var:
        while var in decisions.aliases:
            var = decisions.aliases[var][0]
        return var

    def join(member: relax.Var, target: relax.Var, delta: int) -> None:
        decisions.aliases[member] = (target, delta)
        top = root(target)
        group_end[top] = max(group_end[top], group_end.pop(member, 0), lifetimes[member][1])

    def sole_owner(arg: relax.Expr) -> relax.Var | None:
        """The planned allocation ``arg`` views in full, if exactly one."""
        if not isinstance(arg, relax.Var):
            return None
        found = owners.get(arg, frozenset())
        if len(found) != 1:
            return None
        (owner,) = found
        if owner not in sites or static_nbytes(arg.ty) != sites[owner].nbytes:
            return None
        return owner

    first_reader: dict[relax.Var, int] = {}
    for step, binding in enumerate(bindings):
        for var in relax.analysis.free_vars(binding.value):
            for owner in owners.get(var, ()):
                first_reader.setdefault(owner, step)

    for step, binding in enumerate(bindings):
        prim = prim_func_of(binding.value, mod)
        if prim is None:
            continue
        args = list(binding.value.args)
        arg_owners = [sole_owner(arg) for arg in args]
        out_positions = [
            i for i, owner in enumerate(arg_owners) if owner is not None and first_reader.get(owner) == step
        ]
        if len(out_positions) != 1:
            continue
        out_position = out_positions[0]
        out = arg_owners[out_position]
        name = binding.value.op.name_hint
        if is_concat_kernel(name):
            inputs = [(i, arg) for i, arg in enumerate(args) if i != out_position]
            offsets, reason = _concat_offsets(inputs, arg_owners, out, sites, decisions, alignment)
            if reason is not None:
                decisions.concats_kept[f"{out.name} = {name}(...)"] = reason
                continue
            for (i, _), delta in zip(inputs, offsets, strict=True):
                join(arg_owners[i], out, delta)
            decisions.removed_calls.add(binding.var)
            decisions.concats_removed += 1
            continue
        if out in decisions.aliases:
            continue
        for i, source in enumerate(arg_owners):
            if i == out_position or source is None or source == out:
                continue
            if sites[source].nbytes != sites[out].nbytes or group_end[root(source)] != step + 1:
                continue
            if args.count(args[i]) > 1 or not inplace_safe(prim, i, out_position):
                continue
            join(out, source, 0)
            decisions.inplace_ops += 1
            break
    return decisions


def _concat_offsets(
    inputs, arg_owners, out, sites, decisions: AliasDecisions, alignment: int
) -> tuple[list[int] | None, str | None]:
    """The inputs' byte offsets in the output when they can be written in place, else why the concat
    stays a copy (:func:`~tvm_memplan.planning.concat.concat_slices`)."""
    seen = set()
    for i, arg in inputs:
        owner = arg_owners[i]
        if owner is None:
            name = getattr(arg, "name", arg)
            why = "is not an intermediate this planner places (graph input, constant or partial view)"
            return None, f"input {name} {why}"
        if owner in seen:
            return None, f"input {owner.name} appears twice"
        if owner in decisions.aliases:
            return None, f"input {owner.name} already lives inside another tensor (second concat or in-place)"
        seen.add(owner)
    shapes = [static_shape(arg.ty) for _, arg in inputs]
    return concat_slices(shapes, sites[out].shape, _itemsize(sites[out]), alignment)
