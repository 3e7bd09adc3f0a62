"""``main`` of a normalized module as the splitter's memory simulator reads it (a
:class:`~tvm_memplan.split.simulate.Program`), approximating what TVM's fusion and the arena
planner's concat elimination make of it, and the execution order the planner's order search
(:func:`~tvm_memplan.planning.order.search_order`) would run it in."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import replace

import tvm
from tvm import relax

from ...planning import DEFAULT_ALIGNMENT, Operator
from ...planning.concat import concat_slices
from ...planning.order import OrderGraph, search_order
from ...quant.qdq_graph import has_qdq
from ...split.simulate import Program, Step, peak
from ..conv_layouts import conv2d_layouts
from ..ir_utils import op_name, static_shape, top_level_bindings
from ..module import with_blocks
from .normalize import constant_bindings
from .operators import CONCAT, DEQUANTIZE, ELEMENTWISE, QUANTIZE, blocked_tensors, nbytes


def program_of(
    mod: tvm.IRModule, alignment: int = DEFAULT_ALIGNMENT, inputs_in_arena: bool = False, block: int | None = None
) -> Program:
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

    ``inputs_in_arena`` (``build --io-in-arena``): the model's inputs count too, until their last reader.
    ``block``: the model is built in the blocked layout of ``block`` channels a block (NCHW[x]c), whose
    tensors the arena holds with their channels rounded up to whole blocks (None: NCHW); the inputs stay
    NCHW (a stem reads its input as ``NCHW1c``, a view).
    """
    program = _fused_program(mod, alignment, block)[0]
    if inputs_in_arena:  # the input itself is in the arena (a blocked copy beside it is not simulated)
        program.sizes.update({param.name: nbytes(param) for param in mod["main"].params})
        program.layout_copies = frozenset()
    return program


def memory_order(
    mod: tvm.IRModule, seconds: float = 10.0, alignment: int = DEFAULT_ALIGNMENT, block: int | None = None
) -> list[str]:
    """``main``'s binding names in the order of least simulated peak: the planner's execution-order
    search (Serenity's dynamic programming, beam search, branch grouping) over the simulator's
    kernels, a fused kernel one operator that may write in place, so that the simulator peaks where
    the planner, which reorders the fused module, plans. Program order unless an order lowers the peak
    (or ``main`` is more than one dataflow block). ``block``: as :func:`program_of`'s."""
    program, kernel_of = _fused_program(mod, alignment, block)
    names = [step.name for step in program.steps]
    blocks = mod["main"].body.blocks
    if len(blocks) != 1 or not isinstance(blocks[0], relax.DataflowBlock):
        return names
    members: dict[str, list[str]] = {}
    for name in names:
        members.setdefault(kernel_of[name], []).append(name)
    reads = {head: [] for head in members}  # bindings of other kernels each kernel reads
    for b in top_level_bindings(mod["main"]):
        if b.var.name not in kernel_of:
            continue  # a binding computed from constants (a QDQ module's weights): outside the program
        head = kernel_of[b.var.name]
        reads[head] += [v.name for v in relax.analysis.free_vars(b.value) if kernel_of.get(v.name, head) != head]
    heads = _topological(list(members), {head: {kernel_of[r] for r in reads[head]} for head in members})
    if heads is None:
        return names  # kernels that wait on each other: keep the program order
    steps = {step.name: step for step in program.steps}
    overwrites = {i: [t for name in members[head] for t in steps[name].overwrites] for i, head in enumerate(heads)}
    graph = OrderGraph.from_operators(
        [Operator(head, tuple(dict.fromkeys(reads[head])), tuple(members[head])) for head in heads],
        program.sizes,
        {binding: tensor for binding, tensor in program.aliases.items() if binding != tensor},
        overwrites,
    )
    result = search_order(graph, time_budget=seconds)
    order = [name for i in result.order for name in members[heads[i]]]
    program_peak = peak(program).bytes
    if result.peak >= program_peak:
        return names
    if peak(_fused_program(in_order(mod, order), alignment, block)[0]).bytes >= program_peak:
        return names
    return order


def in_order(mod: tvm.IRModule, names: Sequence[str]) -> tvm.IRModule:
    """``mod`` with ``main``'s bindings in the order of ``names`` (:func:`memory_order`), when that is
    not already their order; ``main`` must be one dataflow block. Bindings ``names`` leaves out (those a
    QDQ module computes from constants alone, which the simulator does not see) go first."""
    func = mod["main"]
    blocks = func.body.blocks
    current = [b.var.name for b in top_level_bindings(func)]
    constants = {v.name for v in constant_bindings(func)} if has_qdq(func) else set()
    left_out = [n for n in current if n not in set(names)]
    order = left_out + list(names)
    if order == current:
        return mod
    single_block = len(blocks) == 1 and isinstance(blocks[0], relax.DataflowBlock)
    if not single_block or sorted(order) != sorted(current) or not set(left_out) <= constants:
        raise ValueError("the order must name every binding of main's single dataflow block")
    by_name = {b.var.name: b for b in blocks[0].bindings}
    updated = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    updated["main"] = with_blocks(func, [relax.DataflowBlock([by_name[n] for n in order])])
    return updated


def _topological(heads: list[str], needs: dict[str, set[str]]) -> list[str] | None:
    """``heads`` in a dependency order, each as early as its program position allows (Kahn's
    algorithm); None when they depend on each other in a cycle."""
    position = {head: i for i, head in enumerate(heads)}
    waiting = {head: len(needs[head]) for head in heads}
    users: dict[str, list[str]] = {head: [] for head in heads}
    for head in heads:
        for need in needs[head]:
            users[need].append(head)
    ready = [position[h] for h in heads if not waiting[h]]
    heapq.heapify(ready)
    order = []
    while ready:
        head = heads[heapq.heappop(ready)]
        order.append(head)
        for user in users[head]:
            waiting[user] -= 1
            if not waiting[user]:
                heapq.heappush(ready, position[user])
    return order if len(order) == len(heads) else None


def _fused_program(mod: tvm.IRModule, alignment: int, block: int | None = None) -> tuple[Program, dict[str, str]]:
    """The simulator program and, per binding, the first binding of the fused kernel it runs in."""
    func = mod["main"]
    quantized = has_qdq(func)
    blocked = blocked_tensors(func) if block is not None else frozenset()
    constants = constant_bindings(func) if quantized else set()
    bindings = [b for b in top_level_bindings(func) if b.var not in constants]
    uses: dict[relax.Var, int] = {}
    elementwise_uses: dict[relax.Var, int] = {}
    for b in bindings:
        for var in relax.analysis.free_vars(b.value):
            uses[var] = uses.get(var, 0) + 1
            elementwise_uses[var] = elementwise_uses.get(var, 0) + (op_name(b.value) in ELEMENTWISE)

    def fused_into_consumer(var: relax.Var) -> bool:
        """TVM fuses a concat into its one elementwise consumer (DenseNet's concat, batch norm,
        ReLU): the kernel writes the consumer's tensor and no concat kernel is left to eliminate."""
        return uses.get(var, 0) == 1 and elementwise_uses.get(var, 0) == 1

    placed: set[relax.Var] = set()
    returned = set(relax.analysis.free_vars(func.body.body))
    for b in reversed(bindings):  # ``gv = lv4``: the tensor returned is lv4's
        if b.var in returned and isinstance(b.value, relax.Var):
            returned.add(b.value)
    # a blocked build writes a returned blocked tensor into the arena and transforms it to the NCHW output
    returned -= {b.var for b in bindings if b.var in blocked and not isinstance(b.value, relax.Var)}
    tensor: dict[relax.Var, str] = {p: p.name for p in func.params}
    copies = _blocked_inputs(func, bindings, block) if block is not None else {}
    sizes: dict[str, int] = dict(copies)
    aliases: dict[str, str] = {}
    kernel_of: dict[str, str] = {}
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
            kernel_of[name] = kernel_of.get(value.args[0].name, name)  # a view runs with its producer
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
        kernel_of[name] = kernel_of.get(first.name, first.name) if fused else name
        if fused:
            target = tensor[first]
            aliases[name] = target
            if var in returned:
                sizes.pop(target, None)
            elif op == QUANTIZE and target in sizes:
                sizes[target] = nbytes(var, block if var in blocked else None)
        else:
            target = name
            if var not in returned:
                sizes[target] = nbytes(var, block if var in blocked else None)
        tensor[var] = target
        overwrites = _pointwise_operands(value, var, tensor, target) if op in ELEMENTWISE else ()
        steps.append(Step(name, target, tuple(r for r in reads if r != target), overwrites))
        if op == CONCAT and target in sizes and not fused_into_consumer(var):
            _eliminate_concat(value, target, tensor, sizes, aliases, steps, alignment, placed)
    # a tensor a kernel also reads in a reduction (a matmul's operand) may not be overwritten in place
    reduced: dict[str, set[str]] = {}
    for b, step in zip(bindings, steps, strict=True):
        if op_name(b.value) not in ELEMENTWISE:
            reduced.setdefault(kernel_of[step.name], set()).update(step.reads)
    for i, step in enumerate(steps):
        kept = tuple(t for t in step.overwrites if t not in reduced.get(kernel_of[step.name], ()))
        if kept != step.overwrites:
            steps[i] = replace(step, overwrites=kept)
    return Program(steps, sizes, aliases, frozenset(copies)), kernel_of


def _blocked_inputs(func: relax.Function, bindings: list[relax.VarBinding], block: int) -> dict[str, int]:
    """Inputs a blocked build copies into the arena as NCHW[x]c, by name, with their blocked bytes: those a
    convolution reads in ``NCHW[x]c`` (:func:`~..conv_layouts.conv2d_layouts`, the layout pass's rule; a
    stem's 3 channels are read in place as ``NCHW1c``). The copy lives from its first reader to its last,
    as the input does in the simulator."""
    copied: dict[str, int] = {}
    for b in bindings:
        value = b.value
        if not isinstance(value, relax.Call) or not value.args or value.args[0] not in func.params:
            continue
        layouts = conv2d_layouts(value, block)
        if layouts is not None and layouts[0] == f"NCHW{block}c":
            copied[value.args[0].name] = nbytes(value.args[0], block)
    return copied


def _pointwise_operands(value: relax.Call, var: relax.Var, tensor: dict, target: str) -> tuple[str, ...]:
    """The tensors an elementwise operator reads at the index it writes: operands of its output's
    shape and type, each passed once (the in-place kernel's condition,
    :func:`~tvm_memplan.relax.inplace.inplace_safe`)."""
    shape = static_shape(var.ty)
    operands = [a for a in value.args if isinstance(a, relax.Var) and a in tensor]
    return tuple(
        dict.fromkeys(
            tensor[a]
            for a in operands
            if tensor[a] != target
            and operands.count(a) == 1
            and static_shape(a.ty) == shape
            and str(a.ty.dtype) == str(var.ty.dtype)
        )
    )


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
    value: relax.Call,
    target: str,
    tensor: dict,
    sizes: dict,
    aliases: dict,
    steps: list[Step],
    alignment: int,
    placed: set[relax.Var],
) -> None:
    """Concat elimination as the planner decides it: inputs that are distinct arena tensors, none
    already ``placed`` in another concat, and contiguous slices of the output at aligned offsets
    (:func:`~tvm_memplan.planning.concat.concat_slices`) are written into their slices. They become
    the concat's tensor, alive from the first input on."""
    fields = value.args[0].fields if isinstance(value.args[0], relax.Tuple) else []
    shape = static_shape(value.ty)
    inputs = [f for f in fields if isinstance(f, relax.Var) and f in tensor and tensor[f] in sizes]
    merged = {tensor[f] for f in inputs}
    if not fields or shape is None or len(inputs) != len(fields) or len(merged) != len(fields):
        return  # an input outside the arena, or one tensor twice (the planner keeps such a copy)
    if any(f in placed for f in inputs):
        return  # an input already in another concat's tensor (the planner keeps this one a copy)
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
    for var, written in list(tensor.items()):
        if written in merged:  # later readers of an input read its slice of the concat's tensor
            tensor[var] = target
            placed.add(var)
    for i, step in enumerate(steps):
        writes = target if step.writes in merged else step.writes
        reads = tuple(dict.fromkeys(target if r in merged else r for r in step.reads))
        overwrites = tuple(t for t in step.overwrites if t not in merged and t != writes)
        steps[i] = Step(step.name, writes, tuple(r for r in reads if r != writes), overwrites)
