"""Execution-order pass: reorder the bindings of Relax dataflow blocks to lower the peak.

Runs after ``RewriteDataflowReshape`` (reshapes are views by then) and before
``ToNonDataflow``, where bindings are pure and free to move within their dependencies.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import tvm
from tvm import relax, tirx

from ..errors import UserError
from ..planning import Operator
from ..planning.order import OrderGraph, OrderResult, search_order
from .inplace import inplace_safe, is_concat_kernel
from .module import relax_functions, with_blocks, with_functions
from .tensor_types import static_nbytes

ORDERS = ("program", "dfs", "bfs", "search")
REORDER_PASS_NAME = "tvm_memplan.ReorderForMemory"
_RESHAPE = tvm.ir.Op.get("relax.reshape")
_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
_CALL_TIR_INPLACE = tvm.ir.Op.get("relax.call_tir_inplace")


@dataclass
class OrderReport:
    """What reordering did to one dataflow block."""

    function: str
    operators: int
    strategy: str
    program_peak_bytes: int
    peak_bytes: int
    optimal: bool
    seconds: float
    tried: dict[str, int] = field(default_factory=dict)


def _is_view(value: relax.Expr) -> bool:
    if isinstance(value, (relax.Var, relax.TupleGetItem)):
        return True
    return isinstance(value, relax.Call) and value.op.same_as(_RESHAPE)


def _call_tir_parts(value: relax.Expr, mod: tvm.IRModule) -> tuple[tirx.PrimFunc, list[relax.Expr]] | None:
    """(PrimFunc, input args) of a single-output ``R.call_tir``."""
    if not (isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR)):
        return None
    callee, args = value.args[0], value.args[1]
    if not (isinstance(callee, tvm.ir.GlobalVar) and callee in mod and isinstance(args, relax.Tuple)):
        return None
    prim = mod[callee]
    if not isinstance(prim, tirx.PrimFunc) or len(prim.params) != len(args.fields) + 1:
        return None
    return prim, list(args.fields)


def _inplace_operand(value: relax.Expr) -> relax.Var | None:
    """The operand an ``R.call_tir_inplace`` with one output writes (split row tiles written into
    their rows of the full tensor, the row copies)."""
    if not (isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR_INPLACE)):
        return None
    indices = [int(i) for i in value.attrs.inplace_indices]
    args = value.args[1].fields if isinstance(value.args[1], relax.Tuple) else []
    if len(indices) != 1 or not 0 <= indices[0] < len(args) or not isinstance(args[indices[0]], relax.Var):
        return None
    return args[indices[0]]


def block_graph(
    block: relax.DataflowBlock, escaping: set[relax.Var], mod: tvm.IRModule, inplace: bool = True
) -> OrderGraph:
    """The block as an operator DAG; ``escaping`` vars (used after the block) are not planned.

    With ``inplace``, the model knows what the arena planner will do with the order: kernels
    that may overwrite a dying input, and concats whose inputs are written into place.
    """
    operators: list[Operator] = []
    sizes: dict[Hashable, int] = {}
    aliases: dict[Hashable, Hashable | tuple] = {}
    inplace_inputs: dict[int, list[relax.Var]] = {}
    produced = {binding.var for binding in block.bindings}
    for index, binding in enumerate(block.bindings):
        value = binding.value
        reads = tuple(relax.analysis.free_vars(value))
        operators.append(Operator(index, reads, (binding.var,)))
        parts = _call_tir_parts(value, mod) if inplace else None
        if parts is not None and binding.var not in escaping:
            prim, args = parts
            out_bytes = static_nbytes(binding.var.ty)
            if is_concat_kernel(value.args[0].name_hint) and all(
                isinstance(a, relax.Var) and a in produced and a not in escaping for a in args
            ):
                aliases[binding.var] = tuple(args)
                continue
            inplace_inputs[index] = [
                a
                for i, a in enumerate(args)
                if isinstance(a, relax.Var)
                and a in produced
                and static_nbytes(a.ty) == out_bytes
                and inplace_safe(prim, i, len(args))
            ]
        written = _inplace_operand(value)
        if written is not None and written in produced:  # an in-place kernel's output is its operand's buffer
            aliases[binding.var] = written
            continue
        if _is_view(value):
            source = (
                value
                if isinstance(value, relax.Var)
                else (value.tuple_value if isinstance(value, relax.TupleGetItem) else value.args[0])
            )
            if isinstance(source, relax.Var):
                aliases[binding.var] = source
            continue
        nbytes = static_nbytes(binding.var.ty)
        if nbytes and binding.var not in escaping:
            sizes[binding.var] = nbytes
    return OrderGraph.from_operators(operators, sizes, aliases, inplace_inputs)


def escaping_vars(func: relax.Function, block_index: int) -> set[relax.Var]:
    """Vars of a block read by later blocks or by the function's result."""
    body = func.body
    used: set[relax.Var] = set(relax.analysis.free_vars(body.body))
    for later in body.blocks[block_index + 1 :]:
        for binding in later.bindings:
            used.update(relax.analysis.free_vars(binding.value))
    return used


def ReorderForMemory(  # noqa: N802 - named like TVM's passes
    order: str = "search",
    time_budget: float = 10.0,
    inplace: bool = True,
    on_report: Callable[[OrderReport], None] | None = None,
) -> tvm.transform.Pass:
    """Reorder dataflow bindings: ``program`` keeps them, ``dfs``/``bfs`` use TVM's TopologicalSort,
    ``search`` runs :func:`tvm_memplan.planning.order.search_order` (never worse than program order)."""
    if order not in ORDERS:
        raise UserError(f"unknown order {order!r}; choose one of {', '.join(ORDERS)}")
    tvm_sorts = {
        "dfs": relax.transform.TopologicalSort(order="depth-first", direction="from-inputs"),
        "bfs": relax.transform.TopologicalSort(order="breadth-first", direction="from-inputs"),
    }

    @tvm.transform.module_pass(opt_level=0, name=REORDER_PASS_NAME)
    def _pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        original = mod
        if order in tvm_sorts:
            mod = tvm_sorts[order](mod)
        updates = {}
        for gvar, func in relax_functions(mod):
            new_blocks, changed = [], False
            for index, block in enumerate(func.body.blocks):
                if not isinstance(block, relax.DataflowBlock) or len(block.bindings) < 2:
                    new_blocks.append(block)
                    continue
                graph = block_graph(block, escaping_vars(func, index), mod, inplace)
                if order == "search":
                    budget = time_budget / max(1, len(func.body.blocks))
                    result = search_order(graph, time_budget=budget)
                else:
                    program = graph.peak(list(range(len(graph))))
                    result = OrderResult(list(range(len(graph))), program, program, order, False, 0.0, {order: program})
                    if order in tvm_sorts:
                        # Compare with the order before TVM's sort, which was the program order.
                        old_block = original[gvar].body.blocks[index]
                        result.program_peak = block_graph(
                            old_block, escaping_vars(original[gvar], index), original, inplace
                        ).peak(list(range(len(old_block.bindings))))
                if on_report is not None:
                    on_report(
                        OrderReport(
                            gvar.name_hint,
                            len(graph),
                            result.strategy,
                            result.program_peak,
                            result.peak,
                            result.optimal,
                            result.seconds,
                            result.tried,
                        )
                    )
                if result.order != list(range(len(graph))):
                    new_blocks.append(relax.DataflowBlock([block.bindings[i] for i in result.order]))
                    changed = True
                else:
                    new_blocks.append(block)
            if changed:
                updates[gvar] = with_blocks(func, new_blocks)
        return with_functions(mod, updates)

    return _pass
