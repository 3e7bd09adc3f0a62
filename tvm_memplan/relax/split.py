"""Fine-grained splitting (seed 003) on Relax: find channel chains with the axis connection graph,
rewrite them into tiles.

A *channel chain* is a run of operators joined by one component of the axis connection graph
along the channel axis of NCHW tensors: a head whose output channels are independent (a
convolution with ``groups=1``, or a pool over a tensor other operators keep whole, each tile
pooling a slice of its channels: the second level an inception module's pool branch needs),
per-channel operators (bias, activations, depthwise and grouped
convolutions, pools), and a tail that either reduces over the channels (the next ``groups=1``
convolution: the seed's temporal axis, computed as partial sums accumulated tile by tile) or
takes the chain's last tensor whole (then the tiles are concatenated, and the arena planner's
concat elimination lets every tile write straight into its region). Split into ``parts`` tiles,
the chain's big intermediates exist one tile at a time.

The rewrite is on the high-level module (before legalization), so every tile goes through
TVM's legalization and fusion and gets the same default schedules as the original operators.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace

import numpy as np
import tvm
from tvm import relax, te, topi
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.script import tirx as T

from ..errors import UserError
from ..split.acg import AxisConnectionGraph, build_acg
from ..split.simulate import Branch, Chain, Program, SplitChoice, Step, disjoint
from ..split.spatial import RowOp, Rows, RowWindow, tile_rows
from .axes import graph_model
from .tensor_types import static_shape
from .tile_writes import ROW_OFFSET_ATTR

CHANNEL = 1
ROWS = 2
_CONV = "relax.nn.conv2d"
_PER_CHANNEL_OPS = {
    "relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum", "relax.minimum",
    "relax.nn.relu", "relax.nn.silu", "relax.nn.gelu", "relax.sigmoid", "relax.tanh", "relax.clip",
    "relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.leakyrelu", "relax.exp", "relax.sqrt",
}
_POOLS = {"relax.nn.max_pool2d", "relax.nn.avg_pool2d"}
_ELEMENTWISE_PER_CHANNEL = _PER_CHANNEL_OPS - _POOLS
_DIAMOND_OPS = 8
"""Operators an activation diamond may have (hard-swish has four): a longer walk is not one."""
SPATIAL_WINDOWS = 6
"""Convolutions and pools one spatial chain may span (a MobileNetV2 stem and its first block):
each adds its halo to the rows the earlier ones recompute."""
_SPATIAL_BINDINGS = 40
GATHER_BELOW = 4
"""A spatial chain is also offered with its last tiles concatenated once at the end when its last
tensor is this many times smaller than its largest."""
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
    """Fold constants, raise the importer's elementwise ``call_tir`` kernels to Relax operators
    (structurally equal to TOPI's) and inference batch norms to a multiply and an add, so the
    rewriter sees operators it can tile."""
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

        def visit_tuple_getitem_(self, item: relax.TupleGetItem) -> relax.Expr:
            item = super().visit_tuple_getitem_(item)
            if item.index != 0 or not isinstance(item.tuple_value, relax.Var):
                return item
            folded = _inference_batch_norm(self.lookup_binding(item.tuple_value))
            return folded if folded is not None else item

    raiser = _Raise(mod)
    gvar = mod.get_global_var("main")
    raiser.builder_.update_func(gvar, raiser.visit_expr(mod["main"]))
    return _unique_names(relax.transform.DeadCodeElimination()(raiser.builder_.finalize()))


def _unique_names(mod: tvm.IRModule) -> tvm.IRModule:
    """Give every binding of ``main`` its own name: chains, the simulator and the latency cache
    name bindings, and Relax lets emitted ones repeat (the batch-norm fold's did)."""
    seen = {p.name for p in mod["main"].params}

    @mutator
    class _Rename(PyExprMutator):
        def visit_var_binding_(self, binding: relax.VarBinding) -> None:
            name = binding.var.name
            if name not in seen:
                seen.add(name)
                super().visit_var_binding_(binding)
                return
            index = 1
            while f"{name}_{index}" in seen:
                index += 1
            seen.add(f"{name}_{index}")
            value = self.visit_expr(binding.value)
            if isinstance(binding.var, relax.DataflowVar):
                renamed = self.builder_.emit(value, name_hint=f"{name}_{index}")
            else:
                renamed = self.builder_.emit_output(value, name_hint=f"{name}_{index}")
            self.set_var_remap(binding.var, renamed)

    renamer = _Rename(mod)
    renamer.builder_.update_func(mod.get_global_var("main"), renamer.visit_expr(mod["main"]))
    return renamer.builder_.finalize()


def _inference_batch_norm(value: relax.Expr | None) -> relax.Expr | None:
    """``batch_norm(x, gamma, beta, mean, var)[0]`` with constant statistics, as the per-channel
    ``x * scale + shift`` it computes at inference (exports that do not fold BatchNormalization)."""
    if _op_name(value) != "relax.nn.batch_norm" or bool(getattr(value.attrs, "training", False)):
        return None
    gamma, beta, mean, var = (_const(a) for a in value.args[1:5])
    shape = static_shape(value.args[0].ty)
    if any(c is None for c in (gamma, beta, mean, var)) or shape is None:
        return None
    scale = gamma / np.sqrt(var + float(value.attrs.epsilon))
    broadcast = [1] * len(shape)
    broadcast[int(value.attrs.axis) % len(shape)] = -1
    dtype = str(value.args[0].ty.dtype)
    return relax.op.add(relax.op.multiply(value.args[0], relax.const(scale.reshape(broadcast).astype(dtype))),
                        relax.const((beta - mean * scale).reshape(broadcast).astype(dtype)))


def axis_graph(mod: tvm.IRModule) -> tuple[AxisConnectionGraph, object]:
    """The axis connection graph of a normalized module, from its legalized TIR."""
    # reshapes stay views (as TVM later makes them), so their kept axes connect
    graph = graph_model(relax.transform.LegalizeOps({"relax.reshape": lambda _bb, call: call})(mod))
    return build_acg(graph), graph


def _channels(var: relax.Expr) -> int | None:
    shape = static_shape(var.ty)
    return shape[CHANNEL] if shape is not None and len(shape) == 4 and shape[0] == 1 else None


def find_chains(mod: tvm.IRModule) -> list[Chain]:
    """Every channel chain of ``main`` whose tensors the axis connection graph joins: single
    branches from each ``groups=1`` convolution, and the branches of a channel concat (with the
    per-channel operators after it) as one chain."""
    func = mod["main"]
    acg, _ = axis_graph(mod)
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

    def follow(start: relax.Var, comp: int, since: int, units: int) -> tuple[list, int, int | None]:
        """Per-channel operators after ``start``: (their bindings, units, index of the consumer
        that ended the walk, if it is the only one)."""
        current, found = start, []
        while True:
            j = single_consumer(current)
            if j is None:
                diamond = closing_diamond(current, comp, since)
                if diamond is None:
                    return found, units, None
                found.extend(diamond)
                current = diamond[-1].var
                continue
            nxt = bindings[j]
            op = _op_name(nxt.value)
            if op == _CONV and nxt.value.args[0].same_as(current) and _const(nxt.value.args[1]) is not None:
                groups = int(nxt.value.attrs.groups)
                channels_in, channels_out = _channels(current), _channels(nxt.var)
                if groups == 1 or channels_out is None or channels_in % groups or channels_out % groups or units % groups:
                    return found, units, j
                units = groups
            elif op not in _PER_CHANNEL_OPS or _channels(nxt.var) != _channels(current):
                return found, units, j
            if not _operands_ok(nxt.value, current, defined_at, since) or component(nxt.var) != comp:
                return found, units, j
            found.append(nxt)
            current = nxt.var

    def closing_diamond(current: relax.Var, comp: int, since: int) -> list | None:
        """Elementwise operators that read ``current`` on several paths and meet again in one
        tensor (SiLU ``x * sigmoid(x)``, hard-swish): the bindings up to where they meet."""
        if current in outputs or len(uses.get(current, [])) < 2:
            return None
        pending = {current: set(uses[current])}
        members = []
        for j in range(defined_at[current] + 1, len(bindings)):
            binding = bindings[j]
            reads = [v for v in relax.analysis.free_vars(binding.value) if v in pending]
            if not reads:
                continue
            value = binding.value
            if (_op_name(value) not in _ELEMENTWISE_PER_CHANNEL or _channels(binding.var) != _channels(current)
                    or component(binding.var) != comp or binding.var in outputs or len(members) == _DIAMOND_OPS
                    or any(isinstance(a, relax.Var) and a not in pending and defined_at.get(a, -1) >= since
                           for a in value.args)):
                return None
            members.append(binding)
            for v in reads:
                pending[v].discard(j)
                if not pending[v]:
                    del pending[v]
            pending[binding.var] = set(uses.get(binding.var, []))
            if list(pending) == [binding.var]:
                return members
        return None

    def reduces(j: int | None, current: relax.Var, comp: int) -> bool:
        if j is None:
            return False
        value = bindings[j].value
        return (_op_name(value) == _CONV and int(value.attrs.groups) == 1 and value.args[0].same_as(current)
                and _const(value.args[1]) is not None and component(bindings[j].var) != comp)

    branches: dict[int, tuple[Branch, relax.Var, int | None, list]] = {}
    for i, head in enumerate(bindings):
        value = head.value
        if _channels(head.var) is None:
            continue
        if _op_name(value) == _CONV:
            if int(value.attrs.groups) != 1 or _const(value.args[1]) is None:
                continue
        elif not _pool_head(value, uses, outputs):
            continue
        comp = component(head.var)
        if comp is None:
            continue
        mids, units, end = follow(head.var, comp, i, _channels(head.var))
        last = mids[-1].var if mids else head.var
        branch = Branch(head.var.name, tuple(m.var.name for m in mids), units, _channels(last),
                        _pool_feeding(value, bindings, defined_at, uses, outputs))
        branches[i] = (branch, last, end, [head.var] + [m.var for m in mids])

    chains = []
    for i, (branch, last, end, tensors) in branches.items():
        comp = component(bindings[i].var)
        if reduces(end, last, comp):
            if len(tensors) > 1 and _nbytes(last) < _nbytes(tensors[0]):
                # the same tiles written into the last tensor, the tail run whole: as small when a
                # pool or a stride shrank that tensor (a stem's conv -> pool), and no partial sums
                chains.append(Chain((branch,), None, (), None, sum(_nbytes(v) for v in tensors[:-1])))
            chains.append(Chain((branch,), None, (), bindings[end].var.name, sum(_nbytes(v) for v in tensors)))
        elif len(tensors) > 1:
            chains.append(Chain((branch,), None, (), None, sum(_nbytes(v) for v in tensors[:-1])))
    chains.extend(_concat_chains(bindings, branches, follow, reduces, component, defined_at))
    chains.extend(_row_chains(bindings, uses, outputs, lambda var, axis: _component_id(acg, var, axis)))
    chains.extend(_spatial_chains(bindings, uses, outputs, lambda var: _component_id(acg, var, ROWS)))
    return chains


def _component_id(acg: AxisConnectionGraph, var: relax.Var, axis: int) -> int | None:
    comp = acg.component_of(var.name, axis)
    return comp.id if comp is not None else None


def _pool_head(value: relax.Expr, uses: dict, outputs: set) -> bool:
    """A pool over a tensor that other operators read too (an inception module's input): the
    tensor stays whole, but the pool's output can be made tile by tile over its channels, each
    tile sliced from the input, when a convolution reduces it (the pool branch's projection)."""
    if _op_name(value) not in _POOLS:
        return False
    source = value.args[0]
    return isinstance(source, relax.Var) and _channels(source) is not None and (
        len(uses.get(source, [])) > 1 or source in outputs)


def _pool_feeding(conv: relax.Expr, bindings: list, defined_at: dict, uses: dict, outputs: set) -> str | None:
    """The pool a convolution reads, when it is the pool's only reader and the pool's input
    stays whole for others (:attr:`Branch.pool`)."""
    if _op_name(conv) != _CONV or not isinstance(conv.args[0], relax.Var) or conv.args[0] not in defined_at:
        return None
    pool = bindings[defined_at[conv.args[0]]]
    if len(uses.get(pool.var, [])) != 1 or pool.var in outputs or not _pool_head(pool.value, uses, outputs):
        return None
    return pool.var.name


def _concat_chains(bindings, branches, follow, reduces, component, defined_at) -> list[Chain]:
    """Chains whose branches meet in a channel concat: every input of the concat must end a
    branch; per-channel operators after it are shared; a reducing convolution is the tail."""
    found = []
    for j, binding in enumerate(bindings):
        value = binding.value
        if _op_name(value) != "relax.concat" or _channels(binding.var) is None:
            continue
        shape = static_shape(value.ty)
        if int(value.attrs.axis) % len(shape) != CHANNEL:
            continue
        fields = list(value.args[0].fields) if isinstance(value.args[0], relax.Tuple) else []
        members = []
        for f in fields:
            entry = next(((i, b) for i, b in branches.items() if b[1].same_as(f) and b[2] == j), None)
            if entry is None:
                break
            members.append(entry)
        if not fields or len(members) != len(fields):
            continue
        comp = component(binding.var)
        if comp is None or any(component(bindings[i].var) != comp for i, _ in members):
            continue
        post, _, end = follow(binding.var, comp, j, min(b[0].units for _, b in members))
        inputs = [binding.var] + [p.var for p in post[:-1]]
        if any(isinstance(a, relax.Var) and not a.same_as(x) for p, x in zip(post, inputs) for a in p.value.args):
            continue  # each branch is emitted where its head was: shared operators take constants only
        last = post[-1].var if post else binding.var
        tail = bindings[end].var.name if reduces(end, last, comp) else None
        if tail is None and not post:
            continue  # concat elimination already writes the branches into place
        tiles = [v for _, b in members for v in b[3]] + ([binding.var] + [p.var for p in post] if tail else [binding.var] + [p.var for p in post[:-1]])
        found.append(Chain(tuple(b[0] for _, b in members), binding.var.name, tuple(p.var.name for p in post), tail,
                           sum(_nbytes(v) for v in tiles)))
    return found


_ROW_OPS = {
    "relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum", "relax.minimum",
    "relax.nn.relu", "relax.nn.silu", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.sigmoid", "relax.tanh",
    "relax.clip", "relax.exp", "relax.sqrt", "relax.erf", "relax.power", "relax.nn.leakyrelu",
}


_ROW_GUARDS = {"relax.isnan", "relax.isinf", "relax.isfinite", "relax.logical_not", "relax.where"}
"""Elementwise selections exporters put after a softmax (``where(isnan(p), 0, p)``): row-wise,
but left out of the simulator's fusion (boolean tensors)."""


def _rows(var: relax.Expr) -> int | None:
    """Rows of a ``(1, sequence, features)`` tensor."""
    shape = static_shape(var.ty)
    return shape[1] if shape is not None and len(shape) == 3 and shape[0] == 1 else None


def _row_axis(value: relax.Expr, out: relax.Var, axis_of: dict, rows: int) -> int | None:
    """The sequence axis of ``out`` when ``value`` is row-wise in its operands from the chain
    (``axis_of``: chain tensor -> its sequence axis), else None. Row-wise: output row r depends on
    row r of the chain operands alone. Elementwise operators (other operands broadcast along the
    rows or sliced with them), a matmul whose left operand has the rows as its second-to-last axis
    and whose right one comes from outside (constant weights; an attention's keys or values,
    computed whole), a layer norm or softmax over other axes, and the views between attention
    heads and tokens: a reshape that keeps every axis up to the rows, a transpose (the rows move)."""
    op = _op_name(value)
    shape = static_shape(out.ty)
    chained = [a for a in getattr(value, "args", []) if isinstance(a, relax.Var) and a in axis_of]
    if shape is None or not chained or op is None:
        return None
    data = value.args[0]
    if op == "relax.matmul":
        left, right = value.args
        right_shape = static_shape(right.ty)
        if (left not in axis_of or right in axis_of or right_shape is None or len(right_shape) < 2
                or axis_of[left] != len(static_shape(left.ty)) - 2):
            return None
        axis = len(shape) - 2
    elif data not in axis_of or chained != [data]:
        if op not in _ROW_OPS | _ROW_GUARDS:
            return None
        axis = axis_of[chained[0]]
        if any(axis_of[a] != axis or static_shape(a.ty) != shape for a in chained):
            return None
        if not all(a in axis_of or _broadcast_or_rows(a, shape, axis, rows) for a in value.args):
            return None
    else:
        axis = axis_of[data]
        if op in ("relax.nn.layer_norm", "relax.nn.rms_norm"):
            if any(int(a) % len(shape) == axis for a in value.attrs.axes):
                return None
        elif op == "relax.nn.softmax":
            if int(value.attrs.axis) % len(shape) == axis:
                return None
        elif op == "relax.reshape":
            if tuple(static_shape(data.ty)[:axis + 1]) != tuple(shape[:axis + 1]):
                return None
        elif op == "relax.permute_dims":
            order = [int(a) for a in value.attrs.axes] if value.attrs.axes is not None else list(range(len(shape)))[::-1]
            axis = order.index(axis)
        elif op not in _ROW_OPS | _ROW_GUARDS or static_shape(data.ty) != shape or not all(
                _broadcast_or_rows(a, shape, axis, rows) for a in value.args[1:]):
            return None
    return axis if axis < len(shape) and shape[axis] == rows and shape[0] == 1 else None


def _broadcast_or_rows(arg: relax.Expr, shape: tuple[int, ...], axis: int, rows: int) -> bool:
    """An operand from outside the chain that an elementwise operator broadcasts along the rows
    (kept whole) or that has the rows (sliced per tile)."""
    arg_shape = static_shape(arg.ty) if isinstance(arg.ty, relax.TensorType) else None
    if arg_shape is None or len(arg_shape) > len(shape):
        return False
    at = axis - (len(shape) - len(arg_shape))
    return at < 0 or arg_shape[at] in (1, rows)


def _outside_row_axis(value: relax.Call, index: int, out_shape: tuple[int, ...], out_axis: int, rows: int) -> int | None:
    """The axis along which a row tile slices operand ``index`` of a row-wise ``value`` from
    outside the chain, or None when every tile reads it whole (weights, keys and values,
    operands broadcast along the rows)."""
    arg = value.args[index]
    shape = static_shape(arg.ty) if isinstance(arg.ty, relax.TensorType) else None
    if shape is None:
        return None
    if _op_name(value) == "relax.matmul":
        return len(shape) - 2 if index == 0 else None
    at = out_axis - (len(out_shape) - len(shape))
    return at if at >= 0 and shape[at] == rows and rows > 1 else None


def _row_chains(bindings: list, uses: dict, outputs: set, component) -> list[Chain]:
    """Row chains of transformer blocks: from a matmul with constant weights on ``(1, sequence,
    features)`` (a projection), every row-wise operator (:func:`_row_axis`) that reads the chain,
    up to the longest prefix whose tensors reach the rest of the program through one tensor (the
    block's output, made tile by tile into its rows). From a query projection that spans the
    attention: scores, softmax and context of a few query rows at a time against whole keys and
    values; the tiles then run once those exist (the chain's anchor). The chain's tensors must
    share one component of the axis connection graph along their sequence axes."""
    defined_at = {b.var: i for i, b in enumerate(bindings)}
    found = []
    for i, head in enumerate(bindings):
        rows = _rows(head.var)
        if (rows is None or rows < 2 or _op_name(head.value) != "relax.matmul" or _const(head.value.args[1]) is None
                or len(static_shape(head.value.args[1].ty) or ()) != 2 or _rows(head.value.args[0]) != rows):
            continue
        comp = component(head.var, 1)
        if comp is None:
            continue
        region, best = [head], None
        inside, axis_of = {i}, {head.var: 1}
        for j in range(i + 1, len(bindings)):
            binding = bindings[j]
            reads = list(relax.analysis.free_vars(binding.value))
            if not any(defined_at.get(v) in inside for v in reads):
                continue
            axis = _row_axis(binding.value, binding.var, axis_of, rows)
            if axis is None or component(binding.var, axis) != comp:
                break
            region.append(binding)
            inside.add(j)
            axis_of[binding.var] = axis
            escaping = [b.var for b in region
                        if b.var in outputs or any(k not in inside for k in uses.get(b.var, []))]
            if escaping == [region[-1].var]:
                best = list(region)
        if best is None:
            continue
        names = tuple(b.var.name for b in best)
        members = {b.var for b in best}
        later = [defined_at[v] for b in best for v in relax.analysis.free_vars(b.value)
                 if v not in members and defined_at.get(v, -1) > i]
        anchor = bindings[max(later)].var.name if later else None
        tiles = sum(_nbytes(b.var) for b in best[:-1])
        found.append(Chain((Branch(names[0], names[1:], rows, rows),), None, (), None, tiles, rows=True, anchor=anchor))
    return found


def _nchw(arg: relax.Expr) -> tuple[int, ...] | None:
    """The shape of a batch-1 4-D tensor."""
    shape = static_shape(arg.ty) if isinstance(arg.ty, relax.TensorType) else None
    return tuple(shape) if shape is not None and len(shape) == 4 and shape[0] == 1 else None


def _padding(attrs) -> list[int]:
    """(top, left, bottom, right)."""
    pads = [int(x) for x in attrs.padding]
    return pads * 2 if len(pads) == 2 else pads


def _row_window(value: relax.Call) -> RowWindow | None:
    """How a batch-1 NCHW convolution with constant weights, or a pool, reads rows (None: not one
    a tile can reproduce, e.g. an average pool in ceil mode, whose border divisors would change)."""
    a, op, shape = value.attrs, _op_name(value), _nchw(value.args[0])
    if shape is None:
        return None
    if op == _CONV:
        if ((str(a.data_layout), str(a.kernel_layout), str(a.out_layout or a.data_layout)) != ("NCHW", "OIHW", "NCHW")
                or _const(value.args[1]) is None):
            return None
        kernel = static_shape(value.args[1].ty)[2]
    elif op in _POOLS:
        if str(a.layout) != "NCHW" or str(a.out_layout or a.layout) != "NCHW" or (bool(a.ceil_mode) and op != "relax.nn.max_pool2d"):
            return None
        kernel = int(a.pool_size[0])
    else:
        return None
    window = RowWindow(kernel, int(a.strides[0]), _padding(a)[0], int(a.dilation[0]), shape[ROWS])
    rows = _nchw(value)[ROWS]
    if any(lo >= hi for (lo, hi), _, _ in (window.input_rows((0, 1)), window.input_rows((rows - 1, rows)))):
        return None  # a border row that reads only padding
    return window


def _row_op(binding: relax.VarBinding, inside: set[relax.Var], defined_at: dict, since: int) -> RowOp | None:
    """``binding`` as an operator of a spatial chain whose bindings so far are ``inside``, or None.
    Operands from outside must exist before the chain's head (its tiles run there)."""
    value, var = binding.value, binding.var
    out = _nchw(var)
    if out is None or not isinstance(value, relax.Call) or _op_name(value) is None:
        return None
    row_bytes = _nbytes(var) // out[ROWS]

    def outside_ok(arg: relax.Expr) -> bool:
        return not isinstance(arg, relax.Var) or defined_at.get(arg, -1) < since

    if _op_name(value) in (_CONV, *_POOLS):
        window, data = _row_window(value), value.args[0]
        if window is None or not all(outside_ok(a) for a in value.args[1:]):
            return None
        if data in inside:
            return RowOp(var.name, (data.name,), out[ROWS], row_bytes, window)
        if not outside_ok(data):
            return None
        return RowOp(var.name, (), out[ROWS], row_bytes, window, (data.name,))
    if _op_name(value) not in _ELEMENTWISE_PER_CHANNEL:
        return None
    reads, outside = [], []
    for arg in value.args:
        if not isinstance(arg.ty, relax.TensorType):  # a clip's bounds
            continue
        shape = static_shape(arg.ty)
        if arg in inside:
            if tuple(shape) != out:
                return None
            reads.append(arg.name)
        elif not outside_ok(arg):
            return None
        elif shape is not None and len(shape) == 4 and shape[ROWS] == out[ROWS] and out[ROWS] > 1:
            if _nchw(arg) is None or _const(arg) is not None:
                return None
            outside.append(arg.name)
        elif shape is None or (len(shape) >= 2 and shape[-2] != 1):  # not broadcast along the rows
            return None
    return RowOp(var.name, tuple(dict.fromkeys(reads)), out[ROWS], row_bytes, None, tuple(outside))


def _spatial_chains(bindings: list, uses: dict, outputs: set, component) -> list[Chain]:
    """Spatial chains: from each convolution or pool reading a tensor from outside, the operators
    that read the chain and can be cut into rows (convolutions, pools, elementwise), up to every
    prefix whose tensors reach the rest of the program through its last one alone (made tile by
    tile into its rows). At least two convolutions or pools (one and its epilogue gain nothing),
    at most :data:`SPATIAL_WINDOWS`; the rows of all tensors in one component of the axis
    connection graph (sliding-window axes join a tensor's rows to its consumer's)."""
    defined_at = {b.var: i for i, b in enumerate(bindings)}
    found = []
    for i, head in enumerate(bindings):
        if _op_name(head.value) not in (_CONV, *_POOLS):
            continue
        first = _row_op(head, set(), defined_at, i)
        comp = component(head.var)
        if first is None or comp is None:
            continue
        ops, members, inside = [first], [i], {head.var}
        windows = 1
        for j in range(i + 1, len(bindings)):
            binding = bindings[j]
            if not any(v in inside for v in relax.analysis.free_vars(binding.value)):
                continue
            op = _row_op(binding, inside, defined_at, i)
            if op is None or component(binding.var) != comp or len(ops) == _SPATIAL_BINDINGS:
                break
            windows += op.window is not None
            if windows > SPATIAL_WINDOWS:
                break
            ops.append(op)
            members.append(j)
            inside.add(binding.var)
            escaping = [bindings[k].var for k in members
                        if bindings[k].var in outputs or any(u not in members for u in uses.get(bindings[k].var, []))]
            if escaping != [binding.var] or windows < 2 or op.rows < 2 or _epilogue_follows(binding.var, bindings, uses, outputs):
                continue
            names = tuple(bindings[k].var.name for k in members)
            tiles = sum(_nbytes(bindings[k].var) for k in members[:-1])
            chain = Chain((Branch(names[0], names[1:], op.rows, _nchw(binding.var)[CHANNEL]),), None, (), None,
                          tiles, spatial=tuple(ops))
            found.append(chain)
            if GATHER_BELOW * _nbytes(binding.var) <= max(_nbytes(bindings[k].var) for k in members):
                found.append(replace(chain, gathered=True))
    return found


def _epilogue_follows(var: relax.Var, bindings: list, uses: dict, outputs: set) -> bool:
    """``var``'s only consumer is an elementwise operator (a bias or activation): a chain ending
    here would cut an epilogue off its convolution."""
    users = uses.get(var, [])
    return var not in outputs and len(users) == 1 and _op_name(bindings[users[0]].value) in _ELEMENTWISE_PER_CHANNEL


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
    if shape is None or len(shape) not in (3, 4) or shape[0] != 1 or shape[CHANNEL] != channels:
        return arg
    data = _const(arg)
    if data is not None:
        return relax.const(np.ascontiguousarray(data[:, lo:hi]), str(arg.ty.dtype))
    return bb.emit(relax.op.strided_slice(arg, axes=[CHANNEL], begin=[lo], end=[hi]))


def _slice_rows(arg: relax.Expr, axis: int, lo: int, hi: int, bb: relax.BlockBuilder) -> relax.Expr:
    """Rows ``[lo, hi)`` along ``axis`` of an operand: a constant sliced here, a tensor by ``strided_slice``."""
    data = _const(arg)
    if data is not None:
        index = [slice(None)] * data.ndim
        index[axis] = slice(lo, hi)
        return relax.const(np.ascontiguousarray(data[tuple(index)]), str(arg.ty.dtype))
    return bb.emit(relax.op.strided_slice(arg, axes=[axis], begin=[lo], end=[hi]))


def _conv(value: relax.Call, data: relax.Expr, weight: np.ndarray | relax.Expr, groups: int,
          padding: list[int] | None = None) -> relax.Expr:
    """The convolution ``value`` with another input, weights (a tile's slice, or the original
    constant shared by every tile), groups and padding (a row tile's)."""
    a = value.attrs
    kernel = weight if isinstance(weight, relax.Expr) else relax.const(np.ascontiguousarray(weight), str(value.args[1].ty.dtype))
    return relax.op.nn.conv2d(
        data, kernel, strides=[int(x) for x in a.strides],
        padding=padding if padding is not None else [int(x) for x in a.padding],
        dilation=[int(x) for x in a.dilation], groups=groups, data_layout=str(a.data_layout),
        kernel_layout=str(a.kernel_layout), out_layout=str(a.out_layout),
        out_dtype=str(value.ty.dtype),
    )


def _conv_accumulate(bb: relax.BlockBuilder, conv: relax.Call, data: relax.Expr, weight: np.ndarray,
                     running: relax.Expr) -> relax.Expr:
    """``conv(data, weight) + running`` as one kernel (a partial sum over a channel tile).

    Marked ``tirx.noalias`` like the kernels TVM legalizes: without it LLVM must assume the
    running sum may overlap the output and the kernel ran twice as long as the plain conv."""
    a = conv.attrs
    if str(a.data_layout) != "NCHW" or str(a.kernel_layout) != "OIHW":
        raise UserError(f"split: conv2d layout {a.data_layout}/{a.kernel_layout} is not NCHW/OIHW")
    strides, padding, dilation = ([int(x) for x in v] for v in (a.strides, a.padding, a.dilation))
    dtype = str(conv.ty.dtype)
    kernel = relax.const(np.ascontiguousarray(weight), dtype)
    # int64 extents, as TVM's legalization writes them: FuseTIR maps buffers across fused kernels
    x, w, acc = (te.placeholder([tvm.tirx.IntImm("int64", d) for d in static_shape(v.ty)], dtype)
                 for v in (data, kernel, running))
    out = topi.add(topi.nn.conv2d_nchw(x, w, strides, padding, dilation, out_dtype=dtype), acc)
    func = te.create_prim_func([x, w, acc, out]).without_attr("global_symbol").with_attr("tirx.noalias", True)
    gvar = bb.add_func(func, "conv2d_accumulate")
    return bb.emit(relax.call_tir(gvar, [data, kernel, running], out_ty=running.ty))


@mutator
class _SplitRewriter(PyExprMutator):
    """Emits each branch's tiles where its head was (so a branch's inputs are computed just
    before it, as in the original order); the chain's running sum (or the tiles of its last
    tensor) carries over from branch to branch and is bound to the chain's result after the
    last one."""

    def __init__(self, mod: tvm.IRModule, choices: list[SplitChoice]) -> None:
        super().__init__(mod)
        self.table = {b.var.name: b for b in _bindings(mod["main"])}
        self.branch_at = {b.head: (c, i) for c in choices for i, b in enumerate(c.chain.branches)}
        self.skip = {name for c in choices for name in c.chain.bindings} - set(self.branch_at)
        self.running: dict[Chain, relax.Expr | None] = {}
        self.pieces: dict[Chain, dict[int, relax.Expr]] = {}
        self.left = {c.chain: len(c.chain.branches) for c in choices}
        # a chain module (the chain alone) has its anchor as a parameter: tiles run at the head
        self.anchored = {c.chain.anchor: c for c in choices if c.chain.anchor in self.table}
        self.deferred = {c.chain for c in self.anchored.values()}

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        name = binding.var.name
        if name in self.skip:
            return
        entry = self.branch_at.get(name)
        if entry is None:
            super().visit_var_binding_(binding)
            done = [name]
        elif entry[0].chain in self.deferred:
            return
        else:
            self._emit_branch(*entry)
            done = list(entry[0].chain.bindings) if not self.left[entry[0].chain] else []
        while done:  # chains anchored after what has just been bound (an anchor may be in a chain)
            choice = self.anchored.pop(done.pop(), None)
            if choice is not None:
                self._emit_branch(choice, 0)
                done.extend(choice.chain.bindings)

    def _emit_tile_ops(self, links: list, current: relax.Expr, previous: relax.Var, parts: int, t: int,
                       units: int) -> relax.Expr:
        """A branch's per-channel operators (and grouped convolutions) on tile ``t``; an operator
        may read several of the branch's tensors (the two paths of a SiLU)."""
        bb = self.builder_
        tiles = {previous: current}
        for link in links:
            value, c_in = link.value, _channels(previous)
            lo, hi = _tile_ranges(parts, units, c_in)[t]
            if _op_name(value) == _CONV:
                groups = int(value.attrs.groups)
                olo, ohi = _tile_ranges(parts, units, _channels(link.var))[t]
                new = _conv(value, current, _const(value.args[1])[olo:ohi], groups * (hi - lo) // c_in)
            else:
                args = [tiles[a] if a in tiles else _slice_operand(self.visit_expr(a), lo, hi, c_in, bb)
                        for a in value.args]
                new = relax.Call(value.op, args, value.attrs, value.ty_args)
            current = bb.emit(new)
            previous = link.var
            tiles[previous] = current
        return current

    def _emit_rows(self, choice: SplitChoice) -> None:
        """A row chain, tile by tile: every operator on its rows (operands from outside sliced
        along their sequence axis, or whole: weights, keys and values, broadcast operands), the
        tiles of the last tensor concatenated along its rows (written into place by concat
        elimination when the rows are its outermost non-unit axis)."""
        bb, (branch,) = self.builder_, choice.chain.branches
        links = [self.table[n] for n in (branch.head, *branch.mids)]
        rows = branch.units
        axis_of: dict[relax.Var, int] = {links[0].var: 1}
        for link in links[1:]:
            axis_of[link.var] = _row_axis(link.value, link.var, axis_of, rows)
        pieces = []
        for lo, hi in _tile_ranges(choice.parts, rows, rows):
            tile: dict[relax.Expr, relax.Expr] = {}
            sliced: dict[tuple[relax.Expr, int], relax.Expr] = {}  # outside operands, once per tile and axis
            for link in links:
                value, out_shape, out_axis = link.value, static_shape(link.var.ty), axis_of[link.var]
                args = []
                for index, arg in enumerate(value.args):
                    if arg in tile:
                        args.append(tile[arg])
                        continue
                    axis = _outside_row_axis(value, index, out_shape, out_axis, rows)
                    if axis is None:
                        args.append(self.visit_expr(arg))
                        continue
                    if (arg, axis) not in sliced:
                        sliced[(arg, axis)] = _slice_rows(self.visit_expr(arg), axis, lo, hi, bb)
                    args.append(sliced[(arg, axis)])
                if _op_name(value) == "relax.reshape":
                    shape = list(out_shape)
                    shape[out_axis] = hi - lo
                    call = relax.op.reshape(args[0], shape)
                else:
                    call = relax.Call(value.op, args, value.attrs, value.ty_args)
                tile[link.var] = bb.emit(call)
            pieces.append(tile[links[-1].var])
        last = links[-1].var
        bb.emit_normalized(relax.VarBinding(last, bb.normalize(relax.op.concat(pieces, axis=axis_of[last]))))

    def _emit_branch(self, choice: SplitChoice, index: int) -> None:
        bb, chain, table = self.builder_, choice.chain, self.table
        if chain.rows or chain.spatial:
            self._emit_rows(choice) if chain.rows else self._emit_spatial(choice)
            self.left[chain] -= 1
            return
        branch = chain.branches[index]
        tail = table[chain.tail] if chain.tail else None
        post = [table[n] for n in chain.post]
        joined = table[chain.concat] if chain.concat else None
        offset = sum(b.channels for b in chain.branches[:index])
        head = table[branch.head]
        mids = [table[n] for n in branch.mids]
        last = (mids[-1] if mids else head).var
        source = head.value.args[0]
        head_input = self.visit_expr(source)
        running = self.running.get(chain)
        pieces = self.pieces.setdefault(chain, {})
        for t in range(choice.parts):
            lo, hi = _tile_ranges(choice.parts, branch.units, _channels(head.var))[t]
            if branch.pool:
                current = self._emit_pooled_head(head.value, table[branch.pool].value, lo, hi, choice.parts)
            elif _op_name(head.value) == _CONV:
                current = bb.emit(_conv(head.value, head_input, _const(head.value.args[1])[lo:hi], 1))
            else:  # a pool head: its tile of the (whole) input's channels, then the pool
                current = _slice_operand(head_input, lo, hi, _channels(source), bb)
                current = self._emit_tile_ops([head], current, source, choice.parts, t, branch.units)
            current = self._emit_tile_ops(mids, current, head.var, choice.parts, t, branch.units)
            tlo, thi = _tile_ranges(choice.parts, branch.units, _channels(last))[t]
            if joined is not None:
                current = self._emit_joined_ops(post, current, joined.var, offset + tlo, offset + thi, _channels(joined.var))
            if tail is not None:
                weight = _const(tail.value.args[1])[:, offset + tlo:offset + thi]
                if running is None:
                    running = bb.emit(_conv(tail.value, current, weight, 1))
                else:
                    # One kernel per tile (conv + add of the running sum): FuseOps would otherwise
                    # gather every add into the last tile's kernel and keep all partial sums alive.
                    running = _conv_accumulate(bb, tail.value, current, weight, running)
            else:
                pieces[offset + tlo] = current
        self.running[chain] = running
        self.left[chain] -= 1
        if self.left[chain]:
            return
        if tail is not None:
            bb.emit_normalized(relax.VarBinding(tail.var, running))
        else:
            final = (post[-1] if post else joined).var if joined is not None else table[chain.bindings[-1]].var
            ordered = [pieces[k] for k in sorted(pieces)]
            bb.emit_normalized(relax.VarBinding(final, bb.normalize(relax.op.concat(ordered, axis=CHANNEL))))

    def _emit_spatial(self, choice: SplitChoice) -> None:
        """A spatial chain, tile by tile: every operator on the rows it must produce (convolutions
        and pools read their input rows, halo included, with padding only at the tensor's real
        borders), each tile of the last tensor copied into its rows of the full tensor (or all of them
        concatenated at the end)."""
        bb, ops = self.builder_, choice.chain.spatial
        last = self.table[ops[-1].name].var
        full, pieces = None, []
        for need in tile_rows(ops, choice.parts):
            tiles: dict[str, tuple[relax.Expr, Rows]] = {}
            for op in ops:
                value, rows = self.table[op.name].value, need[op.name]
                if op.window is None:
                    args = [self._rows_of(a, rows, tiles) for a in value.args]
                    tile = bb.emit(relax.Call(value.op, args, value.attrs, value.ty_args))
                else:
                    in_rows, top, bottom = op.window.input_rows(rows)
                    data = value.args[0]
                    if op.outside and in_rows != (0, op.window.rows_in):  # rows of an outside tensor, in place
                        tile = _emit_windowed_rows(bb, value, self.visit_expr(data), in_rows, top, bottom)
                    else:
                        tile = bb.emit(_windowed(value, self._rows_of(data, in_rows, tiles), top, bottom))
                tiles[op.name] = (tile, rows)
            if choice.chain.gathered:
                pieces.append(tiles[ops[-1].name][0])
            else:
                full = _write_rows(bb, tiles[ops[-1].name][0], full, need[ops[-1].name][0], last.ty)
        if choice.chain.gathered:
            full = bb.normalize(relax.op.concat(pieces, axis=ROWS))
        bb.emit_normalized(relax.VarBinding(last, full))

    def _rows_of(self, arg: relax.Expr, rows: Rows, tiles: dict[str, tuple[relax.Expr, Rows]]) -> relax.Expr:
        """``rows`` of an operand: of a chain tensor's tile (cut when the tile holds more), of a
        tensor from outside, or the operand whole when it is broadcast along the rows."""
        bb = self.builder_
        if isinstance(arg, relax.Var) and arg.name in tiles:
            tile, (lo, _) = tiles[arg.name]
            whole, rows, total = tile, (rows[0] - lo, rows[1] - lo), _nchw(tile)[ROWS]
        else:
            whole, shape = self.visit_expr(arg), _nchw(arg)
            if shape is None or shape[ROWS] == 1:
                return whole
            total = shape[ROWS]
        if rows == (0, total):
            return whole
        return bb.emit(relax.op.strided_slice(whole, axes=[ROWS], begin=[rows[0]], end=[rows[1]]))

    def _emit_pooled_head(self, conv: relax.Call, pool: relax.Call, lo: int, hi: int, parts: int) -> relax.Expr:
        """Output channels [lo, hi) of ``conv(pool(x))`` as partial sums over slices of ``x``."""
        bb, source = self.builder_, pool.args[0]
        channels = _channels(source)
        whole = self.visit_expr(source)
        weight = _const(conv.args[1])[lo:hi]
        running = None
        for slo, shi in _tile_ranges(parts, channels, channels):
            pooled = bb.emit(relax.Call(pool.op, [_slice_operand(whole, slo, shi, channels, bb)], pool.attrs, pool.ty_args))
            if running is None:
                running = bb.emit(_conv(conv, pooled, weight[:, slo:shi], 1))
            else:
                running = _conv_accumulate(bb, conv, pooled, weight[:, slo:shi], running)
        return running

    def _emit_joined_ops(self, post: list, current: relax.Expr, joined: relax.Var, lo: int, hi: int,
                         channels: int) -> relax.Expr:
        """The operators after a concat, on channels [lo, hi) of the joined tensor."""
        bb, previous = self.builder_, joined
        for link in post:
            args = [current if a.same_as(previous) else _slice_operand(self.visit_expr(a), lo, hi, channels, bb)
                    for a in link.value.args]
            current = bb.emit(relax.Call(link.value.op, args, link.value.attrs, link.value.ty_args))
            previous = link.var
        return current


def _window_padding(value: relax.Call, top: int, bottom: int) -> list[int]:
    """(top, left, bottom, right) padding of a tile of ``value``: ``top`` and ``bottom`` rows; a
    max pool in ceil mode gets explicit right padding, so its columns stay as they were."""
    a = value.attrs
    _, left, _, right = _padding(a)
    if _op_name(value) in _POOLS and bool(a.ceil_mode):
        kernel, stride, dilation = int(a.pool_size[1]), int(a.strides[1]), int(a.dilation[1])
        columns_in, columns_out = _nchw(value.args[0])[3], _nchw(value)[3]
        right = max(right, (columns_out - 1) * stride - left + dilation * (kernel - 1) + 1 - columns_in)
    return [top, left, bottom, right]


def _windowed(value: relax.Call, data: relax.Expr, top: int, bottom: int) -> relax.Expr:
    """The convolution or pool ``value`` on ``data`` (some of its input rows) with ``top`` and
    ``bottom`` rows of padding."""
    a, padding = value.attrs, _window_padding(value, top, bottom)
    if _op_name(value) == _CONV:
        return _conv(value, data, value.args[1], int(a.groups), padding)
    pool = relax.op.nn.max_pool2d if _op_name(value) == "relax.nn.max_pool2d" else relax.op.nn.avg_pool2d
    return pool(data, pool_size=[int(x) for x in a.pool_size], strides=[int(x) for x in a.strides],
                padding=padding, dilation=[int(x) for x in a.dilation], ceil_mode=False,
                count_include_pad=bool(a.count_include_pad), layout=str(a.layout), out_layout=str(a.out_layout))


def _emit_windowed_rows(bb: relax.BlockBuilder, value: relax.Call, data: relax.Expr, rows: Rows, top: int,
                        bottom: int) -> relax.Expr:
    """The convolution or pool ``value`` on ``rows`` of the whole tensor ``data``, reading them in
    place: one kernel (TOPI's, as legalization builds it, behind a row offset), where a
    ``strided_slice`` would copy the rows out in a kernel of its own first."""
    a, padding = value.attrs, _window_padding(value, top, bottom)
    strides, dilation = [int(x) for x in a.strides], [int(x) for x in a.dilation]
    first, count = rows[0], rows[1] - rows[0]

    def compute(whole: te.Tensor, *weight: te.Tensor) -> te.Tensor:
        batch, channels, _, columns = whole.shape
        cut = te.compute((batch, channels, count, columns), lambda n, c, h, w: whole[n, c, h + first, w], name="rows")
        if weight:
            return topi.nn.conv(cut, weight[0], strides, padding, dilation, int(a.groups), "NCHW", "OIHW", str(value.ty.dtype))
        pool_type = "max" if _op_name(value) == "relax.nn.max_pool2d" else "avg"
        return topi.nn.pool2d(cut, [int(x) for x in a.pool_size], strides, dilation, padding, pool_type, False, "NCHW",
                              bool(a.count_include_pad))

    weights = [value.args[1]] if _op_name(value) == _CONV else []
    return bb.emit_te(compute, data, *weights, primfunc_name_hint=f"{_op_name(value).split('.')[-1]}_rows")


def _row_writer(shape: tuple[int, ...], rows: int, offset: int, dtype: str) -> tvm.tirx.PrimFunc:
    """A kernel copying a ``rows``-row tile into rows ``[offset, offset + rows)`` of a tensor of
    ``shape``: called out of place for the first tile (a new tensor), in place for the others.
    Opaque to fusion (FuseTIR cannot fuse an in-place call with the tile's producer); after fusion,
    :func:`~tvm_memplan.relax.tile_writes.WriteTilesInPlace` makes the producer write the rows itself."""
    _, channels, _, columns = shape

    @T.prim_func(private=True, s_tir=True)
    def write_rows(tile: T.Buffer((1, channels, rows, columns), dtype), full: T.Buffer(shape, dtype)):
        for c, h, w in T.grid(channels, rows, columns):
            with T.sblock("write"):
                vc, vh, vw = T.axis.remap("SSS", [c, h, w])
                full[0, vc, vh + offset, vw] = tile[0, vc, vh, vw]

    return write_rows.with_attr("op_pattern", 8).with_attr("tirx.noalias", True).with_attr(ROW_OFFSET_ATTR, offset)


def _write_rows(bb: relax.BlockBuilder, tile: relax.Expr, full: relax.Expr | None, offset: int,
                ty: relax.TensorType) -> relax.Expr:
    """``tile`` copied into its rows of the chain's last tensor (``full``: the tensor so far)."""
    shape, dtype = tuple(static_shape(ty)), str(ty.dtype)
    gvar = bb.add_func(_row_writer(shape, _nchw(tile)[ROWS], offset, dtype), "write_rows")
    if full is None:
        return bb.emit(relax.call_tir(gvar, [tile], out_ty=ty))
    return bb.emit(relax.call_tir_inplace(gvar, [tile, full], [1], ty))


def describe_tensors(mod: tvm.IRModule, names: list[str]) -> list[str]:
    """Simulator tensor names as a reader wants them: the operator and shape behind each
    (``lv9#lv#1`` is tile 2 of the chain at ``lv``, written by the depthwise convolution ``lv9``)."""
    table = {b.var.name: b for b in _bindings(mod["main"])}
    described = []
    for name in names:
        base, _, tile = name.partition("#")
        binding = table.get(base)
        if binding is None:
            described.append(name)
            continue
        op = (_op_name(binding.value) or "kernel").removeprefix("relax.").removeprefix("nn.")
        if op == "conv2d" and int(binding.value.attrs.groups) > 1:
            op = "depthwise conv2d" if int(binding.value.attrs.groups) == _channels(binding.var) else "grouped conv2d"
        shape = "x".join(str(d) for d in (static_shape(binding.var.ty) or ())[1:])
        what = f"{op} {shape} ({base})"
        if tile:
            head, t = tile.split("#")[:2]
            what = f"tile {int(t) + 1} of {what}, chain at {head}"
        described.append(what)
    return described


def split_chains(mod: tvm.IRModule, choices: list[SplitChoice]) -> tvm.IRModule:
    """A copy of the normalized ``mod`` with every chosen chain split into its parts."""
    if not choices:
        return mod
    if not disjoint([c.chain for c in choices]):
        raise ValueError("a chosen chain overlaps another chosen chain")
    mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    rewriter = _SplitRewriter(mod, choices)
    func = rewriter.visit_expr(mod["main"])
    rewriter.builder_.update_func(mod.get_global_var("main"), func)
    return relax.transform.DeadCodeElimination()(rewriter.builder_.finalize())


_ELEMENTWISE = (_PER_CHANNEL_OPS | _ROW_OPS) - _POOLS


def program_of(mod: tvm.IRModule) -> Program:
    """``main`` of a normalized module as a simulator program, in binding order.

    Approximates TVM's fusion: an elementwise operator runs in its producer's kernel and writes
    the producer's tensor when that operand has no other consumer, or when all its consumers are
    elementwise and its other operands come from the same kernel (a GELU's diamond fuses whole);
    reshapes are views. Inputs, constants and returned tensors stay outside the arena (no size).
    """
    func = mod["main"]
    bindings = _bindings(func)
    uses: dict[relax.Var, int] = {}
    elementwise_uses: dict[relax.Var, int] = {}
    for b in bindings:
        for var in relax.analysis.free_vars(b.value):
            uses[var] = uses.get(var, 0) + 1
            elementwise_uses[var] = elementwise_uses.get(var, 0) + (_op_name(b.value) in _ELEMENTWISE)
    returned = set(relax.analysis.free_vars(func.body.body))
    tensor: dict[relax.Var, str] = {p: p.name for p in func.params}
    sizes: dict[str, int] = {}
    aliases: dict[str, str] = {}
    steps: list[Step] = []
    for b in bindings:
        var, value, name = b.var, b.value, b.var.name
        reads = tuple(tensor[v] for v in relax.analysis.free_vars(value) if v in tensor)
        op = _op_name(value)
        first = _written_operand(value, var)
        fused = (
            (op in _ELEMENTWISE or op == "relax.reshape") and isinstance(first, relax.Var) and first in tensor
            and first not in func.params and tensor[first] in sizes and first not in returned
            and (uses.get(first, 0) == 1 or (
                op in _ELEMENTWISE and elementwise_uses[first] == uses[first]
                and all(tensor.get(v, tensor[first]) == tensor[first] or tensor[v] not in sizes
                        for v in relax.analysis.free_vars(value))))
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
        if op == "relax.concat" and target in sizes:
            _eliminate_concat(value, target, tensor, uses, sizes, aliases, steps)
    return Program(steps, sizes, aliases)


def _written_operand(value: relax.Expr, var: relax.Var) -> relax.Expr | None:
    """The operand whose buffer the binding may write when fused: a reshape's input (a view), or
    for an elementwise operator an operand of the output's shape (``multiply(scale, x)`` of a
    squeeze-excitation block broadcasts the 1x1 scale, which cannot hold the output)."""
    if not isinstance(value, relax.Call) or not value.args:
        return None
    if _op_name(value) == "relax.reshape":
        return value.args[0]
    shape = static_shape(var.ty)
    return next((a for a in value.args if isinstance(a, relax.Var) and shape is not None and static_shape(a.ty) == shape),
                None)


def _eliminate_concat(value: relax.Call, target: str, tensor: dict, uses: dict, sizes: dict, aliases: dict,
                      steps: list[Step]) -> None:
    """Inputs used only by a channel concat are written into its regions (the planner's concat
    elimination): they become the concat's tensor, alive from the first input on."""
    fields = value.args[0].fields if isinstance(value.args[0], relax.Tuple) else []
    shape = static_shape(value.ty)
    if int(value.attrs.axis) % max(len(shape or ()), 1) != CHANNEL or not shape or shape[0] != 1:
        return
    inputs = [f for f in fields if isinstance(f, relax.Var) and f in tensor and uses.get(f, 0) == 1 and tensor[f] in sizes]
    if len(inputs) != len(fields):
        return
    merged = {tensor[f] for f in inputs}
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
    text = mod["main"].script(show_meta=False)
    names: dict[str, str] = {}
    text = re.sub(r"\b(lv\d*(?:_\d+)?|gv\d*)\b", lambda m: names.setdefault(m.group(1), f"v{len(names)}"), text)
    return hashlib.sha1(text.encode()).hexdigest()[:16]
