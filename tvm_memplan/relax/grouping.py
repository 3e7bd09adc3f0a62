"""Layer grouping on Relax functions (seed 000): layer-wise binding order and group step ranges.

Two views of one function: :func:`LayerOrder` reorders dataflow bindings layer by layer
(maxdist depth) so that every group is a run of consecutive kernels; after ``CallTIRRewrite``
:func:`kernel_groups` finds the same layers among the destination-passing calls and returns the
step ranges each group occupies, which the arena planner turns into the F-predicate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import tvm
from tvm import relax

from ..planning import Operator
from ..planning.grouping import (
    AUTO,
    SEQ,
    CostModel,
    GroupSetting,
    Layering,
    cost_aware_groups,
    group_schedule,
    maxdist_layers,
    split_layer,
)
from .inplace import prim_func_of
from .module import relax_functions, with_blocks, with_functions
from .tensor_types import static_nbytes

LAYER_ORDER_PASS_NAME = "tvm_memplan.LayerOrder"
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


def dataflow_layering(block: relax.DataflowBlock) -> Layering:
    """The block's bindings as maxdist layers; views take their producer's depth."""
    bindings = list(block.bindings)
    operators = [Operator(i, tuple(relax.analysis.free_vars(b.value)), (b.var,)) for i, b in enumerate(bindings)]
    return maxdist_layers(operators, is_view=lambda i: _is_dataflow_view(bindings[i].value))


def LayerOrder() -> tvm.transform.Pass:  # noqa: N802 - named like TVM's passes
    """Reorder every dataflow block layer by layer, each layer in program order, views right
    after their producer's layer: any cut of a layer into consecutive runs is then a valid group."""

    @tvm.transform.module_pass(opt_level=0, name=LAYER_ORDER_PASS_NAME)
    def _pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        updates = {}
        for gvar, func in relax_functions(mod):
            blocks, changed = [], False
            for block in func.body.blocks:
                if not isinstance(block, relax.DataflowBlock) or len(block.bindings) < 2:
                    blocks.append(block)
                    continue
                order = group_schedule(dataflow_layering(block), SEQ).order
                changed |= order != list(range(len(block.bindings)))
                blocks.append(relax.DataflowBlock([block.bindings[i] for i in order]))
            if changed:
                updates[gvar] = with_blocks(func, blocks)
        return with_functions(mod, updates)

    return _pass


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


def kernel_groups(bindings: Sequence[relax.Binding], mod: tvm.IRModule, setting: GroupSetting) -> KernelGroups:
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
    layering = maxdist_layers(operators, is_view=lambda i: i not in kernels)
    if setting == AUTO:
        seconds = {op: touched_bytes[op] / BYTES_PER_SECOND for op in kernels}
        groups = [g for layer in layering.layers for g in cost_aware_groups(layer, seconds, out_bytes, AUTO_COST_MODEL)]
    else:
        groups = [g for layer in layering.layers for g in split_layer(layer, setting)]
    return KernelGroups(len(layering.layers), len(kernels), groups)
