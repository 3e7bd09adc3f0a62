"""A split chain's tiles outlined into a function of their own, so that they survive legalization and
fusion as one group that :func:`~tvm_memplan.relax.tile_kernels.MergeTileKernels` turns into one kernel.

The rewriter emits a chain whose tiles are to run as one kernel between two marker bindings (unused
constants); :func:`outline_marked` moves the bindings between them into a private Relax function
marked :data:`TILES_ATTR` and calls it where they were. TVM legalizes and fuses every function of the
module, so the outlined tiles get exactly the kernels they would get in ``main``.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..module import with_blocks

TILES_ATTR = "tvm_memplan.fused_tiles"
"""Marks a private Relax function holding one split chain's tiles, to be merged into one kernel; its
value is the number of independent runs of tiles (each tile, or with a line buffer each worker's run
of tiles, which carry rows from one to the next)."""

WORKERS_ATTR = "tvm_memplan.tile_workers"
"""On such a function: its tiles are independent (a spatial chain's row tiles), and this many may run
at once on threads of their own (see :func:`~tvm_memplan.relax.tile_kernels.merge_chain`)."""


@mutator
class _Rebind(PyExprMutator):
    """An expression with some variables replaced."""

    def __init__(self, mapping: dict[relax.Var, relax.Expr]) -> None:
        super().__init__()
        self.mapping = mapping

    def visit_var_(self, var: relax.Var) -> relax.Expr:
        return self.mapping.get(var, var)

    def visit_dataflow_var_(self, var: relax.DataflowVar) -> relax.Expr:
        return self.mapping.get(var, var)


def rebind(expr: relax.Expr, mapping: dict[relax.Var, relax.Expr]) -> relax.Expr:
    """``expr`` with the variables of ``mapping`` replaced."""
    return _Rebind(mapping).visit_expr(expr)


def marker(bb: relax.BlockBuilder) -> relax.Var:
    """An unused binding that marks where a chain's tiles begin or end."""
    return bb.emit(relax.const(0, "int32"), name_hint="tiles_marker")


def _free_vars(bindings: list[relax.Binding]) -> list[relax.Var]:
    """Variables the bindings read but do not define, in order of first use."""
    defined = {b.var for b in bindings}
    seen: list[relax.Var] = []
    for b in bindings:
        for var in relax.analysis.free_vars(b.value):
            if var not in defined and var not in seen:
                seen.append(var)
    return seen


def _outline(
    bindings: list[relax.Binding], output: relax.Var, name: str, builder: relax.BlockBuilder, workers: int, parts: int
) -> relax.VarBinding:
    """A function computing ``output`` from ``bindings`` (added through ``builder``), and the
    binding that calls it in their place."""
    inputs = _free_vars(bindings)
    params = [relax.Var(v.name, v.ty) for v in inputs]
    mapping: dict[relax.Var, relax.Expr] = dict(zip(inputs, params, strict=True))
    sub = relax.BlockBuilder()
    attrs = {TILES_ATTR: parts, **({WORKERS_ATTR: workers} if workers > 1 else {})}
    with sub.function(name, params, attrs=attrs, private=True):
        with sub.dataflow():
            for b in bindings:
                value = rebind(b.value, mapping)
                if b.var.same_as(output):
                    result = sub.emit_output(value)
                else:
                    mapping[b.var] = sub.emit(value, name_hint=b.var.name)
        sub.emit_func_output(result)
    gvar = builder.add_func(sub.get()[name], name)
    return relax.VarBinding(output, relax.Call(gvar, inputs))


def outline_marked(
    func: relax.Function, markers: list[tuple[relax.Var, relax.Var, int, int]], builder: relax.BlockBuilder
) -> relax.Function:
    """``func`` with the bindings between each pair of markers outlined (see the module docstring)
    and the markers dropped. Each range has one result used after it: the chain's last tensor
    (:attr:`~tvm_memplan.split.chain.Chain.fusable`). A marker's last fields are the number of its
    tiles that may run at once (:data:`WORKERS_ATTR`; 1: one after another) and of its independent
    runs of tiles (:data:`TILES_ATTR`)."""
    begins = {begin: (end, workers, parts) for begin, end, workers, parts in markers}
    ends = {end for _, end, _, _ in markers}
    blocks = []
    count = 0
    for block in func.body.blocks:
        bindings = list(block.bindings)
        later_uses = [set(relax.analysis.free_vars(b.value)) for b in bindings]
        new: list[relax.Binding] = []
        i = 0
        while i < len(bindings):
            b = bindings[i]
            if b.var in ends:
                i += 1
                continue
            if b.var not in begins:
                new.append(b)
                i += 1
                continue
            end, workers, parts = begins[b.var]
            j = next(k for k in range(i + 1, len(bindings)) if bindings[k].var.same_as(end))
            inside = bindings[i + 1 : j]
            used_after = set().union(*later_uses[j + 1 :], relax.analysis.free_vars(func.body.body))
            (output,) = [x.var for x in inside if x.var in used_after or not isinstance(x.var, relax.DataflowVar)]
            new.append(_outline(inside, output, f"chain_tiles{count}", builder, workers, parts))
            count += 1
            i = j + 1
        blocks.append(type(block)(new))
    return with_blocks(func, blocks)
