"""Relax IR → planning problem.

Works on a Relax function after ``CallTIRRewrite``: every intermediate tensor is a binding
``alloc = R.builtin.alloc_tensor(shape, dtype, device, scope)`` followed by a
destination-passing call that writes it. Each top-level binding is one step of execution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import tvm
from tvm import relax, tirx

from ..planning import DEFAULT_ALIGNMENT, Buffer, Operator, Problem, tensor_lifetimes
from .inplace import AliasDecisions, decide_aliases
from .ir_utils import static_shape, top_level_bindings
from .sites import AllocSite
from .tensor_types import dtype_nbytes

_BUILTIN_ALLOC = tvm.ir.Op.get("relax.builtin.alloc_tensor")
_VIEW_OPS = (tvm.ir.Op.get("relax.reshape"), tvm.ir.Op.get("relax.memory.view"))


@dataclass
class ArenaProblem:
    """The planning problem of one arena: tensors of one (device, storage scope)."""

    device_index: int
    scope: str
    sites: list[AllocSite]
    problem: Problem


@dataclass
class FunctionPlanInput:
    """Everything the planner needs from one Relax function, and what it leaves alone."""

    arenas: list[ArenaProblem]
    unplanned: dict[str, str] = field(default_factory=dict)
    """Allocation name → why it is left to TVM (function output, symbolic shape, ...)."""
    decisions: AliasDecisions = field(default_factory=AliasDecisions)
    removable_ops: int = 0
    """View bindings (reshape and friends): no kernel runs, the output aliases the input."""

    @property
    def planned_sites(self) -> list[AllocSite]:
        return [site for arena in self.arenas for site in arena.sites]


def _int_value(expr: object) -> int | None:
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    return None


def _string_value(expr: object) -> str:
    if isinstance(expr, tvm.ir.StringImm):
        return str(expr.value)
    return str(expr)


def _dtype_value(expr: object) -> str:
    value = getattr(expr, "value", expr)
    return str(value)


def _alloc_site(binding: relax.Binding, step: int) -> tuple[AllocSite | None, str | None]:
    """The allocation a binding makes, or why it cannot be planned (None, None: not an allocation)."""
    value = getattr(binding, "value", None)
    if not (isinstance(value, relax.Call) and value.op.same_as(_BUILTIN_ALLOC)):
        return None, None
    shape_arg, dtype_arg, device_arg = value.args[0], value.args[1], value.args[2]
    scope = _string_value(value.args[3]) if len(value.args) > 3 else "global"
    shape = static_shape(shape_arg)
    if shape is None:
        return None, "symbolic shape (left to StaticPlanBlockMemory)"
    dtype = _dtype_value(dtype_arg)
    device_index = _int_value(device_arg)
    if device_index is None:
        return None, "dynamic device index"
    count = 1
    for dim in shape:
        count *= dim
    return AllocSite(binding.var, step, shape, dtype, dtype_nbytes(dtype, count), device_index, scope), None


def _is_prim_func_call(value: relax.Expr, mod: tvm.IRModule) -> bool:
    """A destination-passing call of a PrimFunc: it writes its arguments, its result aliases nothing."""
    if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.GlobalVar):
        return False
    return value.op in mod and isinstance(mod[value.op], tirx.PrimFunc)


def _may_alias(value: relax.Expr, var: relax.Var) -> bool:
    """Whether the binding's result may point into the bytes of the tensors it reads.

    Views (reshape, memory.view, plain var copies), tuples and calls we cannot see into
    (packed functions, Relax subfunctions, control flow) are assumed to; results that hold no
    tensor (shapes, scalars, void) cannot.
    """
    ty = getattr(var, "ty", None)
    if isinstance(ty, (relax.ShapeType, tvm.ir.PrimType)):
        return False
    if isinstance(ty, (relax.TupleType, tvm.ir.TupleType)) and len(ty.fields) == 0:
        return False
    return True


def _shared_within(
    lifetimes: dict, operators: Sequence[Operator], kernel_steps: set[int], concurrent: Sequence[tuple[int, int]]
) -> dict:
    """Lifetimes for the in-place decisions: a tensor two kernels of one concurrent range read
    lives past the range, so no kernel there may take it as its in-place source."""
    widened = dict(lifetimes)
    for lo, hi in concurrent:
        readers: dict = {}
        for step in range(lo, hi):
            if step in kernel_steps:
                for tensor in operators[step].inputs:
                    readers[tensor] = readers.get(tensor, 0) + 1
        for tensor, count in readers.items():
            if count > 1 and tensor in widened:
                start, end = widened[tensor]
                widened[tensor] = (start, max(end, hi + 1))
    return widened


def extract_plan_input(
    func: relax.Function,
    mod: tvm.IRModule,
    alignment: int = DEFAULT_ALIGNMENT,
    inplace: bool = False,
    concurrent: Sequence[tuple[int, int]] = (),
) -> FunctionPlanInput:
    """Find the statically shaped intermediate tensors of ``func`` and their lifetimes.

    A view or tuple of a tensor extends the tensor's lifetime to the view's last use;
    tensors reachable from the function's result are outputs and stay unplanned. With
    ``inplace``, in-place kernels and removable concats become aliases in the problem.
    ``concurrent`` step ranges run their kernels at once (layer grouping): a tensor two of a
    range's kernels read is never overwritten in place there (the other reader could see it).
    """
    bindings = top_level_bindings(func)
    sites: dict[relax.Var, AllocSite] = {}
    unplanned: dict[str, str] = {}
    owners: dict[relax.Var, frozenset[relax.Var]] = {}  # var → planned tensors it may point into
    fields: dict[relax.Var, list[frozenset[relax.Var]]] = {}  # a tuple's owners, field by field
    operators: list[Operator] = []
    removable_ops = 0

    def owners_of(expr: relax.Expr) -> set[relax.Var]:
        if isinstance(expr, relax.TupleGetItem) and expr.tuple_value in fields:
            # one field of a tuple (a kernel's second output, say): only that field's tensors
            return set(fields[expr.tuple_value][expr.index])
        found: set[relax.Var] = set()
        for used in relax.analysis.free_vars(expr):
            found |= owners.get(used, frozenset())
        return found

    for step, binding in enumerate(bindings):
        site, reason = _alloc_site(binding, step)
        if site is not None:
            sites[binding.var] = site
            owners[binding.var] = frozenset([binding.var])
            operators.append(Operator(step, (), (binding.var,)))
            continue
        if reason is not None:
            unplanned[binding.var.name] = reason
            operators.append(Operator(step, (), ()))
            continue
        value = binding.value
        read = owners_of(value)
        operators.append(Operator(step, tuple(read), ()))
        if isinstance(value, relax.Call) and any(value.op.same_as(op) for op in _VIEW_OPS):
            removable_ops += 1
        if read and not _is_prim_func_call(value, mod) and _may_alias(value, binding.var):
            owners[binding.var] = frozenset(read)
        if isinstance(value, relax.Tuple):
            fields[binding.var] = [frozenset(owners_of(field)) for field in value.fields]

    outputs = owners_of(func.body.body) if isinstance(func.body, relax.SeqExpr) else set()
    for var in outputs:
        unplanned[var.name] = "function output (returned to the caller)"
        del sites[var]

    lifetimes = tensor_lifetimes(operators)
    decisions = AliasDecisions()
    if inplace:
        kernel_steps = {step for step, binding in enumerate(bindings) if _is_prim_func_call(binding.value, mod)}
        decision_lifetimes = _shared_within(lifetimes, operators, kernel_steps, concurrent)
        decisions = decide_aliases(bindings, sites, owners, decision_lifetimes, mod, alignment)

    groups: dict[tuple[int, str], list[relax.Var]] = {}
    for var, site in sites.items():
        groups.setdefault((site.device_index, site.scope), []).append(var)
    arenas = []
    for (device_index, scope), members in sorted(groups.items()):
        members.sort(key=lambda var: sites[var].step)
        index = {var: i for i, var in enumerate(members)}
        buffers = [Buffer(var, sites[var].nbytes, *lifetimes[var]) for var in members]
        aliases = {
            index[var]: (index[target], delta)
            for var, (target, delta) in decisions.aliases.items()
            if var in index and target in index
        }
        problem = Problem(buffers, alignment=alignment, aliases=aliases)
        arenas.append(ArenaProblem(device_index, scope, [sites[var] for var in members], problem))
    return FunctionPlanInput(arenas=arenas, unplanned=unplanned, decisions=decisions, removable_ops=removable_ops)
