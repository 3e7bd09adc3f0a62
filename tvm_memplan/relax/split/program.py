"""``main`` of a normalized module as the splitter's memory simulator reads it (a
:class:`~tvm_memplan.split.simulate.Program`), approximating what TVM's fusion and the arena
planner's concat elimination make of it."""

from __future__ import annotations

import tvm
from tvm import relax

from ...planning import DEFAULT_ALIGNMENT
from ...planning.concat import concat_slices
from ...quant.qdq_graph import has_qdq
from ...split.simulate import Program, Step
from ..ir_utils import op_name, static_shape, top_level_bindings
from .normalize import constant_bindings
from .operators import DEQUANTIZE, ELEMENTWISE, QUANTIZE, nbytes


def program_of(mod: tvm.IRModule, alignment: int = DEFAULT_ALIGNMENT) -> Program:
    """``main`` of a normalized module as a simulator program, in binding order.

    Approximates TVM's fusion: an elementwise operator runs in its producer's kernel and writes
    the producer's tensor when that operand has no other consumer, or when all its consumers are
    elementwise and its other operands come from the same kernel (a GELU's diamond fuses whole);
    reshapes are views. Inputs, constants and returned tensors stay outside the arena (no size).
    Concats are eliminated by the planner's rule at its ``alignment``.

    A QDQ module as ``LowerQDQ`` makes it: bindings computed from constants are constants, a
    dequantize is a view of its int8 input (the integer kernel reading it absorbs it), and so is the
    quantize of an input read once (fused into the convolution that reads it); another quantize
    fuses like an elementwise operator and narrows its kernel's tensor to int8.
    """
    func = mod["main"]
    quantized = has_qdq(func)
    constants = constant_bindings(func) if quantized else set()
    bindings = [b for b in top_level_bindings(func) if b.var not in constants]
    uses: dict[relax.Var, int] = {}
    elementwise_uses: dict[relax.Var, int] = {}
    for b in bindings:
        for var in relax.analysis.free_vars(b.value):
            uses[var] = uses.get(var, 0) + 1
            elementwise_uses[var] = elementwise_uses.get(var, 0) + (op_name(b.value) in ELEMENTWISE)
    returned = set(relax.analysis.free_vars(func.body.body))
    tensor: dict[relax.Var, str] = {p: p.name for p in func.params}
    sizes: dict[str, int] = {}
    aliases: dict[str, str] = {}
    steps: list[Step] = []
    views: set[relax.Var] = set()
    for b in bindings:
        var, value, name = b.var, b.value, b.var.name
        reads = tuple(tensor[v] for v in relax.analysis.free_vars(value) if v in tensor)
        op = op_name(value)
        if (
            (op == DEQUANTIZE or (op == QUANTIZE and value.args[0] in func.params and uses.get(var) == 1))
            and isinstance(value.args[0], relax.Var)
            and value.args[0] in tensor
        ):
            views.add(var)
            tensor[var] = tensor[value.args[0]]
            aliases[name] = tensor[var]
            steps.append(Step(name, tensor[var], ()))
            continue
        first = _written_operand(value, var)
        fused = (
            (op in ELEMENTWISE or op in ("relax.reshape", QUANTIZE))
            and isinstance(first, relax.Var)
            and first in tensor
            and first not in views
            and first not in func.params
            and tensor[first] in sizes
            and first not in returned
            and (
                uses.get(first, 0) == 1
                or (
                    op in ELEMENTWISE
                    and elementwise_uses[first] == uses[first]
                    and all(
                        tensor.get(v, tensor[first]) == tensor[first] or tensor[v] not in sizes
                        for v in relax.analysis.free_vars(value)
                    )
                )
            )
        )
        if fused:
            target = tensor[first]
            aliases[name] = target
            if var in returned:
                sizes.pop(target, None)
            elif op == QUANTIZE and target in sizes:
                sizes[target] = nbytes(var)
        else:
            target = name
            if var not in returned:
                sizes[target] = nbytes(var)
        tensor[var] = target
        steps.append(Step(name, target, tuple(r for r in reads if r != target)))
        if op == "relax.concat" and target in sizes:
            _eliminate_concat(value, target, tensor, sizes, aliases, steps, alignment)
    return Program(steps, sizes, aliases)


def _written_operand(value: relax.Expr, var: relax.Var) -> relax.Expr | None:
    """The operand whose buffer the binding may write when fused: a reshape's input (a view), or
    for an elementwise operator an operand of the output's shape (``multiply(scale, x)`` of a
    squeeze-excitation block broadcasts the 1x1 scale, which cannot hold the output)."""
    if not isinstance(value, relax.Call) or not value.args:
        return None
    if op_name(value) == "relax.reshape":
        return value.args[0]
    shape = static_shape(var.ty)
    if shape is None:
        return None
    return next((a for a in value.args if isinstance(a, relax.Var) and static_shape(a.ty) == shape), None)


def _eliminate_concat(
    value: relax.Call, target: str, tensor: dict, sizes: dict, aliases: dict, steps: list[Step], alignment: int
) -> None:
    """Concat elimination as the planner decides it: inputs that are distinct arena tensors and
    contiguous slices of the output at aligned offsets (:func:`~tvm_memplan.planning.concat.concat_slices`)
    are written into their slices. They become the concat's tensor, alive from the first input on."""
    fields = value.args[0].fields if isinstance(value.args[0], relax.Tuple) else []
    shape = static_shape(value.ty)
    inputs = [f for f in fields if isinstance(f, relax.Var) and f in tensor and tensor[f] in sizes]
    merged = {tensor[f] for f in inputs}
    if not fields or shape is None or len(inputs) != len(fields) or len(merged) != len(fields):
        return  # an input outside the arena, or one tensor twice (the planner keeps such a copy)
    itemsize = tvm.runtime.DataType(str(value.ty.dtype)).bits // 8
    offsets, _ = concat_slices([static_shape(f.ty) for f in inputs], shape, itemsize, alignment)
    if offsets is None:
        return
    for name in merged:
        sizes.pop(name, None)
    for binding, written in list(aliases.items()):
        if written in merged:
            aliases[binding] = target
    for f in inputs:
        aliases[f.name] = target
    for i, step in enumerate(steps):
        writes = target if step.writes in merged else step.writes
        reads = tuple(dict.fromkeys(target if r in merged else r for r in step.reads))
        steps[i] = Step(step.name, writes, tuple(r for r in reads if r != writes))
