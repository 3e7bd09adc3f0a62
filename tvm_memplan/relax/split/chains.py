"""Finding the chains to split, with the axis connection graph of the legalized TIR.

- A *channel chain* is a run of operators joined by one component of the axis connection graph
  along the channel axis of NCHW tensors: a head whose output channels are independent (a
  convolution with ``groups=1``, or a pool over a tensor other operators keep whole, each tile
  pooling a slice of its channels: the second level an inception module's pool branch needs),
  per-channel operators (bias, activations, depthwise and grouped convolutions, pools), and a
  tail that either reduces over the channels (the next ``groups=1`` convolution, computed as
  partial sums accumulated tile by tile) or takes the chain's last tensor whole (then the tiles
  are concatenated, and the arena planner's concat elimination lets every tile write straight
  into its region). The branches of a channel concat form one chain.
- A *row chain* runs along the sequence axis of a transformer block's ``(1, sequence, features)``
  tensors: a projection, then every row-wise operator up to the block's output (or an
  attention's context, a few query rows at a time against whole keys and values).
- A *spatial chain* runs along the rows (H axis) of NCHW tensors: convolutions, pools and
  elementwise operators, each tile recomputing the halo its windows need.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import pairwise

import tvm
from tvm import relax

from ...split.acg import AxisConnectionGraph, build_acg
from ...split.chain import Branch, Chain, ChannelChain, RowChain, SpatialChain
from ...split.spatial import RowOp, RowWindow
from ..axes import graph_model
from ..ir_utils import constant_value, op_name, static_shape, top_level_bindings
from .operators import (
    CHANNEL,
    CONV,
    ELEMENTWISE_PER_CHANNEL,
    PER_CHANNEL_OPS,
    POOLS,
    ROW_GUARDS,
    ROW_OPS,
    ROWS,
    channels,
    nbytes,
    nchw,
    padding,
    sequence_rows,
)

_DIAMOND_OPS = 8
"""Operators an activation diamond may have (hard-swish has four): a longer walk is not one."""
SPATIAL_WINDOWS = 6
"""Convolutions and pools one spatial chain may span (a MobileNetV2 stem and its first block):
each adds its halo to the rows the earlier ones recompute."""
_SPATIAL_BINDINGS = 40
GATHER_BELOW = 4
"""A spatial chain is also offered with its last tiles concatenated once at the end when its last
tensor is this many times smaller than its largest."""


def axis_graph(mod: tvm.IRModule) -> tuple[AxisConnectionGraph, object]:
    """The axis connection graph of a normalized module, from its legalized TIR."""
    # reshapes stay views (as TVM later makes them), so their kept axes connect
    graph = graph_model(relax.transform.LegalizeOps({"relax.reshape": lambda _bb, call: call})(mod))
    return build_acg(graph), graph


@dataclass
class FunctionIndex:
    """``main`` of a normalized module as the chain finders read it."""

    bindings: list[relax.VarBinding]
    uses: dict[relax.Var, list[int]]
    """Tensor -> indices of the bindings that read it."""
    outputs: set[relax.Var]
    """Tensors the function returns."""
    defined_at: dict[relax.Var, int]
    acg: AxisConnectionGraph

    @classmethod
    def of(cls, mod: tvm.IRModule) -> FunctionIndex:
        func = mod["main"]
        bindings = top_level_bindings(func)
        uses: dict[relax.Var, list[int]] = {}
        for i, b in enumerate(bindings):
            for var in relax.analysis.free_vars(b.value):
                uses.setdefault(var, []).append(i)
        return cls(
            bindings,
            uses,
            set(relax.analysis.free_vars(func.body.body)),
            {b.var: i for i, b in enumerate(bindings)},
            axis_graph(mod)[0],
        )

    def single_consumer(self, var: relax.Var) -> int | None:
        users = self.uses.get(var, [])
        return users[0] if len(users) == 1 and var not in self.outputs else None

    def component(self, var: relax.Var, axis: int = CHANNEL) -> int | None:
        """The axis connection graph's component of ``var``'s ``axis``."""
        comp = self.acg.component_of(var.name, axis)
        return comp.id if comp is not None else None

    def exists_before(self, arg: relax.Expr, index: int) -> bool:
        """``arg`` is not a tensor computed at binding ``index`` or later."""
        return not isinstance(arg, relax.Var) or self.defined_at.get(arg, -1) < index

    def escaping(self, members: list[int]) -> list[relax.Var]:
        """Tensors of the bindings ``members`` that the rest of the program reads (or returns)."""
        inside = set(members)
        return [
            self.bindings[k].var
            for k in members
            if self.bindings[k].var in self.outputs
            or any(u not in inside for u in self.uses.get(self.bindings[k].var, []))
        ]


def find_chains(mod: tvm.IRModule) -> list[Chain]:
    """Every chain of ``main`` whose tensors the axis connection graph joins: channel chains
    (single branches from each ``groups=1`` convolution, and the branches of a channel concat with
    the per-channel operators after it), row chains and spatial chains."""
    index = FunctionIndex.of(mod)
    branches = _channel_branches(index)
    return [
        *_channel_chains(index, branches),
        *_concat_chains(index, branches),
        *_row_chains(index),
        *_spatial_chains(index),
    ]


# Channel chains


@dataclass
class _FoundBranch:
    branch: Branch
    last: relax.Var
    """The branch's last tensor."""
    end: int | None
    """The binding that ended the walk, when it is the last tensor's only reader."""
    tensors: list[relax.Var]


def _channel_branches(index: FunctionIndex) -> dict[int, _FoundBranch]:
    """Branches from every head (a ``groups=1`` convolution with constant weights, or a pool over
    a tensor kept whole), by the head's binding index."""
    found = {}
    for i, head in enumerate(index.bindings):
        value = head.value
        if channels(head.var) is None:
            continue
        if op_name(value) == CONV:
            if int(value.attrs.groups) != 1 or constant_value(value.args[1]) is None:
                continue
        elif not _pool_head(index, value):
            continue
        comp = index.component(head.var)
        if comp is None:
            continue
        mids, units, end = _follow(index, head.var, comp, i, channels(head.var))
        last = mids[-1].var if mids else head.var
        branch = Branch(
            head.var.name, tuple(m.var.name for m in mids), units, channels(last), _pool_feeding(index, value)
        )
        found[i] = _FoundBranch(branch, last, end, [head.var] + [m.var for m in mids])
    return found


def _channel_chains(index: FunctionIndex, branches: dict[int, _FoundBranch]) -> list[Chain]:
    chains = []
    for i, found in branches.items():
        tensors = found.tensors
        if _reduces(index, found.end, found.last, index.component(index.bindings[i].var)):
            if len(tensors) > 1 and nbytes(found.last) < nbytes(tensors[0]):
                # the same tiles written into the last tensor, the tail run whole: as small when a
                # pool or a stride shrank that tensor (a stem's conv -> pool), and no partial sums
                chains.append(ChannelChain((found.branch,), None, (), None, sum(nbytes(v) for v in tensors[:-1])))
            chains.append(
                ChannelChain(
                    (found.branch,), None, (), index.bindings[found.end].var.name, sum(nbytes(v) for v in tensors)
                )
            )
        elif len(tensors) > 1:
            chains.append(ChannelChain((found.branch,), None, (), None, sum(nbytes(v) for v in tensors[:-1])))
    return chains


def _follow(
    index: FunctionIndex, start: relax.Var, comp: int, since: int, units: int
) -> tuple[list[relax.VarBinding], int, int | None]:
    """Per-channel operators after ``start``: (their bindings, units, index of the consumer
    that ended the walk, if it is the only one)."""
    current, found = start, []
    while True:
        j = index.single_consumer(current)
        if j is None:
            diamond = _closing_diamond(index, current, comp, since)
            if diamond is None:
                return found, units, None
            found.extend(diamond)
            current = diamond[-1].var
            continue
        nxt = index.bindings[j]
        op = op_name(nxt.value)
        if op == CONV and nxt.value.args[0].same_as(current) and constant_value(nxt.value.args[1]) is not None:
            groups = int(nxt.value.attrs.groups)
            channels_in, channels_out = channels(current), channels(nxt.var)
            if groups == 1 or channels_out is None or channels_in % groups or channels_out % groups or units % groups:
                return found, units, j
            units = groups
        elif op not in PER_CHANNEL_OPS or channels(nxt.var) != channels(current):
            return found, units, j
        if not _operands_ok(index, nxt.value, current, since) or index.component(nxt.var) != comp:
            return found, units, j
        found.append(nxt)
        current = nxt.var


def _closing_diamond(index: FunctionIndex, current: relax.Var, comp: int, since: int) -> list | None:
    """Elementwise operators that read ``current`` on several paths and meet again in one
    tensor (SiLU ``x * sigmoid(x)``, hard-swish): the bindings up to where they meet."""
    if current in index.outputs or len(index.uses.get(current, [])) < 2:
        return None
    pending = {current: set(index.uses[current])}
    members = []
    for j in range(index.defined_at[current] + 1, len(index.bindings)):
        binding = index.bindings[j]
        reads = [v for v in relax.analysis.free_vars(binding.value) if v in pending]
        if not reads:
            continue
        value = binding.value
        if (
            op_name(value) not in ELEMENTWISE_PER_CHANNEL
            or channels(binding.var) != channels(current)
            or index.component(binding.var) != comp
            or binding.var in index.outputs
            or len(members) == _DIAMOND_OPS
            or any(
                isinstance(a, relax.Var) and a not in pending and not index.exists_before(a, since) for a in value.args
            )
        ):
            return None
        members.append(binding)
        for v in reads:
            pending[v].discard(j)
            if not pending[v]:
                del pending[v]
        pending[binding.var] = set(index.uses.get(binding.var, []))
        if list(pending) == [binding.var]:
            return members
    return None


def _reduces(index: FunctionIndex, j: int | None, current: relax.Var, comp: int) -> bool:
    """Binding ``j`` is a ``groups=1`` convolution of ``current`` that sums over its channels."""
    if j is None:
        return False
    value = index.bindings[j].value
    return (
        op_name(value) == CONV
        and int(value.attrs.groups) == 1
        and value.args[0].same_as(current)
        and constant_value(value.args[1]) is not None
        and index.component(index.bindings[j].var) != comp
    )


def _pool_head(index: FunctionIndex, value: relax.Expr) -> bool:
    """A pool over a tensor that other operators read too (an inception module's input): the
    tensor stays whole, but the pool's output can be made tile by tile over its channels, each
    tile sliced from the input, when a convolution reduces it (the pool branch's projection)."""
    if op_name(value) not in POOLS:
        return False
    source = value.args[0]
    return (
        isinstance(source, relax.Var)
        and channels(source) is not None
        and (len(index.uses.get(source, [])) > 1 or source in index.outputs)
    )


def _pool_feeding(index: FunctionIndex, conv: relax.Expr) -> str | None:
    """The pool a convolution reads, when it is the pool's only reader and the pool's input
    stays whole for others (:attr:`Branch.pool`)."""
    if op_name(conv) != CONV or not isinstance(conv.args[0], relax.Var) or conv.args[0] not in index.defined_at:
        return None
    pool = index.bindings[index.defined_at[conv.args[0]]]
    if len(index.uses.get(pool.var, [])) != 1 or pool.var in index.outputs or not _pool_head(index, pool.value):
        return None
    return pool.var.name


def _concat_chains(index: FunctionIndex, branches: dict[int, _FoundBranch]) -> list[Chain]:
    """Chains whose branches meet in a channel concat: every input of the concat must end a
    branch; per-channel operators after it are shared; a reducing convolution is the tail."""
    found = []
    for j, binding in enumerate(index.bindings):
        value = binding.value
        if op_name(value) != "relax.concat" or channels(binding.var) is None:
            continue
        shape = static_shape(value.ty)
        if int(value.attrs.axis) % len(shape) != CHANNEL:
            continue
        fields = list(value.args[0].fields) if isinstance(value.args[0], relax.Tuple) else []
        members = []
        for f in fields:
            entry = next(((i, b) for i, b in branches.items() if b.last.same_as(f) and b.end == j), None)
            if entry is None:
                break
            members.append(entry)
        if not fields or len(members) != len(fields):
            continue
        comp = index.component(binding.var)
        if comp is None or any(index.component(index.bindings[i].var) != comp for i, _ in members):
            continue
        post, _, end = _follow(index, binding.var, comp, j, min(b.branch.units for _, b in members))
        if any(
            isinstance(a, relax.Var) and not a.same_as(previous.var)
            for previous, p in pairwise([binding, *post])
            for a in p.value.args
        ):
            continue  # each branch is emitted where its head was: shared operators take constants only
        last = post[-1].var if post else binding.var
        tail = index.bindings[end].var.name if _reduces(index, end, last, comp) else None
        if tail is None and not post:
            continue  # concat elimination already writes the branches into place
        joined = [binding.var] + [p.var for p in post] if tail else [binding.var] + [p.var for p in post[:-1]]
        tiles = [v for _, b in members for v in b.tensors] + joined
        found.append(
            ChannelChain(
                tuple(b.branch for _, b in members),
                binding.var.name,
                tuple(p.var.name for p in post),
                tail,
                sum(nbytes(v) for v in tiles),
            )
        )
    return found


def _operands_ok(index: FunctionIndex, value: relax.Call, current: relax.Var, head_index: int) -> bool:
    """Other operands are constants or tensors that exist before the chain starts."""
    for arg in value.args:
        if arg.same_as(current) or isinstance(arg, tvm.ir.GenericConst):
            continue
        if isinstance(arg, relax.Var) and index.defined_at.get(arg, -1) < head_index:
            continue
        return False
    return True


# Row chains (sequence axis)


def row_axis(value: relax.Expr, out: relax.Var, axis_of: dict, rows: int) -> int | None:
    """The sequence axis of ``out`` when ``value`` is row-wise in its operands from the chain
    (``axis_of``: chain tensor -> its sequence axis), else None. Row-wise: output row r depends on
    row r of the chain operands alone. Elementwise operators (other operands broadcast along the
    rows or sliced with them), a matmul whose left operand has the rows as its second-to-last axis
    and whose right one comes from outside (constant weights; an attention's keys or values,
    computed whole), a layer norm or softmax over other axes, and the views between attention
    heads and tokens: a reshape that keeps every axis up to the rows, a transpose (the rows move)."""
    op = op_name(value)
    shape = static_shape(out.ty)
    chained = [a for a in getattr(value, "args", []) if isinstance(a, relax.Var) and a in axis_of]
    if shape is None or not chained or op is None:
        return None
    data = value.args[0]
    if op == "relax.matmul":
        left, right = value.args
        right_shape = static_shape(right.ty)
        if (
            left not in axis_of
            or right in axis_of
            or right_shape is None
            or len(right_shape) < 2
            or axis_of[left] != len(static_shape(left.ty)) - 2
        ):
            return None
        axis = len(shape) - 2
    elif data not in axis_of or chained != [data]:
        if op not in ROW_OPS | ROW_GUARDS:
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
            if tuple(static_shape(data.ty)[: axis + 1]) != tuple(shape[: axis + 1]):
                return None
        elif op == "relax.permute_dims":
            order = (
                [int(a) for a in value.attrs.axes] if value.attrs.axes is not None else list(range(len(shape)))[::-1]
            )
            axis = order.index(axis)
        elif (
            op not in ROW_OPS | ROW_GUARDS
            or static_shape(data.ty) != shape
            or not all(_broadcast_or_rows(a, shape, axis, rows) for a in value.args[1:])
        ):
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


def _row_chains(index: FunctionIndex) -> list[Chain]:
    """Row chains of transformer blocks: from a matmul with constant weights on ``(1, sequence,
    features)`` (a projection), every row-wise operator (:func:`row_axis`) that reads the chain,
    up to the longest prefix whose tensors reach the rest of the program through one tensor (the
    block's output, made tile by tile into its rows). From a query projection that spans the
    attention: scores, softmax and context of a few query rows at a time against whole keys and
    values; the tiles then run once those exist (the chain's anchor). The chain's tensors must
    share one component of the axis connection graph along their sequence axes."""
    bindings = index.bindings
    found = []
    for i, head in enumerate(bindings):
        rows = sequence_rows(head.var)
        if (
            rows is None
            or rows < 2
            or op_name(head.value) != "relax.matmul"
            or constant_value(head.value.args[1]) is None
            or len(static_shape(head.value.args[1].ty) or ()) != 2
            or sequence_rows(head.value.args[0]) != rows
        ):
            continue
        comp = index.component(head.var, 1)
        if comp is None:
            continue
        members, best = [i], None
        axis_of = {head.var: 1}
        for j in range(i + 1, len(bindings)):
            binding = bindings[j]
            reads = list(relax.analysis.free_vars(binding.value))
            if not any(index.defined_at.get(v) in members for v in reads):
                continue
            axis = row_axis(binding.value, binding.var, axis_of, rows)
            if axis is None or index.component(binding.var, axis) != comp:
                break
            members.append(j)
            axis_of[binding.var] = axis
            if index.escaping(members) == [binding.var]:
                best = [bindings[k] for k in members]
        if best is None:
            continue
        names = tuple(b.var.name for b in best)
        inside = {b.var for b in best}
        later = [
            index.defined_at[v]
            for b in best
            for v in relax.analysis.free_vars(b.value)
            if v not in inside and index.defined_at.get(v, -1) > i
        ]
        anchor = bindings[max(later)].var.name if later else None
        tiles = sum(nbytes(b.var) for b in best[:-1])
        found.append(RowChain(Branch(names[0], names[1:], rows, rows), tiles, anchor))
    return found


# Spatial chains (H axis)


def _row_window(value: relax.Call) -> RowWindow | None:
    """How a batch-1 NCHW convolution with constant weights, or a pool, reads rows (None: not one
    a tile can reproduce, e.g. an average pool in ceil mode, whose border divisors would change)."""
    a, op, shape = value.attrs, op_name(value), nchw(value.args[0])
    if shape is None:
        return None
    if op == CONV:
        layouts = (str(a.data_layout), str(a.kernel_layout), str(a.out_layout or a.data_layout))
        if layouts != ("NCHW", "OIHW", "NCHW") or constant_value(value.args[1]) is None:
            return None
        kernel = static_shape(value.args[1].ty)[2]
    elif op in POOLS:
        if (
            str(a.layout) != "NCHW"
            or str(a.out_layout or a.layout) != "NCHW"
            or (bool(a.ceil_mode) and op != "relax.nn.max_pool2d")
        ):
            return None
        kernel = int(a.pool_size[0])
    else:
        return None
    window = RowWindow(kernel, int(a.strides[0]), padding(a)[0], int(a.dilation[0]), shape[ROWS])
    rows = nchw(value)[ROWS]
    if any(lo >= hi for (lo, hi), _, _ in (window.input_rows((0, 1)), window.input_rows((rows - 1, rows)))):
        return None  # a border row that reads only padding
    return window


def _row_op(index: FunctionIndex, binding: relax.VarBinding, inside: set[relax.Var], since: int) -> RowOp | None:
    """``binding`` as an operator of a spatial chain whose bindings so far are ``inside``, or None.
    Operands from outside must exist before the chain's head (its tiles run there)."""
    value, var = binding.value, binding.var
    out = nchw(var)
    if out is None or not isinstance(value, relax.Call) or op_name(value) is None:
        return None
    row_bytes = nbytes(var) // out[ROWS]
    if op_name(value) in (CONV, *POOLS):
        window, data = _row_window(value), value.args[0]
        if window is None or not all(index.exists_before(a, since) for a in value.args[1:]):
            return None
        if data in inside:
            return RowOp(var.name, (data.name,), out[ROWS], row_bytes, window)
        if not index.exists_before(data, since):
            return None
        return RowOp(var.name, (), out[ROWS], row_bytes, window, (data.name,))
    if op_name(value) not in ELEMENTWISE_PER_CHANNEL:
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
        elif not index.exists_before(arg, since):
            return None
        elif shape is not None and len(shape) == 4 and shape[ROWS] == out[ROWS] and out[ROWS] > 1:
            if nchw(arg) is None or constant_value(arg) is not None:
                return None
            outside.append(arg.name)
        elif shape is None or (len(shape) >= 2 and shape[-2] != 1):  # not broadcast along the rows
            return None
    return RowOp(var.name, tuple(dict.fromkeys(reads)), out[ROWS], row_bytes, None, tuple(outside))


def _spatial_chains(index: FunctionIndex) -> list[Chain]:
    """Spatial chains: from each convolution or pool reading a tensor from outside, the operators
    that read the chain and can be cut into rows (convolutions, pools, elementwise), up to every
    prefix whose tensors reach the rest of the program through its last one alone (made tile by
    tile into its rows). At least two convolutions or pools (one and its epilogue gain nothing),
    at most :data:`SPATIAL_WINDOWS`; the rows of all tensors in one component of the axis
    connection graph (sliding-window axes join a tensor's rows to its consumer's)."""
    bindings = index.bindings
    found = []
    for i, head in enumerate(bindings):
        if op_name(head.value) not in (CONV, *POOLS):
            continue
        first = _row_op(index, head, set(), i)
        comp = index.component(head.var, ROWS)
        if first is None or comp is None:
            continue
        ops, members, inside = [first], [i], {head.var}
        windows = 1
        for j in range(i + 1, len(bindings)):
            binding = bindings[j]
            if not any(v in inside for v in relax.analysis.free_vars(binding.value)):
                continue
            op = _row_op(index, binding, inside, i)
            if op is None or index.component(binding.var, ROWS) != comp or len(ops) == _SPATIAL_BINDINGS:
                break
            windows += op.window is not None
            if windows > SPATIAL_WINDOWS:
                break
            ops.append(op)
            members.append(j)
            inside.add(binding.var)
            if (
                index.escaping(members) != [binding.var]
                or windows < 2
                or op.rows < 2
                or _epilogue_follows(index, binding.var)
            ):
                continue
            names = tuple(bindings[k].var.name for k in members)
            tiles = sum(nbytes(bindings[k].var) for k in members[:-1])
            chain = SpatialChain(Branch(names[0], names[1:], op.rows, nchw(binding.var)[CHANNEL]), tuple(ops), tiles)
            found.append(chain)
            if GATHER_BELOW * nbytes(binding.var) <= max(nbytes(bindings[k].var) for k in members):
                found.append(replace(chain, gathered=True))
    return found


def _epilogue_follows(index: FunctionIndex, var: relax.Var) -> bool:
    """``var``'s only consumer is an elementwise operator (a bias or activation): a chain ending
    here would cut an epilogue off its convolution."""
    users = index.uses.get(var, [])
    return (
        var not in index.outputs
        and len(users) == 1
        and op_name(index.bindings[users[0]].value) in ELEMENTWISE_PER_CHANNEL
    )
