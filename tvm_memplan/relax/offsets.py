"""Tensors at arena offsets on devices without host pointer arithmetic (OpenCL, Vulkan).

On the CPU and CUDA a tensor at a byte offset costs nothing: ``ensure_zero_offset`` moves the
offset into the data pointer. OpenCL and Vulkan hand kernels an opaque buffer handle, so there it
copies the tensor out of the arena: the kernels then write the copy, bytes the plan shares by design
(in-place kernels, concats written in place) diverge, and the device holds more than the plan.
Instead, :func:`KernelOffsetParams` gives every kernel buffer a symbolic ``elem_offset``
(``offset_factor=1``), which TVM passes to the device kernel as a parameter and adds to its indices,
and the arena rewrite leaves those tensors at their offsets (:func:`offset_tensors`).

On Vulkan each such offset is an 8-byte push constant, and 128 bytes hold 16 of them; TVM's runtime
passes more in a uniform buffer that every launch still queued shares. :func:`BakeKernelOffsets`
keeps kernels within the limit: one that would take more scalars (a DenseNet concat of 20 feature
maps) gets, at each call site, a copy with the offsets that site passes as constants. The arena
stays as planned, and the host still checks each tensor's byte offset against the constant.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.tirx import buffer as tir_buffer

from .ir_utils import top_level_bindings
from .module import referenced_globals, relax_functions, with_blocks

OFFSET_KINDS = ("opencl", "vulkan")
"""Target kinds whose devices cannot offset a buffer on the host."""

_RESHAPE = tvm.ir.Op.get("relax.reshape")
_VIEW = tvm.ir.Op.get("relax.memory.view")
_VIEWS = (_RESHAPE, _VIEW)
_ARENA_ALLOC = tvm.ir.Op.get("relax.memory.alloc_tensor")
_AT_ZERO = (tvm.ir.Op.get("relax.builtin.alloc_tensor"), tvm.ir.Op.get("relax.memory.ensure_zero_offset"))
"""Calls whose tensor starts at byte offset 0."""


def kernels_take_offsets(target: tvm.target.Target | None) -> bool:
    """Whether kernels built for ``target`` read their buffers at an ``elem_offset`` parameter."""
    return target is not None and target.kind.name in OFFSET_KINDS


def with_offset_params(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each buffer parameter of constant ``elem_offset`` given a symbolic one."""
    return with_elem_offsets(
        func,
        {
            param: tirx.Var(f"{param.name}_elem_offset", param.ty.shape[0].ty if param.ty.shape else "int32")
            for param in func.params
            if tir_buffer.is_buffer_var(param) and isinstance(param.ty.elem_offset, tirx.IntImm)
        },
    )


def with_elem_offsets(func: tirx.PrimFunc, offsets: dict[tvm.ir.Var, tirx.PrimExpr]) -> tirx.PrimFunc:
    """``func`` with the ``elem_offset`` of each buffer parameter in ``offsets`` replaced."""
    replaced = {}
    for param, offset in offsets.items():
        ty = param.ty
        new_ty = tir_buffer._ffi_api.BufferType(  # noqa: SLF001 - decl_buffer would make a new layout: keep every other field
            ty.storage_scope,
            ty.dtype,
            ty.shape,
            ty.strides,
            offset,
            ty.data_alignment,
            1,
            ty.layout,
            ty.allocated_addr,
            None,
        )
        replaced[param] = tir_buffer._ffi_api.BufferVar(param.name, new_ty, None)  # noqa: SLF001
    if not replaced:
        return func

    def swap(var: tvm.ir.Var, mutator: tvm_ffi.StructuralMutator) -> tvm.ir.Var:
        new = next((n for old, n in replaced.items() if var.same_as(old)), None)
        return new if new is not None else mutator.default_mutate(var)

    return tvm_ffi.structural_mutate(func, (tvm.ir.Var, swap))


def KernelOffsetParams() -> tvm.transform.Pass:  # noqa: N802 - named like TVM's passes
    """Every PrimFunc of the module takes its buffers at an ``elem_offset`` (see the module docstring)."""

    @tvm.transform.module_pass(opt_level=0, name="tvm_memplan.KernelOffsetParams")
    def _pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        functions = dict(mod.functions)
        for gvar, func in mod.functions.items():
            if isinstance(func, tirx.PrimFunc):
                functions[gvar] = with_offset_params(func)
        return tvm.IRModule(functions, attrs=mod.attrs)  # never mutate the caller's module

    return _pass


def offset_tensors(func: relax.Function, mod: tvm.IRModule) -> set[relax.Var]:
    """The variables every use of which is a PrimFunc argument, directly or through views (plain
    aliases, reshape, memory.view): with :func:`KernelOffsetParams` they need no zero offset.
    Anything else (a packed function, an output, control flow) gets ``ensure_zero_offset``."""
    users: dict[relax.Var, list[relax.VarBinding]] = {}
    for binding in top_level_bindings(func):
        for var in relax.analysis.free_vars(binding.value):
            users.setdefault(var, []).append(binding)
    returned = set(relax.analysis.free_vars(func.body.body))
    safe: dict[relax.Var, bool] = {}

    def is_safe(var: relax.Var) -> bool:
        if var not in safe:  # bindings define each variable once, before its uses: no cycles
            safe[var] = var not in returned and all(_kernel_use(b, var, mod, is_safe) for b in users.get(var, []))
        return safe[var]

    return {var for var in users if is_safe(var)}


def _kernel_use(binding: relax.VarBinding, var: relax.Var, mod: tvm.IRModule, is_safe) -> bool:
    value = binding.value
    if isinstance(value, relax.Var):
        return is_safe(binding.var)
    if not isinstance(value, relax.Call):
        return False
    if isinstance(value.op, tvm.ir.GlobalVar):
        return value.op in mod and isinstance(mod[value.op], tirx.PrimFunc)
    if any(value.op.same_as(view) for view in _VIEWS):
        return value.args[0].same_as(var) and is_safe(binding.var)
    return False


def scalar_params(func: tirx.PrimFunc) -> int:
    """How many scalars the device kernels of ``func`` take at most: its scalar parameters and the
    symbolic offsets, shapes and strides of its buffers."""
    scalars: set[tvm.ir.Var] = set()
    for param in func.params:
        if not tir_buffer.is_buffer_var(param):
            scalars.add(param)
            continue
        ty = param.ty
        for expr in [ty.elem_offset, *ty.shape, *ty.strides]:
            scalars.update(tirx.analysis.undefined_vars(expr))
    return len(scalars)


def static_byte_offsets(func: relax.Function) -> dict[relax.Var, int]:
    """The byte offset of every tensor of ``func`` whose offset is known when it is built: arena
    tensors (``R.memory.alloc_tensor`` at a constant), tensors at offset 0 (``R.builtin.alloc_tensor``,
    ``ensure_zero_offset``, constants) and views of those (aliases, reshape, memory.view)."""
    offsets: dict[relax.Var, int] = {}
    for binding in top_level_bindings(func):
        value = binding.value
        offset = None
        if isinstance(value, relax.Var):
            offset = byte_offset(value, offsets)
        elif isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
            if value.op.same_as(_ARENA_ALLOC) and isinstance(value.args[1], tirx.IntImm):
                offset = int(value.args[1].value)
            elif any(value.op.same_as(op) for op in _AT_ZERO):
                offset = 0
            elif value.op.same_as(_RESHAPE):
                offset = byte_offset(value.args[0], offsets)
            elif value.op.same_as(_VIEW) and byte_offset(value.args[0], offsets) is not None:
                relative = value.args[3]
                if isinstance(relative, tirx.IntImm):
                    offset = byte_offset(value.args[0], offsets) + int(relative.value)
                elif isinstance(relative, relax.Tuple) and not relative.fields:  # no relative offset given
                    offset = byte_offset(value.args[0], offsets)
        if offset is not None:
            offsets[binding.var] = offset
    return offsets


def byte_offset(expr: relax.Expr, offsets: dict[relax.Var, int]) -> int | None:
    """The byte offset of an argument, given :func:`static_byte_offsets`; None where unknown."""
    if isinstance(expr, tvm.ir.GenericConst):
        return 0
    return offsets.get(expr) if isinstance(expr, relax.Var) else None


def _baked(func: tirx.PrimFunc, args: list[relax.Expr], offsets: dict[relax.Var, int]) -> dict[int, int]:
    """Parameter index -> constant elem_offset, for each symbolic offset whose argument's byte offset is known."""
    baked = {}
    for index, (param, arg) in enumerate(zip(func.params, args, strict=True)):
        if not tir_buffer.is_buffer_var(param) or not isinstance(param.ty.elem_offset, tirx.Var):
            continue
        dtype = tvm_ffi.dtype(str(param.dtype))
        offset, element_bytes = byte_offset(arg, offsets), dtype.bits * dtype.lanes // 8
        if offset is not None and element_bytes and offset % element_bytes == 0:
            baked[index] = offset // element_bytes
    return baked


def BakeKernelOffsets(max_scalars: int) -> tvm.transform.Pass:  # noqa: N802 - named like TVM's passes
    """Each call of a PrimFunc that takes more than ``max_scalars`` scalars (:func:`scalar_params`)
    calls a copy with the offsets that call passes as constants (one copy per distinct set of
    offsets); the original is dropped once no call uses it. Runs after :func:`KernelOffsetParams`
    and after planning, when arena offsets are constants; offsets it cannot see stay parameters."""

    @tvm.transform.module_pass(opt_level=0, name="tvm_memplan.BakeKernelOffsets")
    def _pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        over = {
            gvar.name_hint
            for gvar, func in mod.functions.items()
            if isinstance(func, tirx.PrimFunc) and scalar_params(func) > max_scalars
        }
        if not over:
            return mod
        functions = dict(mod.functions)
        taken = {gvar.name_hint for gvar in functions}
        copies: dict[tuple[str, tuple[tuple[int, int], ...]], tvm.ir.GlobalVar] = {}

        def copy_of(gvar: tvm.ir.GlobalVar, baked: dict[int, int]) -> tvm.ir.GlobalVar:
            key = (gvar.name_hint, tuple(sorted(baked.items())))
            if key not in copies:
                func = mod[gvar]
                name = next(
                    f"{gvar.name_hint}_at{i}" for i in range(len(taken) + 1) if f"{gvar.name_hint}_at{i}" not in taken
                )
                taken.add(name)
                params = list(func.params)
                offsets = {params[i]: tirx.IntImm(params[i].ty.elem_offset.ty, value) for i, value in baked.items()}
                copy = with_elem_offsets(func, offsets)
                if copy.attrs is not None and "global_symbol" in copy.attrs:
                    copy = copy.with_attr("global_symbol", name)
                copies[key] = relax.BlockBuilder().add_func(copy, name)  # a GlobalVar typed as Relax calls need
                functions[copies[key]] = copy
            return copies[key]

        for gvar, func in relax_functions(mod):
            offsets = static_byte_offsets(func)
            blocks, changed = [], False
            for block in func.body.blocks:
                bindings = []
                for binding in block.bindings:
                    value = binding.value
                    if (
                        isinstance(value, relax.Call)
                        and isinstance(value.op, tvm.ir.GlobalVar)
                        and value.op.name_hint in over
                    ):
                        baked = _baked(mod[value.op], list(value.args), offsets)
                        if baked:
                            call = relax.Call(copy_of(value.op, baked), value.args, value.attrs, value.ty_args)
                            binding, changed = relax.VarBinding(binding.var, call), True
                    bindings.append(binding)
                blocks.append(type(block)(bindings))
            if changed:
                functions[gvar] = with_blocks(func, blocks)
        used = referenced_globals(tvm.IRModule(functions))
        return tvm.IRModule(
            {g: f for g, f in functions.items() if g.name_hint not in over or g.name_hint in used}, attrs=mod.attrs
        )

    return _pass
