"""Layer grouping on Relax functions (docs/design.md): layer-wise binding order and group step ranges.

Two views of one function: :func:`LayerOrder` reorders dataflow bindings layer by layer
(longest-path depth from the inputs or the outputs) so that every group is a run of
consecutive kernels; after ``CallTIRRewrite``
:func:`kernel_groups` finds the same layers among the destination-passing calls and returns the
step ranges each group occupies, which the arena planner turns into the F-predicate.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import tvm
from tvm import relax

from ..planning import Operator, Problem
from ..planning.grouping import (
    AUTO,
    SEQ,
    CostModel,
    GroupSetting,
    cost_aware_groups,
    group_schedule,
    grouped_problem,
    maxdist_layers,
    split_layer,
)
from .inplace import prim_func_of
from .module import relax_functions, with_blocks, with_functions
from .reorder import block_graph, escaping_vars
from .tensor_types import static_nbytes

LAYER_ORDER_PASS_NAME = "tvm_memplan.LayerOrder"
LAYERING_ATTR = "tvm_memplan.layers_from_outputs"
"""Function attribute LayerOrder leaves for the arena planner: 1 when layers count from the outputs."""
_RESHAPE = tvm.ir.Op.get("relax.reshape")
_BUILTIN_ALLOC = tvm.ir.Op.get("relax.builtin.alloc_tensor")

AUTO_COST_MODEL = CostModel(launch_seconds=5e-6, parallel_units=2, seconds_per_byte=1e-10)
"""``auto`` grouping without measurements: a kernel's time is the bytes it touches at 10 GB/s,
a launch 5 µs, and a byte the F-predicate keeps from reuse costs as much as moving it once."""
BYTES_PER_SECOND = 10e9


def _is_dataflow_view(value: relax.Expr) -> bool:
    """Bindings that launch nothing: var copies, tuples, tuple items, reshapes (views by now)."""
    if isinstance(value, (relax.Var, relax.Tuple, relax.TupleGetItem)):
        return True
    return isinstance(value, relax.Call) and value.op.same_as(_RESHAPE)


def _view_source(value: relax.Expr) -> relax.Var | None:
    source = (
        value
        if isinstance(value, relax.Var)
        else (value.tuple_value if isinstance(value, relax.TupleGetItem) else getattr(value, "args", [None])[0])
    )
    return source if isinstance(source, relax.Var) else None


def _splitter(setting: GroupSetting, touched_bytes: Mapping[int, int], out_bytes: Mapping[int, int]):
    """How one layer is cut: :func:`split_layer`, or the cost model for ``auto``."""
    if setting != AUTO:
        return lambda layer: split_layer(layer, setting)
    seconds = {op: nbytes / BYTES_PER_SECOND for op, nbytes in touched_bytes.items()}
    return lambda layer: cost_aware_groups(layer, seconds, out_bytes, AUTO_COST_MODEL)


def _block_costs(
    block: relax.DataflowBlock, escaping: set[relax.Var], mod: tvm.IRModule, inplace: bool, setting: GroupSetting
):
    """Per layering direction: (order, its cost). The cost is the sequential peak as
    ReorderForMemory models it (in-place included) plus, with groups, what the F-predicate adds
    to the order's lower bound (estimated without in-place kernels)."""
    bindings = list(block.bindings)
    operators = [Operator(i, tuple(relax.analysis.free_vars(b.value)), (b.var,)) for i, b in enumerate(bindings)]
    views = {i for i, b in enumerate(bindings) if _is_dataflow_view(b.value)}
    sizes = {b.var: static_nbytes(b.var.ty) for i, b in enumerate(bindings) if i not in views and b.var not in escaping}
    aliases = {
        b.var: _view_source(b.value) for i, b in enumerate(bindings) if i in views and _view_source(b.value) is not None
    }
    out_bytes = {i: static_nbytes(b.var.ty) for i, b in enumerate(bindings) if i not in views}
    touched = {i: out_bytes[i] + sum(static_nbytes(v.ty) for v in operators[i].inputs) for i in out_bytes}
    graph = block_graph(block, escaping, mod, inplace)
    costs = []
    for from_outputs in (False, True):
        layering = maxdist_layers(operators, is_view=views.__contains__, from_outputs=from_outputs)
        schedule = group_schedule(layering, setting, _splitter(setting, touched, out_bytes))
        peak = graph.peak(schedule.order)
        if setting != SEQ:
            grouped = grouped_problem(operators, sizes, schedule, aliases)
            peak += grouped.lower_bound() - Problem(grouped.buffers, alignment=grouped.alignment).lower_bound()
        costs.append((schedule.order, peak))
    return costs


def LayerOrder(setting: GroupSetting = SEQ, inplace: bool = True) -> tvm.transform.Pass:  # noqa: N802 - named like TVM's passes
    """Reorder every dataflow block layer by layer, group by group, views right after their
    producer's layer, so that every group of ``setting`` is a run of consecutive kernels.

    Layers count from the inputs (the thesis's maxdist) or from the outputs, whichever costs less
    memory (see :func:`_block_costs`; ties keep the inputs'). The choice is left in a function
    attribute for the arena planner, which finds the same layers and groups after lowering.
    """

    @tvm.transform.module_pass(opt_level=0, name=LAYER_ORDER_PASS_NAME)
    def _pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        updates = {}
        for gvar, func in relax_functions(mod):
            per_block = []
            for index, block in enumerate(func.body.blocks):
                if isinstance(block, relax.DataflowBlock) and len(block.bindings) > 1:
                    per_block.append((index, _block_costs(block, escaping_vars(func, index), mod, inplace, setting)))
            if not per_block:
                continue
            from_outputs = max(c[1][1] for _, c in per_block) < max(c[0][1] for _, c in per_block)
            blocks = list(func.body.blocks)
            for index, costs in per_block:
                order = costs[int(from_outputs)][0]
                blocks[index] = relax.DataflowBlock([blocks[index].bindings[i] for i in order])
            updates[gvar] = with_blocks(func, blocks).with_attr(LAYERING_ATTR, int(from_outputs))
        return with_functions(mod, updates)

    return _pass


def layers_from_outputs(func: relax.Function) -> bool:
    """The layering LayerOrder chose for ``func`` (from the inputs when it did not run)."""
    attrs = func.attrs
    return bool(attrs is not None and LAYERING_ATTR in attrs and int(attrs[LAYERING_ATTR]))


@dataclass
class KernelGroups:
    """The groups of one lowered function and where they sit among its bindings."""

    layers: int
    kernels: int
    groups: list[list[int]]
    """Binding indices of each group's kernels, in execution order."""

    def concurrent_steps(self) -> tuple[tuple[int, int], ...]:
        """Binding ranges ``[first member, last member + 1)`` of groups with two or more kernels."""
        return tuple((min(g), max(g) + 1) for g in self.groups if len(g) > 1)


def kernel_groups(
    bindings: Sequence[relax.Binding], mod: tvm.IRModule, setting: GroupSetting, from_outputs: bool = False
) -> KernelGroups:
    """Layers and groups of the destination-passing calls after ``CallTIRRewrite``.

    A call's output is the allocation it is the first to touch; everything else it reads is an
    input. Allocations, var copies and views launch nothing and add no depth.
    """
    owners: dict[relax.Var, frozenset[Hashable]] = {}
    touched: set[Hashable] = set()
    operators: list[Operator] = []
    kernels: set[int] = set()
    touched_bytes: dict[int, int] = {}
    out_bytes: dict[int, int] = {}
    for step, binding in enumerate(bindings):
        value = binding.value
        if isinstance(value, relax.Call) and value.op.same_as(_BUILTIN_ALLOC):
            owners[binding.var] = frozenset([binding.var])
            operators.append(Operator(step, (), ()))
            continue
        read: set[Hashable] = set()
        for var in relax.analysis.free_vars(value):
            read |= owners.get(var, frozenset([var]))
        if prim_func_of(value, mod) is not None:
            written = {t for t in read if t in owners and t not in touched}
            operators.append(Operator(step, tuple(read - written), tuple(written)))
            kernels.add(step)
            out_bytes[step] = sum(static_nbytes(t.ty) for t in written)
            touched_bytes[step] = sum(static_nbytes(t.ty) for t in read if isinstance(t, relax.Var))
        else:
            owners[binding.var] = frozenset(read)
            operators.append(Operator(step, tuple(read), ()))
        touched |= read
    layering = maxdist_layers(operators, is_view=lambda i: i not in kernels, from_outputs=from_outputs)
    split = _splitter(setting, touched_bytes, out_bytes)
    groups = [g for layer in layering.layers for g in split(layer)]
    return KernelGroups(len(layering.layers), len(kernels), groups)
