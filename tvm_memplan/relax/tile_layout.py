"""A split model's tiles kept in the blocked layout.

The split rewriter (:mod:`~tvm_memplan.relax.split.rewrite`) works on the NCHW module; the blocked
layout pass (:func:`~tvm_memplan.relax.layout.BlockedLayout`) then carries NCHW[x]c through the tiles'
operators, their ``strided_slice`` of rows and ``concat`` of row tiles, as it does through the unsplit
model's. The rewriter's own kernels are TIR that ``ConvertLayout`` cannot see into, so they would stay
NCHW, each with a ``layout_transform`` of its tile and of the whole tensor it writes or accumulates into.
:func:`BlockedTiles` gives them NCHW[x]c versions, after ``ConvertLayout``:

- row copies (``write_rows``, a line buffer's ``place_rows``) copy a blocked tile into its rows of a
  blocked tensor (rows are axis 2 in both layouts), padded channel blocks included;
- a channel tile's partial sum ``conv2d(tile, weight) + running`` is a blocked convolution plus the
  running sum, weights packed here with zeros for the channels that pad a block;
- row slices, and channel slices of whole blocks, of a tensor that is blocked slice it blocked;
- the elementwise operators after a chain's blocked result (bias, activations, a residual add, padded
  blocks included) follow it, and the ``nn.pad`` of its padded channels and its re-blocking become the
  blocked tensor itself;
- a fused chain, outlined into a function of its own that ``ConvertLayout`` converts apart from its
  caller, takes the tensors its caller holds blocked and returns its result blocked
  (:func:`carried_chain`), so neither side changes layout at the call (a result whose last block is
  padded then occupies whole blocks in the arena, as the unsplit model's tensors do).

The NCHW tensor is made only before a reader none of these covers, so a split model has no layout
transform per tile.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, te, tirx

from .ir_utils import constant_value, static_shape
from .module import relax_functions, with_blocks
from .split.operators import CHANNEL, ROWS
from .split.outline import TILES_ATTR
from .split.rewrite import row_writer
from .tile_writes import ACCUMULATE_ATTR, ROW_OFFSET_ATTR, ROW_WRITER_ATTR

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
_CALL_TIR_INPLACE = tvm.ir.Op.get("relax.call_tir_inplace")
_LAYOUT_TRANSFORM = tvm.ir.Op.get("relax.layout_transform")
_STRIDED_SLICE = tvm.ir.Op.get("relax.strided_slice")
ELEMENTWISE = frozenset(
    f"relax.{name}"
    for name in ("add", "subtract", "multiply", "divide", "maximum", "minimum", "sigmoid", "nn.relu", "tanh")
)
"""Operators carried into NCHW[x]c after a chain's blocked result: a chain's partial sums end in a call
that ``ConvertLayout`` did not see, so the bias and activation after it were left in NCHW."""


def _shape(expr: relax.Expr) -> list[int] | None:
    shape = static_shape(expr.ty)
    return None if shape is None else list(shape)


def _maps_to(index_map: tirx.IndexMap, point: list[int], expected: list[int]) -> bool:
    values = index_map.map_indices([tirx.IntImm("int64", p) for p in point])  # constants fold as they map
    return all(isinstance(v, tirx.IntImm) for v in values) and [int(v) for v in values] == expected


def unblocking(call: relax.Expr) -> int | None:
    """The block ``x`` where ``call`` is a ``layout_transform`` of a whole NCHW[x]c tensor to NCHW
    (no padded channels), else None."""
    if not (isinstance(call, relax.Call) and call.op.same_as(_LAYOUT_TRANSFORM)) or call.attrs.pad_value is not None:
        return None
    source, target = _shape(call.args[0]), _shape(call)
    if source is None or target is None or len(source) != 5 or len(target) != 4:
        return None
    _, chunks, rows, columns, block = source
    if target != [source[0], chunks * block, rows, columns]:
        return None
    return block if _maps_to(call.attrs.index_map, [0, 1, 2, 3, 4], [0, block + 4, 2, 3]) else None


def blocking(call: relax.Expr) -> int | None:
    """The block ``x`` where ``call`` is a ``layout_transform`` of NCHW to NCHW[x]c (no padding), else None."""
    if not (isinstance(call, relax.Call) and call.op.same_as(_LAYOUT_TRANSFORM)) or call.attrs.pad_value is not None:
        return None
    source, target = _shape(call.args[0]), _shape(call)
    if source is None or target is None or len(source) != 4 or len(target) != 5:
        return None
    block = target[4]
    if target != [source[0], source[1] // block, source[2], source[3], block] or source[1] % block:
        return None
    channel = block + 1 if source[1] > block else block - 1
    expected = [0, channel // block, 2, 3, channel % block]
    return block if _maps_to(call.attrs.index_map, [0, channel, 2, 3], expected) else None


def _unblocked(blocked: relax.Expr, block: int) -> relax.Expr:
    return relax.op.layout_transform(blocked, index_map=lambda n, c, h, w, i: (n, c * block + i, h, w))


def _ints(expr: relax.Expr) -> list[int] | None:
    fields = getattr(expr, "fields", None) or getattr(expr, "values", None)
    if fields is None:
        return None
    values = [getattr(f, "value", f) for f in fields]  # IntImm (or PrimValue of one) fields
    values = [getattr(v, "value", v) for v in values]
    return [int(v) for v in values] if all(isinstance(v, int) for v in values) else None


def axis_slice(call: relax.Expr, axis: int) -> tuple[int, int] | None:
    """``[begin, end)`` where ``call`` is a unit-stride ``strided_slice`` of ``axis`` alone (rows: axis 2,
    channels: axis 1)."""
    if not (isinstance(call, relax.Call) and call.op.same_as(_STRIDED_SLICE)):
        return None
    axes, begin, end = (_ints(a) for a in call.args[1:4])
    strides = _ints(call.args[4]) if len(call.args) > 4 else [1]
    if axes != [axis] or strides != [1] or begin is None or end is None:
        return None
    return begin[0], end[0]


def _marked(call: relax.Expr, mod: tvm.IRModule, attr: str) -> tirx.PrimFunc | None:
    """The kernel ``call`` calls where it carries ``attr``."""
    if not isinstance(call, relax.Call) or not (call.op.same_as(_CALL_TIR) or call.op.same_as(_CALL_TIR_INPLACE)):
        return None
    func = mod[call.args[0]]
    if not isinstance(func, tirx.PrimFunc) or func.attrs is None or attr not in func.attrs:
        return None
    return func


def packed_weights(weight: np.ndarray, block: int) -> np.ndarray:
    """OIHW weights as OIHW[x]i[x]o, the layout :func:`~tvm_memplan.relax.layout.conv2d_nchwc` reads."""
    out_channels, in_channels, kernel_h, kernel_w = weight.shape
    blocks = weight.reshape(out_channels // block, block, in_channels // block, block, kernel_h, kernel_w)
    return np.ascontiguousarray(blocks.transpose(0, 2, 4, 5, 3, 1))


class _Block:
    """One binding block rewritten: NCHW tensors that the row writers now make in NCHW[x]c, their
    NCHW bindings emitted only before their first reader that is not a row writer."""

    def __init__(
        self,
        mod: tvm.IRModule,
        builder: relax.BlockBuilder,
        conv: Callable,
        chains: dict[tvm.ir.GlobalVar, relax.Function] | None = None,
    ) -> None:
        self.mod, self.builder, self.conv = mod, builder, conv
        self.chains = chains or {}
        """Outlined split chains (:data:`~.split.outline.TILES_ATTR`) this block may call with blocked tensors."""
        self.carried: dict[tvm.ir.GlobalVar, tvm.ir.GlobalVar] = {}
        """Chain function → its NCHW[x]c version, which this block calls instead."""
        self.params: set[relax.Var] = set()
        """Parameters of a chain function given to it blocked (seeded in ``blocked``)."""
        self.blocked: dict[relax.Var, tuple[relax.Expr, int]] = {}
        """NCHW variable → its NCHW[x]c value and x."""
        self.unblocks: dict[relax.Var, tuple[relax.Expr, int]] = {}
        """NCHW variable bound to a ``layout_transform`` of an NCHW[x]c tensor → that tensor and x."""
        self.padded: dict[relax.Var, tuple[relax.Expr, int]] = {}
        """NCHW variable bound to the first channels of an NCHW[x]c tensor whose last block is padded (a
        ``strided_slice`` that :func:`~.channel_pad.PadChannels` left) → that tensor and x."""
        self.channels: dict[relax.Var, int] = {}
        """Blocked variables whose NCHW[x]c value holds padded channels → their channels."""
        self.pending: set[relax.Var] = set()
        """Blocked variables whose NCHW binding has not been emitted."""
        self.out: list[relax.Binding] = []
        self.changed = False

    def source(self, var: relax.Expr) -> tuple[relax.Expr, int] | None:
        """The NCHW[x]c tensor (and x) that NCHW ``var`` unblocks, without padded channels."""
        if not isinstance(var, relax.Var) or var in self.channels:
            return None
        return self.blocked.get(var) or self.unblocks.get(var)

    def padded_source(self, var: relax.Expr) -> tuple[relax.Expr, int] | None:
        """The NCHW[x]c tensor (and x) whose first channels NCHW ``var`` is, padded channels or not."""
        if not isinstance(var, relax.Var):
            return None
        return self.blocked.get(var) or self.unblocks.get(var) or self.padded.get(var)

    def materialize(self, var: relax.Var) -> None:
        if var in self.pending:
            self.pending.discard(var)
            value, block = self.blocked[var]
            whole = self.builder.normalize(_unblocked(value, block))
            if var in self.channels:  # the padded channels cut off
                unblocked = relax.DataflowVar(f"{var.name}_padded", whole.ty)
                self.out.append(relax.VarBinding(unblocked, whole))
                whole = relax.op.strided_slice(unblocked, axes=[1], begin=[0], end=[self.channels[var]])
            self.out.append(relax.VarBinding(var, self.builder.normalize(whole)))

    def visit(self, binding: relax.Binding) -> None:
        value = binding.value if isinstance(binding, relax.VarBinding) else None
        if value is not None and self.rewrite(binding.var, value):
            self.changed = True
            return
        if value is not None:
            for var in relax.analysis.free_vars(value):
                self.materialize(var)
        if value is not None and unblocking(value) is not None and isinstance(value.args[0], relax.Var):
            self.unblocks[binding.var] = (value.args[0], unblocking(value))
        self.out.append(binding)

    def rewrite(self, var: relax.Var, value: relax.Expr) -> bool:
        """Emit ``var = value`` in NCHW[x]c when it is a row writer, a row slice or an alias of a blocked
        tensor, or the blocking of one, or a call of a split chain; False when ``value`` is none of these."""
        if isinstance(value, relax.Call) and any(value.op.same_as(g) for g in self.chains):
            return self.chain_call(var, value)
        if isinstance(value, relax.Var) and value in self.blocked:
            self.blocked[var] = self.blocked[value]
            if value in self.channels:
                self.channels[var] = self.channels[value]
            self.pending.add(var)
            return True
        block = blocking(value)
        source = value.args[0] if block is not None else None
        if (
            block is not None
            and source in self.blocked
            and source not in self.channels
            and self.blocked[source][1] == block
        ):
            self.out.append(relax.VarBinding(var, self.blocked[value.args[0]][0]))
            return True
        rows = axis_slice(value, ROWS)
        if rows is not None and self.padded_source(value.args[0]) is not None:
            whole, block = self.padded_source(value.args[0])
            sliced = relax.op.strided_slice(whole, axes=[ROWS], begin=[rows[0]], end=[rows[1]])
            self.bind(var, sliced, block)
            if _shape(whole)[1] * block != _shape(var)[1]:
                self.channels[var] = _shape(var)[1]
            return True
        channels = axis_slice(value, CHANNEL)
        if channels is not None and self.source(value.args[0]) is not None:
            whole, block = self.source(value.args[0])
            chunks = _shape(whole)[1]
            if channels[0] == 0 and (chunks - 1) * block < channels[1] < chunks * block:
                self.padded[var] = (whole, block)  # the channels PadChannels added, cut off
                return False
            if channels[0] % block or channels[1] % block:
                return False
            sliced = relax.op.strided_slice(whole, axes=[1], begin=[channels[0] // block], end=[channels[1] // block])
            self.bind(var, sliced, block)
            return True
        if self.padding(value) is not None:  # the channels PadChannels pads in: the blocked tensor has them
            self.blocked[var] = self.blocked[value.args[0]]
            self.pending.add(var)
            return True
        if isinstance(value, relax.Call) and getattr(value.op, "name", None) in ELEMENTWISE:
            return self.elementwise(var, value)
        if _marked(value, self.mod, ACCUMULATE_ATTR) is not None:
            return self.accumulate(var, value)
        func = _marked(value, self.mod, ROW_WRITER_ATTR)
        if func is None:
            return False
        tile, *full = value.args[1].fields
        tile_source = self.padded_source(tile)  # a padded tile fills the padded blocks of the whole tensor
        full_source = [self.blocked.get(f) if isinstance(f, relax.Var) else None for f in full]
        if tile_source is None or any(f is None or f[1] != tile_source[1] for f in full_source):
            return False
        blocked_tile, block = tile_source
        shape, out_shape = _shape(blocked_tile), _shape(var)
        if shape is None or out_shape is None or any(_shape(f[0])[1] != shape[1] for f in full_source):
            return False
        full_shape = (out_shape[0], shape[1], out_shape[2], out_shape[3], block)
        offset = int(func.attrs[ROW_WRITER_ATTR])
        kernel = row_writer(full_shape, shape[ROWS], offset, str(var.ty.dtype), ROW_OFFSET_ATTR in func.attrs)
        gvar = self.builder.add_func(kernel, "write_rows")
        ty = relax.TensorType(full_shape, str(var.ty.dtype))
        if full_source:
            call = relax.call_tir_inplace(gvar, [blocked_tile, full_source[0][0]], [1], ty)
        else:
            call = relax.call_tir(gvar, [blocked_tile], out_ty=ty)
        self.bind(var, call, block)
        if shape[1] * block != out_shape[1]:
            self.channels[var] = out_shape[1]
        return True

    def padding(self, value: relax.Expr) -> relax.Var | None:
        """The blocked variable with padded channels that ``value`` pads to whole blocks (``nn.pad`` of the
        channel axis' end), else None. Its padded channels hold finite values, not zeros: every reader of
        a padded tensor ignores them (:mod:`.channel_pad`)."""
        if not (isinstance(value, relax.Call) and getattr(value.op, "name", None) == "relax.nn.pad"):
            return None
        data = value.args[0]
        if not isinstance(data, relax.Var) or data not in self.channels:
            return None
        widths = [int(w) for w in value.attrs.pad_width]
        chunks, block = _shape(self.blocked[data][0])[1], self.blocked[data][1]
        expected = [0, 0, 0, chunks * block - self.channels[data]] + [0] * (len(widths) - 4)
        return data if widths == expected else None

    def elementwise(self, var: relax.Var, value: relax.Call) -> bool:
        """An elementwise operator of blocked tensors (at least one of its operands), scalars and per-channel
        constants (blocked here), in NCHW[x]c. Tensors whose last block is padded (all alike) give a
        padded result: every operator here but ``divide`` is finite on finite inputs, so its padded
        channels stay finite, as :mod:`.channel_pad` requires; padded constants are zeros there."""
        if not any(isinstance(a, relax.Var) and a in self.blocked for a in value.args):
            return False
        shape = _shape(var)
        sources = [self.padded_source(a) if shape is not None and _shape(a) == shape else None for a in value.args]
        found = [s for s in sources if s is not None]
        if not found:
            return False
        block, chunks = found[0][1], _shape(found[0][0])[1]
        if any(b != block or _shape(t)[1] != chunks for t, b in found):
            return False
        padded = chunks * block != shape[1]
        if padded and value.op.name == "relax.divide":
            return False
        args = []
        for arg, source in zip(value.args, sources, strict=True):
            data = constant_value(arg)
            if source is not None:
                args.append(source[0])
            elif data is not None and data.ndim == 0:
                args.append(arg)
            elif data is not None and list(data.shape) == [1, shape[1], 1, 1]:
                data = np.pad(data, [(0, 0), (0, chunks * block - shape[1]), (0, 0), (0, 0)])
                channels = data.reshape(1, chunks, block, 1, 1).transpose(0, 1, 3, 4, 2)
                args.append(relax.const(np.ascontiguousarray(channels), str(data.dtype)))
            else:
                return False
        self.bind(var, relax.Call(value.op, args, value.attrs, value.ty_args), block)
        if padded:
            self.channels[var] = shape[1]
        return True

    def accumulate(self, var: relax.Var, value: relax.Call) -> bool:
        """A channel tile's partial sum ``conv2d(data, weight) + running`` on NCHW[x]c tensors, weights
        packed here with zeros for the channels that pad either tensor's last block (the running sum's
        padded channels hold garbage, cut off where the NCHW tensor is made)."""
        data, weight, running = value.args[1].fields
        data_source, running_source = self.padded_source(data), self.padded_source(running)
        if data_source is None or running_source is None or constant_value(weight) is None:
            return False
        (blocked_data, block), (blocked_running, running_block) = data_source, running_source
        kernel = constant_value(weight)
        if block != running_block:
            return False
        out_blocks, in_blocks = _shape(blocked_running)[1], _shape(blocked_data)[1]
        kernel = np.pad(
            kernel,
            [(0, out_blocks * block - kernel.shape[0]), (0, in_blocks * block - kernel.shape[1]), (0, 0), (0, 0)],
        )
        attrs = self.mod[value.args[0]].attrs[ACCUMULATE_ATTR]
        strides, padding, dilation = ([int(v) for v in attrs[key]] for key in ("strides", "padding", "dilation"))
        dtype = str(var.ty.dtype)
        packed = relax.const(packed_weights(kernel, block), dtype)
        x, w, acc = (
            te.placeholder([tirx.IntImm("int64", d) for d in _shape(v)], dtype)
            for v in (blocked_data, packed, blocked_running)
        )
        conv = self.conv(x, w, strides, padding, dilation, dtype)
        # int64 extents, as TVM's legalization writes them: FuseTIR maps buffers across fused kernels
        out = te.compute(acc.shape, lambda *i: conv(*i) + acc(*i), name="T_add")
        func = te.create_prim_func([x, w, acc, out]).without_attr("global_symbol").with_attr("tirx.noalias", True)
        gvar = self.builder.add_func(func, "conv2d_nchwc_accumulate")
        self.bind(var, relax.call_tir(gvar, [blocked_data, packed, blocked_running], out_ty=blocked_running.ty), block)
        if out_blocks * block != _shape(var)[1]:
            self.channels[var] = _shape(var)[1]
        return True

    def chain_call(self, var: relax.Var, call: relax.Call) -> bool:
        """A split chain's call with NCHW[x]c tensors across its edges: the arguments this block holds
        blocked are passed blocked (:func:`carried_chain` gives the chain their NCHW[x]c; an NCHW tensor
        blocked here, such as the model's input, stays NCHW: its blocked copy would live on through the
        chain), and its result stays blocked when the chain makes it so; False when neither."""
        gvar = next(g for g in self.chains if call.op.same_as(g))
        sources = []
        for arg in call.args:
            source = self.padded_source(arg) if isinstance(arg, relax.Var) else None
            sources.append(source if source is not None and _shape(source[0]) is not None else None)
        carried = carried_chain(self.chains[gvar], sources, self.mod, self.builder, self.conv)
        if carried is None:
            return False
        func, out_block = carried
        new_gvar = self.builder.add_func(func, f"{gvar.name_hint}_blocked")
        self.carried[gvar] = new_gvar
        args = [arg if source is None else source[0] for arg, source in zip(call.args, sources, strict=True)]
        value = relax.Call(new_gvar, args)
        if out_block is None:
            self.out.append(relax.VarBinding(var, self.builder.normalize(value)))
            return True
        self.bind(var, value, out_block)
        chunks = static_shape(func.ret_ty)[1]
        if chunks * out_block != _shape(var)[1]:
            self.channels[var] = _shape(var)[1]
        return True

    def bind(self, var: relax.Var, value: relax.Expr, block: int) -> None:
        value = self.builder.normalize(value)
        new = relax.DataflowVar(f"{var.name}_blocked", value.ty)
        self.out.append(relax.VarBinding(new, value))
        self.blocked[var] = (new, block)
        self.pending.add(var)

    def finish(self, block: relax.BindingBlock, keep: relax.Var | None = None) -> relax.BindingBlock:
        """The rewritten block; blocked variables read after it made NCHW, save ``keep`` and the
        parameters given blocked."""
        for var in list(self.pending):
            if not isinstance(var, relax.DataflowVar) and var not in self.params and not var.same_as(keep):
                self.materialize(var)
        kind = relax.DataflowBlock if isinstance(block, relax.DataflowBlock) else relax.BindingBlock
        return kind(self.out)


def carried_chain(
    func: relax.Function,
    sources: list[tuple[relax.Expr, int] | None],
    mod: tvm.IRModule,
    builder: relax.BlockBuilder,
    conv: Callable,
) -> tuple[relax.Function, int | None] | None:
    """The outlined chain ``func`` in NCHW[x]c across its edges: each parameter whose argument the
    caller holds blocked (``sources``: its NCHW[x]c tensor and x, or None) takes that tensor, which the
    chain's row slices and operators read blocked (:class:`_Block`, seeded with it); the chain returns
    its last tensor blocked where its body made it so (x, else None: NCHW, as before). Without this,
    ``ConvertLayout``, which sees one function at a time, unblocks each blocked tensor the chain reads
    in the caller and blocks every tile of it again, and unblocks the chain's result for a caller that
    blocks it again. None where nothing is carried (or the chain is not one binding block)."""
    if len(func.body.blocks) != 1 or not isinstance(func.body.body, relax.Var):
        return None
    (block,) = func.body.blocks
    rewriter = _Block(mod, builder, conv)
    params = []
    for param, source in zip(func.params, sources, strict=True):
        if source is None:
            params.append(param)
            continue
        blocked, x = source
        new = relax.Var(f"{param.name}_blocked", blocked.ty)
        params.append(new)
        rewriter.blocked[param] = (new, x)
        rewriter.params.add(param)
        rewriter.pending.add(param)
        if _shape(blocked)[1] * x != _shape(param)[1]:
            rewriter.channels[param] = _shape(param)[1]
    for binding in block.bindings:
        rewriter.visit(binding)
    result = func.body.body
    out = rewriter.padded_source(result)
    if out is not None and _shape(out[0]) is None:
        out = None
    if out is None and not rewriter.params:
        return None
    new_block = rewriter.finish(block, keep=result if out is not None else None)
    if out is None:
        body = relax.SeqExpr([new_block], result)
    else:
        returned = relax.Var(f"{result.name}_blocked", out[0].ty)
        kind = type(new_block)
        new_block = kind([*new_block.bindings, relax.VarBinding(returned, out[0])])
        body = relax.SeqExpr([new_block], returned)
    carried = relax.Function(params, body, body.body.ty, func.is_pure, func.attrs, func.span)
    carried = builder.normalize(carried)
    return carried, None if out is None else out[1]


def _called_once_chains(mod: tvm.IRModule) -> dict[tvm.ir.GlobalVar, relax.Function]:
    """The outlined split chains that one call in the module calls (each chain's tiles are one call)."""
    chains = {g: f for g, f in relax_functions(mod) if f.attrs is not None and TILES_ATTR in f.attrs}
    calls: dict[tvm.ir.GlobalVar, int] = dict.fromkeys(chains, 0)

    def count(node: object) -> None:
        if isinstance(node, relax.Call):
            for gvar in chains:
                if node.op.same_as(gvar):
                    calls[gvar] += 1

    for _, func in relax_functions(mod):
        tvm_ffi.structural_walk(func, count, order="pre")
    return {g: f for g, f in chains.items() if calls[g] == 1}


def BlockedTiles(conv: Callable) -> tvm.transform.Pass:  # noqa: N802 - named like TVM's passes
    """The split rewriter's kernels in NCHW[x]c where their tiles are (see the module docstring); ``conv``
    is the blocked convolution's compute (:func:`~tvm_memplan.relax.layout.conv2d_nchwc`). Run after
    ``ConvertLayout``; the transforms no longer read are dropped."""

    @tvm.transform.module_pass(opt_level=0, name="tvm_memplan.BlockedTiles")
    def _pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        builder = relax.BlockBuilder(mod)
        updates = {}
        chains = _called_once_chains(mod)
        carried: set[tvm.ir.GlobalVar] = set()
        callers = [(g, f) for g, f in relax_functions(mod) if g not in chains]
        for gvar, func in [*callers, *((g, f) for g, f in chains.items())]:
            if gvar in carried:
                continue
            blocks = []
            for block in func.body.blocks:
                rewriter = _Block(mod, builder, conv, chains if gvar not in chains else None)
                for binding in block.bindings:
                    rewriter.visit(binding)
                carried.update(rewriter.carried)
                blocks.append(rewriter.finish(block) if rewriter.changed else block)
            if any(new is not old for new, old in zip(blocks, func.body.blocks, strict=True)):
                updates[gvar] = with_blocks(func, blocks)
        if not updates:
            return mod
        functions = {g: f for g, f in builder.get().functions.items() if g not in carried}
        functions.update(updates)
        return relax.transform.DeadCodeElimination()(tvm.IRModule(functions, attrs=mod.attrs))

    return _pass
