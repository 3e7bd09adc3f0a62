"""The rewriter: chosen chains replaced by their tiles in the high-level module.

The rewrite is on the module before legalization, so every tile goes through TVM's legalization
and fusion and gets the same default schedules as the original operators. Channel tiles that a
convolution reduces become partial sums accumulated in one kernel per tile; row tiles of a spatial
chain are written into their rows of the last tensor by a kernel that
:func:`~tvm_memplan.relax.tile_writes.WriteTilesInPlace` later folds into the tile's producer.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator

import numpy as np
import tvm
from tvm import relax, te, topi
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.script import tirx as T

from ...errors import UserError
from ...split.chain import Branch, Chain, ChannelChain, RowChain, SpatialChain, SplitChoice, disjoint, tile_ranges
from ...split.spatial import RollingRows, Rows
from ..ir_utils import constant_value, op_name, static_shape, top_level_bindings
from ..tile_writes import ACCUMULATE_ATTR, CARRIED_ROWS_ATTR, ROW_OFFSET_ATTR, ROW_WRITER_ATTR
from .chains import row_axis
from .operators import CHANNEL, CONCAT, CONV, DEQUANTIZE, POOLS, QUANTIZE, ROWS, channels, nchw, padding
from .outline import marker, outline_marked


def _outside_row_axis(
    value: relax.Call, index: int, out_shape: tuple[int, ...], out_axis: int, rows: int
) -> int | None:
    """The axis along which a row tile slices operand ``index`` of a row-wise ``value`` from
    outside the chain, or None when every tile reads it whole (weights, keys and values,
    operands broadcast along the rows)."""
    arg = value.args[index]
    shape = static_shape(arg.ty) if isinstance(arg.ty, relax.TensorType) else None
    if shape is None:
        return None
    if op_name(value) == "relax.matmul":
        return len(shape) - 2 if index == 0 else None
    at = out_axis - (len(out_shape) - len(shape))
    return at if at >= 0 and shape[at] == rows and rows > 1 else None


def _slice_operand(arg: relax.Expr, lo: int, hi: int, channels: int, bb: relax.BlockBuilder) -> relax.Expr:
    """An operand broadcast against a tile: constants sliced along the channel axis, full
    tensors through ``strided_slice``, scalars and per-tensor values unchanged."""
    shape = static_shape(arg.ty)
    if shape is None or len(shape) not in (3, 4) or shape[0] != 1 or shape[CHANNEL] != channels:
        return arg
    data = constant_value(arg)
    if data is not None:
        return relax.const(np.ascontiguousarray(data[:, lo:hi]), str(arg.ty.dtype))
    return bb.emit(relax.op.strided_slice(arg, axes=[CHANNEL], begin=[lo], end=[hi]))


def _slice_rows(arg: relax.Expr, axis: int, lo: int, hi: int, bb: relax.BlockBuilder) -> relax.Expr:
    """Rows ``[lo, hi)`` along ``axis`` of an operand: a constant sliced here, a tensor by ``strided_slice``."""
    data = constant_value(arg)
    if data is not None:
        index = [slice(None)] * data.ndim
        index[axis] = slice(lo, hi)
        return relax.const(np.ascontiguousarray(data[tuple(index)]), str(arg.ty.dtype))
    return bb.emit(relax.op.strided_slice(arg, axes=[axis], begin=[lo], end=[hi]))


def _conv(
    value: relax.Call, data: relax.Expr, weight: np.ndarray | relax.Expr, groups: int, padding: list[int] | None = None
) -> relax.Expr:
    """The convolution ``value`` with another input, weights (a tile's slice, or the original
    constant shared by every tile), groups and padding (a row tile's)."""
    a = value.attrs
    if isinstance(weight, relax.Expr):
        kernel = weight
    else:
        kernel = relax.const(np.ascontiguousarray(weight), str(value.args[1].ty.dtype))
    return relax.op.nn.conv2d(
        data,
        kernel,
        strides=[int(x) for x in a.strides],
        padding=padding if padding is not None else [int(x) for x in a.padding],
        dilation=[int(x) for x in a.dilation],
        groups=groups,
        data_layout=str(a.data_layout),
        kernel_layout=str(a.kernel_layout),
        out_layout=str(a.out_layout),
        out_dtype=str(value.ty.dtype),
    )


def _conv_accumulate(
    bb: relax.BlockBuilder, conv: relax.Call, data: relax.Expr, weight: np.ndarray, running: relax.Expr
) -> relax.Expr:
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
    x, w, acc = (
        te.placeholder([tvm.tirx.IntImm("int64", d) for d in static_shape(v.ty)], dtype)
        for v in (data, kernel, running)
    )
    out = topi.add(topi.nn.conv2d_nchw(x, w, strides, padding, dilation, out_dtype=dtype), acc)
    func = te.create_prim_func([x, w, acc, out]).without_attr("global_symbol").with_attr("tirx.noalias", True)
    func = func.with_attr(ACCUMULATE_ATTR, {"strides": strides, "padding": padding, "dilation": dilation})
    gvar = bb.add_func(func, "conv2d_accumulate")
    return bb.emit(relax.call_tir(gvar, [data, kernel, running], out_ty=running.ty))


@mutator
class _SplitRewriter(PyExprMutator):
    """Emits each branch's tiles where its head was (so a branch's inputs are computed just
    before it, as in the original order); the chain's running sum (or the tiles of its last
    tensor) carries over from branch to branch and is bound to the chain's result after the
    last one."""

    def __init__(self, mod: tvm.IRModule, choices: list[SplitChoice], windows_in_place: bool = True) -> None:
        super().__init__(mod)
        self.windows_in_place = windows_in_place
        self.outside_rows: dict[tuple[str, Rows], relax.Expr] = {}
        """Rows of tensors from outside a spatial chain cut out in the current tile: branches that start from
        the same tensor (an inception module's) read one copy."""
        self.table = {b.var.name: b for b in top_level_bindings(mod["main"])}
        self.branch_at = {b.head: (c, i) for c in choices for i, b in enumerate(c.chain.branches)}
        self.skip = {name for c in choices for name in c.chain.bindings} - set(self.branch_at)
        self.running: dict[Chain, relax.Expr | None] = {}
        self.pieces: dict[Chain, dict[int, relax.Expr]] = {}
        self.left = {c.chain: len(c.chain.branches) for c in choices}
        # a chain module (the chain alone) has its anchor as a parameter: tiles run at the head
        self.anchored = {c.chain.anchor: c for c in choices if c.chain.anchor in self.table}
        self.deferred = {c.chain for c in self.anchored.values()}
        position = {name: i for i, name in enumerate(self.table)}
        self.last_head = {
            c.chain: max((b.head for b in c.chain.branches), key=position.__getitem__)
            for c in choices
            if c.fused and len(c.chain.branches) > 1
        }
        """A branching chain run as one kernel: all its branches run where its last head was (the
        bindings between its heads, which may compute a branch's input, before them)."""
        self.begins: dict[Chain, relax.Var] = {}
        self.markers: list[tuple[relax.Var, relax.Var, int, int]] = []
        """Where the tiles of each chain to run as one kernel begin and end (see :mod:`.outline`)."""

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
        elif entry[0].chain in self.last_head:
            if name != self.last_head[entry[0].chain]:
                return
            for index in range(len(entry[0].chain.branches)):
                self._emit_branch(entry[0], index)
            done = list(entry[0].chain.bindings)
        else:
            self._emit_branch(*entry)
            done = list(entry[0].chain.bindings) if not self.left[entry[0].chain] else []
        while done:  # chains anchored after what has just been bound (an anchor may be in a chain)
            choice = self.anchored.pop(done.pop(), None)
            if choice is not None:
                self._emit_branch(choice, 0)
                done.extend(choice.chain.bindings)

    def _emit_tile_ops(
        self, links: list, current: relax.Expr, previous: relax.Var, parts: int, t: int, branch: Branch
    ) -> relax.Expr:
        """A branch's per-channel operators (and grouped convolutions) on tile ``t``; an operator
        may read several of the branch's tensors (the two paths of a SiLU)."""
        bb = self.builder_
        tiles = {previous: current}
        for link in links:
            value, c_in = link.value, channels(previous)
            lo, hi = branch.tile_ranges(parts, c_in)[t]
            if op_name(value) == CONV:
                groups = int(value.attrs.groups)
                olo, ohi = branch.tile_ranges(parts, channels(link.var))[t]
                new = _conv(value, current, constant_value(value.args[1])[olo:ohi], groups * (hi - lo) // c_in)
            else:
                args = [
                    tiles[a] if a in tiles else _slice_operand(self.visit_expr(a), lo, hi, c_in, bb) for a in value.args
                ]
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
        bb, chain = self.builder_, choice.chain
        branch = chain.branch
        links = [self.table[n] for n in (branch.head, *branch.mids)]
        rows = branch.units
        axis_of: dict[relax.Var, int] = {links[0].var: 1}
        for link in links[1:]:
            axis_of[link.var] = row_axis(link.value, link.var, axis_of, rows)
        pieces = []
        for lo, hi in chain.row_ranges(choice.parts):
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
                if op_name(value) == "relax.reshape":
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
        """Branch ``index`` of the chosen chain, tile by tile."""
        chain = choice.chain
        if choice.fused and self.left[chain] == len(chain.branches):
            self.begins[chain] = marker(self.builder_)
        match chain:
            case RowChain():
                self._emit_rows(choice)
            case SpatialChain():
                self._emit_spatial(choice)
            case ChannelChain():
                self._emit_channel_branch(choice, index)
        self.left[chain] -= 1
        if choice.fused and not self.left[chain]:
            # a line buffer links the tiles of each worker: its runs of tiles are what may run at once
            independent = choice.concurrent_tiles if choice.rolling else choice.parts
            self.markers.append((self.begins[chain], marker(self.builder_), choice.concurrent_tiles, independent))

    def _emit_channel_branch(self, choice: SplitChoice, index: int) -> None:
        """A branch of a channel chain: its tiles, each through the shared operators after a concat
        and into the tail's partial sums (or kept as a piece of the last tensor); after the last
        branch, the chain's result."""
        bb, table = self.builder_, self.table
        chain: ChannelChain = choice.chain
        branch = chain.branches[index]
        tail = table[chain.tail] if chain.tail else None
        post = [table[n] for n in chain.post]
        joined = table[chain.concat] if chain.concat else None
        offset = chain.channel_offset(index)
        head = table[branch.head]
        mids = [table[n] for n in branch.mids]
        last = (mids[-1] if mids else head).var
        source = head.value.args[0]
        head_input = self.visit_expr(source)
        running = self.running.get(chain)
        pieces = self.pieces.setdefault(chain, {})
        for t in range(choice.parts):
            lo, hi = branch.tile_ranges(choice.parts, channels(head.var))[t]
            if branch.pool:
                current = self._emit_pooled_head(head.value, table[branch.pool].value, lo, hi, choice.parts)
            elif op_name(head.value) == CONV:
                current = bb.emit(_conv(head.value, head_input, constant_value(head.value.args[1])[lo:hi], 1))
            else:  # a pool head: its tile of the (whole) input's channels, then the pool
                current = _slice_operand(head_input, lo, hi, channels(source), bb)
                current = self._emit_tile_ops([head], current, source, choice.parts, t, branch)
            current = self._emit_tile_ops(mids, current, head.var, choice.parts, t, branch)
            tlo, thi = branch.tile_ranges(choice.parts, channels(last))[t]
            if joined is not None:
                current = self._emit_joined_ops(
                    post, current, joined.var, offset + tlo, offset + thi, channels(joined.var)
                )
            if tail is not None:
                weight = constant_value(tail.value.args[1])[:, offset + tlo : offset + thi]
                if running is None:
                    running = bb.emit(_conv(tail.value, current, weight, 1))
                else:
                    # One kernel per tile (conv + add of the running sum): FuseOps would otherwise
                    # gather every add into the last tile's kernel and keep all partial sums alive.
                    running = _conv_accumulate(bb, tail.value, current, weight, running)
            else:
                pieces[offset + tlo] = current
        self.running[chain] = running
        if self.left[chain] > 1:
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
        concatenated at the end). With a line buffer (:attr:`SplitChoice.rolling`) an operator computes
        only the rows its previous tile did not hold: the rows its next tile reads again are cut out of
        its buffer after their last reader and placed at the top of the next tile's buffer, below which
        the new rows are written in place."""
        bb, chain = self.builder_, choice.chain
        ops = chain.ops
        last = self.table[ops[-1].name].var
        if choice.rolling:
            plan = chain.rolling_rows(choice.parts, choice.concurrent_tiles)
        else:
            plan = [
                {name: RollingRows(rows, None) for name, rows in need.items()} for need in chain.tile_rows(choice.parts)
            ]
        last_reader = {op.name: i for i, op in enumerate(ops)}
        for i, op in enumerate(ops):
            for name in op.reads:
                last_reader[name] = i
        full, pieces = None, []
        carried: dict[str, relax.Expr] = {}  # rows an operator's previous tile kept for this one
        for t, need in enumerate(plan):
            tiles: dict[str, tuple[relax.Expr, Rows]] = {}
            self.outside_rows = {}
            buffers: dict[str, relax.Expr] = {}  # the line buffer of each tile, int8 under a dequantize
            for i, op in enumerate(ops):
                if op.name in need:
                    buffers[op.name], value = self._emit_spatial_op(
                        op, need[op.name], tiles, carried.pop(op.name, None)
                    )
                    tiles[op.name] = (value, need[op.name].held)
                following = plan[t + 1] if t + 1 < len(plan) else {}
                for name, reader in last_reader.items():
                    rows = following.get(name)
                    if reader == i and name in tiles and rows is not None and rows.kept is not None:
                        buffer, (lo, hi) = buffers[name], tiles[name][1]
                        if rows.kept == (lo, hi):  # the whole buffer is carried over (a full slice is a view)
                            carried[name] = buffer
                            continue
                        kept = (rows.kept[0] - lo, rows.kept[1] - lo)
                        carried[name] = bb.emit(
                            relax.op.strided_slice(buffer, axes=[ROWS], begin=[kept[0]], end=[kept[1]])
                        )
            if chain.gathered:
                pieces.append(tiles[ops[-1].name][0])
            else:
                full = _write_rows(bb, tiles[ops[-1].name][0], full, need[ops[-1].name].held[0], last.ty)
        if chain.gathered:
            full = bb.normalize(relax.op.concat(pieces, axis=ROWS))
        bb.emit_normalized(relax.VarBinding(last, full))

    def _emit_spatial_op(
        self, op, rows: RollingRows, tiles: dict[str, tuple[relax.Expr, Rows]], kept: relax.Expr | None
    ) -> tuple[relax.Expr, relax.Expr]:
        """One operator of a spatial chain on its rows of a tile: the rows it computes, under the rows
        ``kept`` from its previous tile (a line buffer) when there are any. Returns the tile's line buffer
        (the rows a next tile may keep) and its value. A QDQ model's ``dequantize`` keeps int8 rows: its
        buffer is the int8 tile it dequantizes, so ``LowerQDQ`` still finds the integer kernel that reads it
        and the rows kept are int8, as the simulator counts them."""
        bb = self.builder_
        value = self.table[op.name].value
        lo, hi = rows.computed
        if self._dequantized(self.table[op.name].var):
            codes = self._rows_of(value.args[0], (lo, hi), tiles) if lo < hi else None
            buffer = codes if kept is None else self._place_kept(kept, rows, codes, lo)
            if kept is not None and value.args[0].name in tiles:
                # its readers' rows are cut from the int8 buffer and dequantized again (see _rows_of)
                tiles[value.args[0].name] = (buffer, rows.held)
            args = [buffer, *(self.visit_expr(a) for a in value.args[1:])]
            dequantized = bb.emit(relax.Call(value.op, args, value.attrs, value.ty_args))
            return buffer, dequantized
        new = None
        if lo < hi:
            if op.window is None and op_name(value) == CONCAT:
                fields = [self._rows_of(f, (lo, hi), tiles) for f in value.args[0].fields]
                new = bb.emit(relax.op.concat(fields, axis=int(value.attrs.axis)))
            elif op.window is None:
                args = [self._rows_of(a, (lo, hi), tiles) for a in value.args]
                new = bb.emit(relax.Call(value.op, args, value.attrs, value.ty_args))
            else:
                in_rows, top, bottom = op.window.input_rows((lo, hi))
                data = value.args[0]
                if (
                    self.windows_in_place
                    and op.outside
                    and in_rows != (0, op.window.rows_in)
                    and not self._dequantized(data)
                ):
                    # rows of an outside tensor, in place
                    new = _emit_windowed_rows(bb, value, self.visit_expr(data), in_rows, top, bottom)
                else:
                    new = bb.emit(_windowed(value, self._rows_of(data, in_rows, tiles), top, bottom))
        buffer = new if kept is None else self._place_kept(kept, rows, new, lo)
        return buffer, buffer

    def _place_kept(self, kept: relax.Expr, rows: RollingRows, new: relax.Expr | None, lo: int) -> relax.Expr:
        """A line buffer: the rows ``kept`` from the previous tile at its top, the ``new`` rows from ``lo`` below."""
        bb = self.builder_
        shape = list(nchw(kept))
        shape[ROWS] = rows.held[1] - rows.held[0]
        ty = relax.TensorType(shape, str(kept.ty.dtype))
        placer = row_writer(tuple(shape), nchw(kept)[ROWS], 0, str(kept.ty.dtype), foldable=False)
        placer = placer.with_attr(CARRIED_ROWS_ATTR, True)
        buffer = bb.emit(relax.call_tir(bb.add_func(placer, "place_rows"), [kept], out_ty=ty))
        return buffer if new is None else _write_rows(bb, new, buffer, lo - rows.held[0], ty)

    def _rows_of(self, arg: relax.Expr, rows: Rows, tiles: dict[str, tuple[relax.Expr, Rows]]) -> relax.Expr:
        """``rows`` of an operand: of a chain tensor's tile (cut when the tile holds more), of a
        tensor from outside, or the operand whole when it is broadcast along the rows. A dequantized
        tensor's rows are cut from its int8 input and dequantized again, so that ``LowerQDQ`` still
        finds each integer kernel's ``dequantize`` operand (a cut float tensor would stay float)."""
        bb = self.builder_
        outside = not (isinstance(arg, relax.Var) and arg.name in tiles)
        if not outside:
            tile, (lo, _) = tiles[arg.name]
            whole, cut, total = tile, (rows[0] - lo, rows[1] - lo), nchw(tile)[ROWS]
        else:
            whole, shape, cut = self.visit_expr(arg), nchw(arg), rows
            if shape is None or shape[ROWS] == 1:
                return whole
            total = shape[ROWS]
        if cut == (0, total):
            return whole
        if self._dequantized(arg) or self._quantized_input(arg, tiles):
            value = self.table[arg.name].value
            data = self._rows_of(value.args[0], rows, tiles)
            return bb.emit(relax.Call(value.op, [data, *value.args[1:]], value.attrs, value.ty_args))
        if not outside:
            return bb.emit(relax.op.strided_slice(whole, axes=[ROWS], begin=[cut[0]], end=[cut[1]]))
        if (arg.name, cut) not in self.outside_rows:
            sliced = relax.op.strided_slice(whole, axes=[ROWS], begin=[cut[0]], end=[cut[1]])
            self.outside_rows[(arg.name, cut)] = bb.emit(sliced)
        return self.outside_rows[(arg.name, cut)]

    def _dequantized(self, arg: relax.Expr) -> bool:
        """``arg`` is a binding that dequantizes a tensor (a QDQ model's activation)."""
        binding = self.table.get(arg.name) if isinstance(arg, relax.Var) else None
        return binding is not None and op_name(binding.value) == DEQUANTIZE and nchw(binding.value.args[0]) is not None

    def _quantized_input(self, arg: relax.Expr, tiles: dict) -> bool:
        """``arg`` quantizes a float input of the function: its rows are quantized from the input's
        rows (``LowerQDQ`` fuses that quantize into the convolution reading it, as in the whole model)."""
        binding = self.table.get(arg.name) if isinstance(arg, relax.Var) and arg.name not in tiles else None
        if binding is None or op_name(binding.value) != QUANTIZE:
            return False
        data = binding.value.args[0]
        return isinstance(data, relax.Var) and data.name not in self.table and nchw(data) is not None

    def _emit_pooled_head(self, conv: relax.Call, pool: relax.Call, lo: int, hi: int, parts: int) -> relax.Expr:
        """Output channels [lo, hi) of ``conv(pool(x))`` as partial sums over slices of ``x``."""
        bb, source = self.builder_, pool.args[0]
        count = channels(source)
        whole = self.visit_expr(source)
        weight = constant_value(conv.args[1])[lo:hi]
        running = None
        for slo, shi in tile_ranges(parts, count, count):
            sliced = _slice_operand(whole, slo, shi, count, bb)
            pooled = bb.emit(relax.Call(pool.op, [sliced], pool.attrs, pool.ty_args))
            if running is None:
                running = bb.emit(_conv(conv, pooled, weight[:, slo:shi], 1))
            else:
                running = _conv_accumulate(bb, conv, pooled, weight[:, slo:shi], running)
        return running

    def _emit_joined_ops(
        self, post: list, current: relax.Expr, joined: relax.Var, lo: int, hi: int, channels: int
    ) -> relax.Expr:
        """The operators after a concat, on channels [lo, hi) of the joined tensor."""
        bb, previous = self.builder_, joined
        for link in post:
            args = [
                current if a.same_as(previous) else _slice_operand(self.visit_expr(a), lo, hi, channels, bb)
                for a in link.value.args
            ]
            current = bb.emit(relax.Call(link.value.op, args, link.value.attrs, link.value.ty_args))
            previous = link.var
        return current


def _window_padding(value: relax.Call, top: int, bottom: int) -> list[int]:
    """(top, left, bottom, right) padding of a tile of ``value``: ``top`` and ``bottom`` rows; a
    max pool in ceil mode gets explicit right padding, so its columns stay as they were."""
    a = value.attrs
    _, left, _, right = padding(a)
    if op_name(value) in POOLS and bool(a.ceil_mode):
        kernel, stride, dilation = int(a.pool_size[1]), int(a.strides[1]), int(a.dilation[1])
        columns_in, columns_out = nchw(value.args[0])[3], nchw(value)[3]
        right = max(right, (columns_out - 1) * stride - left + dilation * (kernel - 1) + 1 - columns_in)
    return [top, left, bottom, right]


def _windowed(value: relax.Call, data: relax.Expr, top: int, bottom: int) -> relax.Expr:
    """The convolution or pool ``value`` on ``data`` (some of its input rows) with ``top`` and
    ``bottom`` rows of padding."""
    a, padding = value.attrs, _window_padding(value, top, bottom)
    if op_name(value) == CONV:
        return _conv(value, data, value.args[1], int(a.groups), padding)
    pool = relax.op.nn.max_pool2d if op_name(value) == "relax.nn.max_pool2d" else relax.op.nn.avg_pool2d
    return pool(
        data,
        pool_size=[int(x) for x in a.pool_size],
        strides=[int(x) for x in a.strides],
        padding=padding,
        dilation=[int(x) for x in a.dilation],
        ceil_mode=False,
        count_include_pad=bool(a.count_include_pad),
        layout=str(a.layout),
        out_layout=str(a.out_layout),
    )


def _emit_windowed_rows(
    bb: relax.BlockBuilder, value: relax.Call, data: relax.Expr, rows: Rows, top: int, bottom: int
) -> relax.Expr:
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
            return topi.nn.conv(
                cut, weight[0], strides, padding, dilation, int(a.groups), "NCHW", "OIHW", str(value.ty.dtype)
            )
        pool_type = "max" if op_name(value) == "relax.nn.max_pool2d" else "avg"
        return topi.nn.pool2d(
            cut,
            [int(x) for x in a.pool_size],
            strides,
            dilation,
            padding,
            pool_type,
            False,
            "NCHW",
            bool(a.count_include_pad),
        )

    weights = [value.args[1]] if op_name(value) == CONV else []
    return bb.emit_te(compute, data, *weights, primfunc_name_hint=f"{op_name(value).split('.')[-1]}_rows")


@functools.cache  # TVMScript parsing costs tens of ms a call (its inspect.stack); asked again and again
def _row_writer(shape: tuple[int, ...], rows: int, offset: int, dtype: str) -> tvm.tirx.PrimFunc:
    """A kernel copying a ``rows``-row tile into rows ``[offset, offset + rows)`` of a tensor of
    ``shape`` (NCHW, or NCHW[x]c: rows are axis 2 of both): called out of place for the first tile (a
    new tensor), in place for the others. Opaque to fusion (FuseTIR cannot fuse an in-place call with
    the tile's producer); after fusion, :func:`~tvm_memplan.relax.tile_writes.WriteTilesInPlace` makes
    the producer write the rows itself."""
    if len(shape) == 4:
        _, channels, _, columns = shape

        @T.prim_func(private=True, s_tir=True)
        def write_rows(tile: T.Buffer((1, channels, rows, columns), dtype), full: T.Buffer(shape, dtype)):
            for c, h, w in T.grid(channels, rows, columns):
                with T.sblock("write"):
                    vc, vh, vw = T.axis.remap("SSS", [c, h, w])
                    full[0, vc, vh + offset, vw] = tile[0, vc, vh, vw]

    else:
        _, chunks, _, columns, lanes = shape

        @T.prim_func(private=True, s_tir=True)
        def write_rows(tile: T.Buffer((1, chunks, rows, columns, lanes), dtype), full: T.Buffer(shape, dtype)):
            for c, h, w, i in T.grid(chunks, rows, columns, lanes):
                with T.sblock("write"):
                    vc, vh, vw, vi = T.axis.remap("SSSS", [c, h, w, i])
                    full[0, vc, vh + offset, vw, vi] = tile[0, vc, vh, vw, vi]

    return (
        write_rows.with_attr("op_pattern", 8)
        .with_attr("tirx.noalias", True)
        .with_attr(ROW_OFFSET_ATTR, offset)
        .with_attr(ROW_WRITER_ATTR, offset)
    )


def row_writer(shape: tuple[int, ...], rows: int, offset: int, dtype: str, foldable: bool = True) -> tvm.tirx.PrimFunc:
    """:func:`_row_writer`; without its :data:`ROW_OFFSET_ATTR` when not ``foldable`` (a line buffer's
    placed rows, which no producer writes in place)."""
    writer = _row_writer(tuple(shape), rows, offset, dtype)
    return writer if foldable else writer.without_attr(ROW_OFFSET_ATTR)


def _write_rows(
    bb: relax.BlockBuilder, tile: relax.Expr, full: relax.Expr | None, offset: int, ty: relax.TensorType
) -> relax.Expr:
    """``tile`` copied into its rows of the chain's last tensor (``full``: the tensor so far)."""
    shape, dtype = tuple(static_shape(ty)), str(ty.dtype)
    gvar = bb.add_func(_row_writer(shape, nchw(tile)[ROWS], offset, dtype), "write_rows")
    if full is None:
        return bb.emit(relax.call_tir(gvar, [tile], out_ty=ty))
    return bb.emit(relax.call_tir_inplace(gvar, [tile, full], [1], ty))


_WINDOWS_IN_PLACE = contextvars.ContextVar("tvm_memplan_windows_in_place", default=True)


@contextlib.contextmanager
def windows_in_place(value: bool) -> Iterator[None]:
    """:func:`split_chains` called without ``windows_in_place`` inside the ``with`` block takes ``value``
    (the planner sets it from the layout it plans in: a rewrite hook does not know it)."""
    token = _WINDOWS_IN_PLACE.set(value)
    try:
        yield
    finally:
        _WINDOWS_IN_PLACE.reset(token)


def split_chains(mod: tvm.IRModule, choices: list[SplitChoice], windows_in_place: bool | None = None) -> tvm.IRModule:
    """A copy of the normalized ``mod`` with every chosen chain split into its parts.

    ``windows_in_place``: a convolution or pool of a spatial chain reads its rows of a tensor from
    outside the chain in place (one NCHW kernel); without, through a ``strided_slice`` of the rows,
    which the blocked layout pass (:func:`~tvm_memplan.relax.layout.BlockedLayout`) carries into
    NCHW[x]c as it does the operator. None: as :func:`windows_in_place` says (by default, in place)."""
    if not choices:
        return mod
    if not disjoint([c.chain for c in choices]):
        raise ValueError("a chosen chain overlaps another chosen chain")
    if any(c.fused and not c.chain.fusable for c in choices):
        raise ValueError("a chain chosen to run as one kernel cannot (see Chain.fusable)")
    mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    in_place = _WINDOWS_IN_PLACE.get() if windows_in_place is None else windows_in_place
    rewriter = _SplitRewriter(mod, choices, in_place)
    func = rewriter.visit_expr(mod["main"])
    func = outline_marked(func, rewriter.markers, rewriter.builder_)
    rewriter.builder_.update_func(mod.get_global_var("main"), func)
    return relax.transform.DeadCodeElimination()(rewriter.builder_.finalize())
