"""Spatial chains: runs of convolutions, pools and elementwise operators along the rows (H axis)
of NCHW tensors, each tile recomputing the halo its windows need (MCUNetV2's patch-based
inference; docs/design.md, "Fine-grained splitting"). A chain may branch and join: the parallel paths
of an inception or fire module start from the same tensor and meet in a channel concat, whose row ``r``
is row ``r`` of every path, so a tile runs every path on its rows and concatenates them."""

from __future__ import annotations

from dataclasses import replace

from tvm import relax

from ...split.chain import Branch, Chain, SpatialChain
from ...split.spatial import RowOp, RowWindow
from ..ir_utils import constant_value, op_name, static_shape
from .index import FunctionIndex
from .operators import (
    CHANNEL,
    CONCAT,
    CONV,
    DEQUANTIZE,
    ELEMENTWISE_PER_CHANNEL,
    POOLS,
    QDQ_OPS,
    QUANTIZE,
    ROWS,
    nbytes,
    nchw,
    padding,
)

SPATIAL_WINDOWS = 6
"""Convolutions and pools one spatial chain may span (a MobileNetV2 stem and its first block):
each adds its halo to the rows the earlier ones recompute."""
LINE_BUFFER_WINDOWS = 12
"""Convolutions and pools a spatial chain may span on a microcontroller, whose tiles keep a line buffer
(:attr:`~tvm_memplan.split.chain.SplitChoice.rolling`): no halo grows with the windows, and the 9 of a
MobileNetV2 stem and its first three blocks cut the 96x112x112 expansion into tiles (MCUNetV2's patches)."""
_SPATIAL_BINDINGS = 64
"""Bindings a chain of :data:`SPATIAL_WINDOWS` windows may span (longer chains: as many per window): two
inception modules and the pool after them (GoogLeNet's 3a, 3b and its 3x3 max pool: 42)."""
GATHER_BELOW = 4
"""A spatial chain is also offered with its last tiles concatenated once at the end when its last
tensor is this many times smaller than its largest."""


def _row_window(value: relax.Call, constants: set[relax.Var]) -> RowWindow | None:
    """How a batch-1 NCHW convolution with constant weights (or weights computed from constants:
    ``constants``, a QDQ model's dequantized ones), or a pool, reads rows (None: not one a tile can
    reproduce, e.g. an average pool in ceil mode, whose border divisors would change)."""
    a, op, shape = value.attrs, op_name(value), nchw(value.args[0])
    if shape is None:
        return None
    if op == CONV:
        layouts = (str(a.data_layout), str(a.kernel_layout), str(a.out_layout or a.data_layout))
        weight = value.args[1]
        if layouts != ("NCHW", "OIHW", "NCHW") or (constant_value(weight) is None and weight not in constants):
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
    row_bytes = nbytes(var, index.block_of(var)) // out[ROWS]
    if index.quantized and str(var.ty.dtype) == "float32":
        row_bytes //= 4  # an integer kernel's int8 tile (the simulator's view of a dequantize is its input)
    if op_name(value) in (CONV, *POOLS):
        window, data = _row_window(value, index.constants), value.args[0]
        if window is None or not all(index.exists_before(a, since) for a in value.args[1:]):
            return None
        if data in inside:
            return RowOp(var.name, out[ROWS], row_bytes, reads=(data.name,), window=window)
        if not index.exists_before(data, since):
            return None
        copied = _copied_row_bytes(index, data)
        return RowOp(var.name, out[ROWS], row_bytes, window=window, outside=(data.name,), copied_row_bytes=copied)
    if op_name(value) == CONCAT:
        return _concat_row_op(value, var, inside, row_bytes)
    if op_name(value) not in ELEMENTWISE_PER_CHANNEL | QDQ_OPS:
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
    return RowOp(var.name, out[ROWS], row_bytes, reads=tuple(dict.fromkeys(reads)), outside=tuple(outside))


def _concat_row_op(value: relax.Call, var: relax.Var, inside: set[relax.Var], row_bytes: int) -> RowOp | None:
    """A channel concat of the chain's own tensors (an inception module's or a fire module's branches
    meeting): output row ``r`` is row ``r`` of every input, so a tile concatenates its inputs' tiles."""
    fields = value.args[0].fields if isinstance(value.args[0], relax.Tuple) else None
    if (
        fields is None
        or int(value.attrs.axis) % 4 != CHANNEL
        or not all(isinstance(f, relax.Var) and f in inside and nchw(f) is not None for f in fields)
        or any(nchw(f)[ROWS] != nchw(var)[ROWS] for f in fields)
    ):
        return None
    return RowOp(var.name, nchw(var)[ROWS], row_bytes, reads=tuple(dict.fromkeys(f.name for f in fields)))


def _copied_row_bytes(index: FunctionIndex, data: relax.Expr) -> int:
    """Bytes of one row a tile copies of ``data``, a window's operand from outside the chain (0: read in
    place): in a QDQ module, of the int8 tensor that ``data`` dequantizes. The quantize of the function's
    float input is no copy: ``LowerQDQ`` fuses the quantize of each tile's rows into its convolution.
    In a blocked layout every tile cuts its rows out (the rows of a blocked tensor, padded blocks
    included; of the function's NCHW input, unpadded), as the rewriter does where windows are not read
    in place (:func:`~.rewrite.windows_in_place`)."""
    shape = nchw(data)
    if index.block is not None and not index.quantized and shape is not None:
        return nbytes(data, index.block_of(data)) // shape[ROWS]
    binding = index.bindings[index.defined_at[data]] if data in index.defined_at else None
    if not index.quantized or binding is None or op_name(binding.value) != DEQUANTIZE:
        return 0
    source = binding.value.args[0]
    if source not in index.defined_at:
        return 0
    producer = index.bindings[index.defined_at[source]].value
    if op_name(producer) == QUANTIZE and producer.args[0] not in index.defined_at:
        return 0
    shape = nchw(source)
    return nbytes(source, index.block_of(source)) // shape[ROWS] if shape is not None else 0


def spatial_chains(index: FunctionIndex, windows: int | None = None) -> list[Chain]:
    """Spatial chains: from each convolution or pool reading a tensor from outside, the operators
    that read the chain and can be cut into rows (convolutions, pools, elementwise, channel concats of the
    chain's tensors), and the convolutions and pools that start another path from a tensor a path of the
    chain starts from (its siblings), up to every prefix whose tensors reach the rest of the program through
    its last one alone (made tile by tile into its rows). At least two and at most ``windows`` (None:
    :data:`SPATIAL_WINDOWS`) convolutions or pools on its deepest path (one and its epilogue gain nothing;
    the halo grows with the windows along a path, not across parallel paths); the rows of all tensors in one
    component of the axis connection graph (sliding-window axes join a tensor's rows to its consumer's)."""
    most = SPATIAL_WINDOWS if windows is None else windows
    most_bindings = max(_SPATIAL_BINDINGS, _SPATIAL_BINDINGS * most // SPATIAL_WINDOWS)
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
        depth = {first.name: 1}  # windows on the longest path to each operator (each adds its halo)
        siblings = set(first.outside)  # tensors a branch of the chain starts from (an inception module's input)
        for j in range(i + 1, len(bindings)):
            binding = bindings[j]
            reads_chain = any(v in inside for v in relax.analysis.free_vars(binding.value))
            if not reads_chain and not _sibling(binding, siblings):
                continue
            op = _row_op(index, binding, inside, i)
            if op is None or index.component(binding.var, ROWS) != comp or len(ops) == most_bindings:
                break
            depth[op.name] = max((depth[r] for r in op.reads), default=0) + (op.window is not None)
            if depth[op.name] > most:
                break
            ops.append(op)
            members.append(j)
            inside.add(binding.var)
            siblings.update(op.outside if op.window is not None else ())
            if (
                index.escaping(members) != [binding.var]
                or depth[op.name] < 2
                or op.rows < 2
                or _epilogue_follows(index, binding.var)
                or op_name(binding.value) == DEQUANTIZE
            ):
                continue
            names = tuple(bindings[k].var.name for k in members)
            tiles = sum(nbytes(bindings[k].var) for k in members[:-1])
            chain = SpatialChain(Branch(names[0], names[1:], op.rows, nchw(binding.var)[CHANNEL]), tuple(ops), tiles)
            found.append(chain)
            if GATHER_BELOW * nbytes(binding.var) <= max(nbytes(bindings[k].var) for k in members):
                found.append(replace(chain, gathered=True))
    return found


def _sibling(binding: relax.VarBinding, starts: set[str]) -> bool:
    """``binding`` is a convolution or pool that starts another branch from a tensor a branch of the chain
    starts from (the parallel paths of an inception or fire module, joined later by a concat)."""
    value = binding.value
    return (
        isinstance(value, relax.Call)
        and op_name(value) in (CONV, *POOLS)
        and isinstance(value.args[0], relax.Var)
        and value.args[0].name in starts
    )


def _epilogue_follows(index: FunctionIndex, var: relax.Var) -> bool:
    """``var``'s only consumer is an elementwise operator (a bias or activation) or its quantize: a
    chain ending here would cut an epilogue off its convolution (in a QDQ model, leave a float tensor
    whole between the integer kernels). A chain does not end at a dequantize either: its consumer
    reads the int8 tensor."""
    users = index.uses.get(var, [])
    return (
        var not in index.outputs
        and len(users) == 1
        and op_name(index.bindings[users[0]].value) in ELEMENTWISE_PER_CHANNEL | {QUANTIZE}
    )
