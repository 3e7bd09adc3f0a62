"""Plan → Relax IR: one ``alloc_storage`` arena per (device, scope), tensors at byte offsets."""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from tvm import relax

from ..planning import Plan
from .extract import ArenaProblem
from .module import with_blocks


def apply_plans(
    func: relax.Function,
    arenas: Sequence[ArenaProblem],
    plans: Sequence[Plan],
    removed_calls: AbstractSet[relax.Var] = frozenset(),
    at_offset: AbstractSet[relax.Var] = frozenset(),
) -> relax.Function:
    """Rewrite ``func`` so every planned tensor lives at its offset in its arena.

    Each planned ``alloc = R.builtin.alloc_tensor(...)`` becomes
    ``R.memory.alloc_tensor(arena, offset, ...)`` wrapped in ``R.memory.ensure_zero_offset``:
    generated kernels assert a zero byte offset, and the wrapper folds a 64-byte-aligned offset
    into the data pointer without copying. Tensors in ``at_offset`` (read only by kernels that take
    an ``elem_offset``: :mod:`.offsets`) stay at their offsets unwrapped. Bindings in
    ``removed_calls`` (concats whose inputs were written in place) are dropped.
    """
    replacements: dict[relax.Var, list[relax.Binding]] = {}
    arena_bindings: list[relax.Binding] = []
    for index, (arena, plan) in enumerate(zip(arenas, plans, strict=True)):
        if not arena.sites:
            continue
        storage = relax.Var(f"memplan_arena{index if index else ''}", relax.ObjectType())
        arena_bindings.append(
            relax.VarBinding(
                storage,
                relax.op.memory.alloc_storage(
                    relax.ShapeExpr([plan.arena_bytes]),
                    arena.device_index,
                    arena.scope,
                    "uint8",
                ),
            )
        )
        for site, offset in zip(arena.sites, plan.offsets, strict=True):
            tensor = relax.op.memory.alloc_tensor(
                storage, offset, relax.ShapeExpr(list(site.shape)), site.dtype, site.device_index
            )
            if site.var in at_offset:
                replacements[site.var] = [relax.VarBinding(site.var, tensor)]
                continue
            placed = relax.Var(f"{site.var.name}_at{offset}", site.var.ty)
            replacements[site.var] = [
                relax.VarBinding(placed, tensor),
                relax.VarBinding(site.var, relax.op.memory.ensure_zero_offset(placed)),
            ]
    if not replacements and not removed_calls:
        return func

    new_blocks = []
    for position, block in enumerate(func.body.blocks):
        new_bindings: list[relax.Binding] = list(arena_bindings) if position == 0 else []
        for binding in block.bindings:
            if binding.var not in removed_calls:
                new_bindings.extend(replacements.get(binding.var, [binding]))
        new_blocks.append(type(block)(new_bindings))
    return with_blocks(func, new_blocks)
