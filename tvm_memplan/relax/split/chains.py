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

from dataclasses import dataclass
from itertools import pairwise

import tvm
from tvm import relax

from ...quant.qdq_graph import has_qdq
from ...split.chain import Branch, Chain, ChannelChain, RowChain
from ..ir_utils import constant_value, op_name, static_shape
from .index import FunctionIndex
from .operators import (
    CHANNEL,
    CONCAT,
    CONV,
    ELEMENTWISE_PER_CHANNEL,
    PER_CHANNEL_OPS,
    POOLS,
    ROW_GUARDS,
    ROW_OPS,
    channels,
    nbytes,
    sequence_rows,
)
from .spatial_chains import spatial_chains

_DIAMOND_OPS = 8
"""Operators an activation diamond may have (hard-swish has four): a longer walk is not one."""


def find_chains(mod: tvm.IRModule, block: int | None = None, windows: int | None = None) -> list[Chain]:
    """Every chain of ``main`` whose tensors the axis connection graph joins: channel chains
    (single branches from each ``groups=1`` convolution, and the branches of a channel concat with
    the per-channel operators after it), row chains and spatial chains. A QDQ (int8) module has
    spatial chains only: a row tile runs each integer kernel on some of its rows, exactly, where a
    channel chain's partial sums would be float tensors no integer kernel computes. ``block``: the
    blocked layout's channels per block, whose padding a spatial chain's row tiles hold (None: NCHW).
    ``windows``: the most convolutions and pools of a spatial chain (:func:`spatial_chains`)."""
    index = FunctionIndex.of(mod, block)
    if has_qdq(mod["main"]):
        return spatial_chains(index, windows)
    branches = _channel_branches(index)
    return [
        *_channel_chains(index, branches),
        *_concat_chains(index, branches),
        *_row_chains(index),
        *spatial_chains(index, windows),
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
        kept = units
        if op == CONV and nxt.value.args[0].same_as(current) and constant_value(nxt.value.args[1]) is not None:
            groups = int(nxt.value.attrs.groups)
            channels_in, channels_out = channels(current), channels(nxt.var)
            if groups == 1 or channels_out is None or channels_in % groups or channels_out % groups or units % groups:
                return found, units, j
            kept = groups  # tiles of whole groups
        elif op not in PER_CHANNEL_OPS or channels(nxt.var) != channels(current):
            return found, units, j
        if not _operands_ok(index, nxt.value, current, since) or index.component(nxt.var) != comp:
            return found, units, j
        found.append(nxt)
        current, units = nxt.var, kept


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
        if op_name(value) != CONCAT or channels(binding.var) is None:
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
