"""Tensors at arena offsets on devices without host pointer arithmetic (OpenCL, Vulkan).

On the CPU and CUDA a tensor at a byte offset costs nothing: ``ensure_zero_offset`` moves the
offset into the data pointer. OpenCL and Vulkan hand kernels an opaque buffer handle, so there it
copies the tensor out of the arena: the kernels then write the copy, bytes the plan shares by design
(in-place kernels, concats written in place) diverge, and the device holds more than the plan.
Instead, :func:`KernelOffsetParams` gives every kernel buffer a symbolic ``elem_offset``
(``offset_factor=1``), which TVM passes to the device kernel as a parameter and adds to its indices,
and the arena rewrite leaves those tensors at their offsets (:func:`offset_tensors`).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.tirx import buffer as tir_buffer

from .extract import top_level_bindings

OFFSET_KINDS = ("opencl", "vulkan")
"""Target kinds whose devices cannot offset a buffer on the host."""

_VIEWS = (tvm.ir.Op.get("relax.reshape"), tvm.ir.Op.get("relax.memory.view"))


def kernels_take_offsets(target: tvm.target.Target | None) -> bool:
    """Whether kernels built for ``target`` read their buffers at an ``elem_offset`` parameter."""
    return target is not None and target.kind.name in OFFSET_KINDS


def with_offset_params(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each buffer parameter of constant ``elem_offset`` given a symbolic one."""
    replaced = {}
    for param in func.params:
        if not tir_buffer.is_buffer_var(param) or not isinstance(param.ty.elem_offset, tirx.IntImm):
            continue
        ty = param.ty
        offset = tirx.Var(f"{param.name}_elem_offset", ty.shape[0].ty if ty.shape else "int32")
        new_ty = tir_buffer._ffi_api.BufferType(  # noqa: SLF001 - decl_buffer would make a new layout: keep every other field
            ty.storage_scope, ty.dtype, ty.shape, ty.strides, offset, ty.data_alignment, 1, ty.layout,
            ty.allocated_addr, None,
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
