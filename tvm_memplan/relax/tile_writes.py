"""Row tiles written straight into their rows of the full tensor.

The split rewriter ends each tile of a spatial chain with a copy of the tile into its rows of the
chain's last tensor (``write_rows``, called in place), because before fusion the tile's last kernel
does not exist yet. After ``FuseTIR`` it does: :func:`WriteTilesInPlace` gives that kernel the full
tensor as its output, every access of its tile moved down to the tile's rows, calls it in place and
drops the copy. The planner never allocates the tile: one kernel and one tile buffer less per tile.
(A ``match_buffer`` view of the rows would be shorter, but TVM's ``cache_write`` cannot schedule a
block that writes one.)
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, te, tirx
from tvm.ir import Range
from tvm.ir.expr import TensorLoad, TensorRegion
from tvm.tirx import buffer as tir_buffer

from ..quant.mcu_kernels import is_layer_call, layer_written_into_rows, placed_rows
from .module import relax_functions, with_blocks, with_functions

ROW_OFFSET_ATTR = "tvm_memplan.row_offset"
"""Marks a ``write_rows`` copy kernel: the first row of the full tensor the tile is copied to."""
CARRIED_ROWS_ATTR = "tvm_memplan.carried_rows"
"""Marks a line buffer's ``place_rows`` kernel: its input is the rows a tile kept from the tile before,
so it is the one link between two tiles of a run (:func:`~tvm_memplan.relax.tile_kernels.merge_chain`
cuts the run into its tiles there)."""

ROW_WRITER_ATTR = "tvm_memplan.row_writer"
"""Marks every kernel of the split rewriter that copies a tile into rows of a larger tensor (the
``write_rows`` copies and a line buffer's placed rows): the first row it writes."""

ACCUMULATE_ATTR = "tvm_memplan.conv_accumulate"
"""Marks the split rewriter's partial-sum kernel ``conv2d(data, weight) + running`` (a channel tile of
a convolution): its strides, padding and dilation."""

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
_CALL_TIR_INPLACE = tvm.ir.Op.get("relax.call_tir_inplace")


def written_into_rows(func: tirx.PrimFunc, full_shape: tuple[int, ...], offset: int) -> tirx.PrimFunc | None:
    """``func`` (whose last parameter is its ``(1, C, rows, W)`` or ``(1, C/x, rows, W, x)`` output) writing rows
    ``[offset, offset + rows)`` of a ``full_shape`` tensor passed in its place (every access of the
    output moved down by ``offset`` rows), or None when its output is not such a tile."""
    *_, out = func.params
    ty = out.ty
    shape = [int(d) for d in ty.shape] if all(isinstance(d, tirx.IntImm) for d in ty.shape) else None
    if (
        shape is None
        or len(shape) not in (4, 5)  # NCHW or NCHW[x]c: rows are axis 2 of both
        or len(full_shape) != len(shape)
        or shape[0] != 1
        or any(shape[axis] != full_shape[axis] for axis in range(1, len(shape)) if axis != 2)
        or offset + shape[2] > full_shape[2]
        or ty.strides
    ):
        return None
    full_ty = tir_buffer._ffi_api.BufferType(  # noqa: SLF001 - the output's type with the full tensor's shape
        ty.storage_scope,
        ty.dtype,
        [tirx.IntImm(ty.shape[0].ty, d) for d in full_shape],
        ty.strides,
        ty.elem_offset,
        ty.data_alignment,
        ty.offset_factor,
        ty.layout,
        ty.allocated_addr,
        None,
    )
    full = tir_buffer._ffi_api.BufferVar(out.name, full_ty, None)  # noqa: SLF001
    if is_layer_call(func):  # a C kernel writes through the raw pointer: its pointer and plane stride move
        return layer_written_into_rows(func, full, offset)

    def shifted(indices) -> list:
        indices = list(indices)
        indices[2] = indices[2] + tirx.IntImm(indices[2].ty, offset)
        return indices

    def store(node: tirx.BufferStore, mutator: tvm_ffi.StructuralMutator):
        node = mutator.default_mutate(node)
        return tirx.BufferStore(full, node.value, shifted(node.indices)) if node.buffer.same_as(out) else node

    def load(node: TensorLoad, mutator: tvm_ffi.StructuralMutator):
        node = mutator.default_mutate(node)
        return tirx.BufferLoad(full, shifted(node.indices)) if node.source.same_as(out) else node

    def region(node: TensorRegion, mutator: tvm_ffi.StructuralMutator):
        node = mutator.default_mutate(node)
        if not node.source.same_as(out):
            return node
        ranges = list(node.region)
        ranges[2] = Range.from_min_extent(ranges[2].min + tirx.IntImm(ranges[2].min.ty, offset), ranges[2].extent)
        return tirx.BufferRegion(full, ranges)

    def param(var: tvm.ir.Var, mutator: tvm_ffi.StructuralMutator):
        return full if var.same_as(out) else mutator.default_mutate(var)

    func = tvm_ffi.structural_mutate(func, ((tirx.BufferStore, store), (TensorLoad, load), (TensorRegion, region)))
    func = tvm_ffi.structural_mutate(func, ((tvm.ir.Var, param),))
    return tirx.PrimFunc(func.params, func.body, func.ret_type, func.attrs)  # its type from the new parameters


def WriteTilesInPlace() -> tvm.transform.Pass:  # noqa: N802 - named like TVM's passes
    """Fuse each ``write_rows`` copy into the kernel that produced its tile (see the module docstring).
    A tile read by anything else, or made by a kernel whose output is not a plain tile, keeps its copy."""

    @tvm.transform.module_pass(opt_level=0, name="tvm_memplan.WriteTilesInPlace")
    def _pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        builder = relax.BlockBuilder(mod)  # adds the new kernels with their types (and shares equal ones)
        updates = {}
        for gvar, func in relax_functions(mod):
            blocks = [_rewrite_block(block, mod, builder) for block in func.body.blocks]
            if any(new is not old for new, old in zip(blocks, func.body.blocks, strict=True)):
                updates[gvar] = with_blocks(func, blocks)
        if not updates:
            return mod
        functions = dict(builder.get().functions)
        for gvar, func in updates.items():
            functions[gvar] = func
        used = _called(functions)
        kept = {g: f for g, f in functions.items() if not isinstance(f, tirx.PrimFunc) or g.name_hint in used}
        return tvm.IRModule(kept, attrs=mod.attrs)

    return _pass


def _row_offset(call: relax.Expr, mod: tvm.IRModule) -> int | None:
    if not isinstance(call, relax.Call) or not (call.op.same_as(_CALL_TIR) or call.op.same_as(_CALL_TIR_INPLACE)):
        return None
    func = mod[call.args[0]]
    offset = func.attrs.get(ROW_OFFSET_ATTR) if isinstance(func, tirx.PrimFunc) and func.attrs is not None else None
    return int(offset) if offset is not None else None


def _rewrite_block(block: relax.BindingBlock, mod: tvm.IRModule, builder: relax.BlockBuilder) -> relax.BindingBlock:
    bindings = list(block.bindings)
    uses: dict[relax.Var, int] = {}
    for b in bindings:
        for var in relax.analysis.free_vars(b.value):
            uses[var] = uses.get(var, 0) + 1
    producer = {b.var: i for i, b in enumerate(bindings)}
    drop: set[int] = set()
    replace: dict[int, relax.VarBinding] = {}
    for i, b in enumerate(bindings):
        offset = _row_offset(b.value, mod)
        if offset is None:
            continue
        tile, *full = b.value.args[1].fields
        j = producer.get(tile)
        if j is None or uses.get(tile) != 1 or not isinstance(bindings[j].value, relax.Call):
            continue
        made = bindings[j].value
        if not made.op.same_as(_CALL_TIR) or not isinstance(mod[made.args[0]], tirx.PrimFunc):
            continue
        shape = [int(d) for d in b.var.ty.shape.values]
        kernel = written_into_rows(mod[made.args[0]], tuple(shape), offset)
        if kernel is None:
            continue
        new_gvar = builder.add_func(kernel, f"{made.args[0].name_hint}_rows")
        args = list(made.args[1].fields)
        if full:
            value = relax.call_tir_inplace(new_gvar, args + full, [len(args)], b.var.ty)
        else:
            value = relax.call_tir(new_gvar, args, out_ty=b.var.ty)
        drop.add(j)
        replace[i] = relax.VarBinding(b.var, value)
    if not replace:
        return block
    new = [replace.get(i, b) for i, b in enumerate(bindings) if i not in drop]
    kind = relax.DataflowBlock if isinstance(block, relax.DataflowBlock) else relax.BindingBlock
    return kind(new)


def _called(functions: dict) -> set[str]:
    names: set[str] = set()
    for func in functions.values():
        if isinstance(func, relax.Function):
            tvm_ffi.structural_walk(
                func, lambda n: names.add(n.name_hint) if isinstance(n, tvm.ir.GlobalVar) else None, order="pre"
            )
    return names


@tvm.transform.module_pass(opt_level=0, name="PlaceRowsByCopies")
class PlaceRowsByCopies:
    """On a Cortex-M with the DSP extension (``build --target cortex-m7 --emit-c``), the ``place_rows`` kernel of an
    int8 line buffer (:data:`CARRIED_ROWS_ATTR`: a row tile's kept rows placed at the top of
    the next tile's buffer) as one call of :data:`~tvm_memplan.quant.mcu_kernels.ROW_PLACE_KERNEL`, whole rows
    a word or four at a time: TVM's loop moves a byte per step (10.6 M of MobileNetV2-1.0's 353 M
    instructions with its first chain in 32 row tiles)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        placed = {}
        for gvar, func in mod.functions.items():
            if not isinstance(func, tirx.PrimFunc) or func.attrs is None or CARRIED_ROWS_ATTR not in func.attrs:
                continue
            kept, full = (p.ty for p in func.params)
            if str(kept.dtype) not in ("int8", "uint8") or len(kept.shape) != 4 or int(kept.shape[0]) != 1:
                continue
            x = te.placeholder([int(d) for d in kept.shape], str(kept.dtype), "kept")
            kernel = te.create_prim_func([x, placed_rows(x, int(full.shape[2]))]).without_attr("global_symbol")
            for key, value in func.attrs.items():
                kernel = kernel.with_attr(key, value)
            placed[gvar] = kernel
        return with_functions(mod, placed)
