"""Small IRModule helpers shared by the passes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import tvm
import tvm_ffi
from tvm import relax


def relax_functions(mod: tvm.IRModule) -> Iterator[tuple[tvm.ir.GlobalVar, relax.Function]]:
    """The module's Relax functions that have a body of binding blocks."""
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            yield gvar, func


def with_blocks(func: relax.Function, blocks: Sequence[relax.BindingBlock]) -> relax.Function:
    """``func`` with its binding blocks replaced (same parameters, result, attributes)."""
    return relax.Function(
        func.params, relax.SeqExpr(list(blocks), func.body.body), func.ret_ty, func.is_pure, func.attrs, func.span
    )


def with_functions(mod: tvm.IRModule, updates: Mapping[tvm.ir.GlobalVar, tvm.ir.BaseFunc]) -> tvm.IRModule:
    """A copy of ``mod`` with some functions replaced; ``mod`` itself is left as it was.

    (Assigning into a module inside a module pass mutates the caller's module.)
    """
    if not updates:
        return mod
    new_mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gvar, func in updates.items():
        new_mod[gvar] = func
    return new_mod


def referenced_globals(mod: tvm.IRModule) -> set[str]:
    """Names of the global functions the module's Relax functions refer to."""
    names: set[str] = set()
    for _, func in relax_functions(mod):
        tvm_ffi.structural_walk(
            func, lambda n: names.add(n.name_hint) if isinstance(n, tvm.ir.GlobalVar) else None, order="pre"
        )
    return names
