"""Fine-grained splitting (seed 003) on Relax: find channel chains with the axis connection graph,
rewrite them into tiles.

A *channel chain* is a run of operators joined by one component of the axis connection graph
along the channel axis of NCHW tensors: a head whose output channels are independent (a
convolution with ``groups=1``), per-channel operators (bias, activations, depthwise and grouped
convolutions, pools), and a tail that either reduces over the channels (the next ``groups=1``
convolution: the seed's temporal axis, computed as partial sums accumulated tile by tile) or
takes the chain's last tensor whole (then the tiles are concatenated, and the arena planner's
concat elimination lets every tile write straight into its region). Split into ``parts`` tiles,
the chain's big intermediates exist one tile at a time.

The rewrite is on the high-level module (before legalization), so every tile goes through
TVM's legalization and fusion and gets the same default schedules as the original operators.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te, topi
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..errors import UserError
from ..split.acg import AxisConnectionGraph, build_acg
from ..split.simulate import Chain, Program, SplitChoice, Step
from .axes import graph_model
from .tensor_types import static_shape

CHANNEL = 1
_CONV = "relax.nn.conv2d"
_PER_CHANNEL_OPS = {
    "relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum", "relax.minimum",
    "relax.nn.relu", "relax.nn.silu", "relax.nn.gelu", "relax.sigmoid", "relax.tanh", "relax.clip",
    "relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.leakyrelu", "relax.exp", "relax.sqrt",
}
# call_tir kernels the ONNX importer emits for Clip and friends, raised back to Relax operators.
_RAISABLE = {"maximum": (topi.maximum, relax.op.maximum), "minimum": (topi.minimum, relax.op.minimum),
             "add": (topi.add, relax.op.add), "multiply": (topi.multiply, relax.op.multiply),
             "subtract": (topi.subtract, relax.op.subtract), "divide": (topi.divide, relax.op.divide)}


def _op_name(value: relax.Expr) -> str | None:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return str(value.op.name)
    return None


def _bindings(func: relax.Function) -> list[relax.VarBinding]:
    return [b for block in func.body.blocks for b in block.bindings]


def _const(expr: relax.Expr) -> np.ndarray | None:
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


def _nbytes(var: relax.Var) -> int:
    shape = static_shape(var.ty)
    return int(np.prod(shape)) * tvm.runtime.DataType(str(var.ty.dtype)).bits // 8 if shape else 0


def normalize(mod: tvm.IRModule) -> tvm.IRModule:
    """Fold constants and raise the importer's elementwise ``call_tir`` kernels to Relax operators
    (structurally equal to TOPI's), so the rewriter sees operators it can tile."""
    mod = relax.transform.FoldConstant()(mod)
    call_tir = tvm.ir.Op.get("relax.call_tir")

    @mutator
    class _Raise(PyExprMutator):
        def visit_call_(self, call: relax.Call) -> relax.Expr:
            call = super().visit_call_(call)
            if not call.op.same_as(call_tir):
                return call
            gvar, args = call.args[0], list(call.args[1].fields)
            entry = _RAISABLE.get(gvar.name_hint.rstrip("0123456789"))
            if entry is None or len(args) != 2:
                return call
            shapes = [static_shape(a.ty) for a in args]
            if any(s is None for s in shapes):
                return call
            holders = [te.placeholder(list(a.ty.shape.values), str(a.ty.dtype)) for a in args]
            reference = te.create_prim_func([*holders, entry[0](*holders)])
            try:
                tvm.ir.assert_structural_equal(reference.without_attr("global_symbol"), mod[gvar].without_attr("global_symbol"))
            except ValueError:
                return call
            return entry[1](*args)

    raiser = _Raise(mod)
    gvar = mod.get_global_var("main")
    raiser.builder_.update_func(gvar, raiser.visit_expr(mod["main"]))
    return relax.transform.DeadCodeElimination()(raiser.builder_.finalize())


def axis_graph(mod: tvm.IRModule) -> tuple[AxisConnectionGraph, object]:
    """The axis connection graph of a normalized module, from its legalized TIR."""
    graph = graph_model(relax.transform.LegalizeOps()(mod))
    return build_acg(graph), graph


def _channels(var: relax.Expr) -> int | None:
    shape = static_shape(var.ty)
    return shape[CHANNEL] if shape is not None and len(shape) == 4 and shape[0] == 1 else None


def find_chains(mod: tvm.IRModule) -> list[Chain]:
    """Every channel chain of ``main`` whose tensors the axis connection graph joins."""
    func = mod["main"]
    acg, graph = axis_graph(mod)
    bindings = _bindings(func)
    uses: dict[relax.Var, list[int]] = {}
    for i, b in enumerate(bindings):
        for var in relax.analysis.free_vars(b.value):
            uses.setdefault(var, []).append(i)
    outputs = set(relax.analysis.free_vars(func.body.body))
    defined_at = {b.var: i for i, b in enumerate(bindings)}

    def single_consumer(var) -> int | None:
        users = uses.get(var, [])
        return users[0] if len(users) == 1 and var not in outputs else None

    def component(var) -> int | None:
        comp = acg.component_of(var.name, CHANNEL)
        return comp.id if comp is not None else None

    chains = []
    for i, head in enumerate(bindings):
        value = head.value
        if _op_name(value) != _CONV or int(value.attrs.groups) != 1 or _channels(head.var) is None:
            continue
        if _const(value.args[1]) is None:
            continue
        comp = component(head.var)
        if comp is None:
            continue
        current, mids, units = head.var, [], _channels(head.var)
        tail = None
        while True:
            j = single_consumer(current)
            if j is None:
                break
            nxt = bindings[j]
            op = _op_name(nxt.value)
            if op == _CONV and nxt.value.args[0].same_as(current) and _const(nxt.value.args[1]) is not None:
                groups = int(nxt.value.attrs.groups)
                channels_in, channels_out = _channels(current), _channels(nxt.var)
                if groups == 1:
                    tail = nxt.var
                    break
                if channels_out is None or channels_in % groups or channels_out % groups or units % groups:
                    break
                units = groups
            elif op not in _PER_CHANNEL_OPS or _channels(nxt.var) != _channels(current):
                break
            if not _operands_ok(nxt.value, current, defined_at, i):
                break
            if component(nxt.var) != comp:
                break
            mids.append(nxt.var)
            current = nxt.var
        if tail is not None and component(tail) == comp:
            tail = None  # a tail must reduce over the component, not carry it on
        if tail is None and not mids:
            continue
        tiles = [head.var, *mids] if tail is not None else [head.var, *mids[:-1]]
        chains.append(Chain(head.var.name, tuple(m.name for m in mids), tail.name if tail is not None else None,
                            units, sum(_nbytes(v) for v in tiles)))
    return chains


def _operands_ok(value: relax.Call, current: relax.Var, defined_at: dict, head_index: int) -> bool:
    """Other operands are constants or tensors that exist before the chain starts."""
    for arg in value.args:
        if arg.same_as(current) or isinstance(arg, tvm.ir.GenericConst):
            continue
        if isinstance(arg, relax.Var) and defined_at.get(arg, -1) < head_index:
            continue
        return False
    return True


def _tile_ranges(parts: int, units: int, channels: int) -> list[tuple[int, int]]:
    per_unit = channels // units
    return [((t * units // parts) * per_unit, ((t + 1) * units // parts) * per_unit) for t in range(parts)]


def _slice_operand(arg: relax.Expr, lo: int, hi: int, channels: int, bb: relax.BlockBuilder) -> relax.Expr:
    """An operand broadcast against a tile: constants sliced along the channel axis, full
    tensors through ``strided_slice``, scalars and per-tensor values unchanged."""
    shape = static_shape(arg.ty)
    if shape is None or len(shape) != 4 or shape[CHANNEL] != channels:
        return arg
    data = _const(arg)
    if data is not None:
        return relax.const(np.ascontiguousarray(data[:, lo:hi]), str(arg.ty.dtype))
    return bb.emit(relax.op.strided_slice(arg, axes=[CHANNEL], begin=[lo], end=[hi]))


def _conv(value: relax.Call, data: relax.Expr, weight: np.ndarray, groups: int) -> relax.Expr:
    a = value.attrs
    return relax.op.nn.conv2d(
        data, relax.const(np.ascontiguousarray(weight), str(value.args[1].ty.dtype)),
        strides=[int(x) for x in a.strides], padding=[int(x) for x in a.padding],
        dilation=[int(x) for x in a.dilation], groups=groups, data_layout=str(a.data_layout),
        kernel_layout=str(a.kernel_layout), out_layout=str(a.out_layout),
        out_dtype=str(value.ty.dtype),
    )


def _conv_accumulate(bb: relax.BlockBuilder, conv: relax.Call, data: relax.Expr, weight: np.ndarray,
                     running: relax.Expr) -> relax.Expr:
    """``conv(data, weight) + running`` as one TE kernel (a partial sum over a channel tile)."""
    a = conv.attrs
    if str(a.data_layout) != "NCHW" or str(a.kernel_layout) != "OIHW":
        raise UserError(f"split: conv2d layout {a.data_layout}/{a.kernel_layout} is not NCHW/OIHW")
    strides, padding, dilation = ([int(x) for x in v] for v in (a.strides, a.padding, a.dilation))
    dtype = str(conv.ty.dtype)

    def compute(x, w, acc):
        return topi.add(topi.nn.conv2d_nchw(x, w, strides, padding, dilation, out_dtype=dtype), acc)

    return bb.emit_te(compute, data, relax.const(np.ascontiguousarray(weight), dtype), running, primfunc_name_hint="conv2d_accumulate")


@mutator
class _SplitRewriter(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, choices: list[SplitChoice]) -> None:
        super().__init__(mod)
        self.by_head = {c.chain.head: c for c in choices}
        self.skip = {name for c in choices for name in c.chain.bindings[1:]}
        self.values: dict[str, relax.VarBinding] = {}
        self.replaced: dict[str, relax.Expr] = {}

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        name = binding.var.name
        self.values[name] = binding
        if name in self.skip:
            return
        choice = self.by_head.get(name)
        if choice is None:
            super().visit_var_binding_(binding)
            return
        self._emit_chain(choice, binding)

    def _emit_chain(self, choice: SplitChoice, head: relax.VarBinding) -> None:
        bb, chain = self.builder_, choice.chain
        func = self.mod_main
        table = {b.var.name: b for b in _bindings(func)}
        links = [table[n] for n in chain.bindings]
        head_input = self.visit_expr(head.value.args[0])
        tail = table[chain.tail] if chain.tail else None
        mids = [table[n] for n in chain.mids]
        accumulated, tiles_out = None, []
        for t in range(choice.parts):
            channels = _channels(head.var)
            lo, hi = _tile_ranges(choice.parts, chain.units, channels)[t]
            weight = _const(head.value.args[1])
            current = bb.emit(_conv(head.value, head_input, weight[lo:hi], 1))
            previous = head.var
            for mid in mids:
                value, c_in = mid.value, _channels(previous)
                lo, hi = _tile_ranges(choice.parts, chain.units, c_in)[t]
                if _op_name(value) == _CONV:
                    groups = int(value.attrs.groups)
                    c_out = _channels(mid.var)
                    olo, ohi = _tile_ranges(choice.parts, chain.units, c_out)[t]
                    new = _conv(value, current, _const(value.args[1])[olo:ohi], groups * (hi - lo) // c_in)
                else:
                    args = [current if a.same_as(previous) else _slice_operand(self.visit_expr(a), lo, hi, c_in, bb)
                            for a in value.args]
                    new = relax.Call(value.op, args, value.attrs, value.ty_args)
                current = bb.emit(new)
                previous = mid.var
            if tail is not None:
                c_in = _channels(previous)
                lo, hi = _tile_ranges(choice.parts, chain.units, c_in)[t]
                weight = _const(tail.value.args[1])[:, lo:hi]
                if accumulated is None:
                    accumulated = _conv(tail.value, current, weight, 1)
                else:
                    # One kernel per tile (conv + add of the running sum): FuseOps would otherwise
                    # gather every add into the last tile's kernel and keep all partial sums alive.
                    accumulated = bb.emit(accumulated) if not isinstance(accumulated, relax.Var) else accumulated
                    accumulated = _conv_accumulate(bb, tail.value, current, weight, accumulated)
            else:
                tiles_out.append(current)
        if tail is not None:
            bb.emit_normalized(relax.VarBinding(tail.var, bb.normalize(accumulated)))
        else:
            bb.emit_normalized(relax.VarBinding(links[-1].var, bb.normalize(relax.op.concat(tiles_out, axis=CHANNEL))))


def split_chains(mod: tvm.IRModule, choices: list[SplitChoice]) -> tvm.IRModule:
    """A copy of the normalized ``mod`` with every chosen chain split into its parts."""
    if not choices:
        return mod
    seen: set[str] = set()
    for choice in choices:
        if seen & set(choice.chain.bindings):
            raise ValueError(f"chain {choice.chain.name} overlaps another chosen chain")
        seen.update(choice.chain.bindings)
    mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    rewriter = _SplitRewriter(mod, choices)
    rewriter.mod_main = mod["main"]
    func = rewriter.visit_expr(mod["main"])
    rewriter.builder_.update_func(mod.get_global_var("main"), func)
    return relax.transform.DeadCodeElimination()(rewriter.builder_.finalize())


_ELEMENTWISE = _PER_CHANNEL_OPS - {"relax.nn.max_pool2d", "relax.nn.avg_pool2d"}


def program_of(mod: tvm.IRModule) -> Program:
    """``main`` of a normalized module as a simulator program, in binding order.

    Approximates TVM's fusion: an elementwise operator whose tensor operand has no other
    consumer runs in its producer's kernel and writes the producer's tensor; reshapes are
    views. Inputs, constants and returned tensors stay outside the arena (no size).
    """
    func = mod["main"]
    bindings = _bindings(func)
    uses: dict[relax.Var, int] = {}
    for b in bindings:
        for var in relax.analysis.free_vars(b.value):
            uses[var] = uses.get(var, 0) + 1
    returned = set(relax.analysis.free_vars(func.body.body))
    tensor: dict[relax.Var, str] = {p: p.name for p in func.params}
    sizes: dict[str, int] = {}
    aliases: dict[str, str] = {}
    steps: list[Step] = []
    for b in bindings:
        var, value, name = b.var, b.value, b.var.name
        reads = tuple(tensor[v] for v in relax.analysis.free_vars(value) if v in tensor)
        op = _op_name(value)
        first = value.args[0] if isinstance(value, relax.Call) and value.args else None
        fused = (
            (op in _ELEMENTWISE or op == "relax.reshape") and isinstance(first, relax.Var) and first in tensor
            and uses.get(first, 0) == 1 and first not in func.params and tensor[first] in sizes
        )
        if fused:
            target = tensor[first]
            aliases[name] = target
            if var in returned:
                sizes.pop(target, None)
        else:
            target = name
            if var not in returned:
                sizes[target] = _nbytes(var)
        tensor[var] = target
        steps.append(Step(name, target, tuple(r for r in reads if r != target)))
    return Program(steps, sizes, aliases)


@mutator
class _Substitute(PyExprMutator):
    def __init__(self, remap: dict) -> None:
        super().__init__()
        self.remap = remap

    def visit_var_(self, var: relax.Var) -> relax.Expr:
        return self.remap.get(var, var)

    def visit_dataflow_var_(self, var: relax.Var) -> relax.Expr:
        return self.remap.get(var, var)


def chain_module(mod: tvm.IRModule, chain: Chain) -> tvm.IRModule:
    """The chain alone: its outside tensors as parameters, its last tensor returned, binding
    names kept (so :func:`split_chains` applies to it as to the whole model)."""
    table = {b.var.name: b for b in _bindings(mod["main"])}
    links = [table[n] for n in chain.bindings]
    defined = {b.var for b in links}
    externals = list(dict.fromkeys(
        v for b in links for v in relax.analysis.free_vars(b.value) if v not in defined
    ))
    params = [relax.Var(v.name, v.ty) for v in externals]
    remap = dict(zip(externals, params))
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            for i, b in enumerate(links):
                value = _Substitute(remap).visit_expr(b.value)
                emit = bb.emit_output if i == len(links) - 1 else bb.emit
                remap[b.var] = emit(value, name_hint=b.var.name)
        bb.emit_func_output(remap[links[-1].var])
    return normalize(bb.get())


def chain_signature(mod: tvm.IRModule) -> str:
    """What a chain module's latency depends on (operators, attributes, shapes), not its
    weights or variable names: identical blocks of a network share one measurement."""
    import hashlib
    import re

    text = mod["main"].script(show_meta=False)
    names: dict[str, str] = {}
    text = re.sub(r"\b(lv\d*(?:_\d+)?|gv\d*)\b", lambda m: names.setdefault(m.group(1), f"v{len(names)}"), text)
    return hashlib.sha1(text.encode()).hexdigest()[:16]
