"""Model inputs and outputs as tensors of the arena, as TensorFlow Lite Micro's ``interpreter.input(i)``
and ``output(i)`` are: the caller writes the input into the arena and reads the output from it, so
neither is a buffer on top of the arena, and the input's bytes are reused once its last reader ran.

:func:`with_io_tensors` puts a copy kernel (marked :data:`IO_COPY_ATTR`, opaque to fusion) after each
parameter of ``main`` and before each tensor it returns. The planner then places the copied input and
the output's source like any other tensor, with their real lifetimes; the standalone C leaves the
copies out (:func:`io_copies` names them) and points ``<name>_input(i)`` and ``<name>_output(i)`` at
those tensors. The VM runs the copies, so the module computes what it computed before.
"""

from __future__ import annotations

import tvm
from tvm import relax, te, tirx

from ..errors import UserError

IO_COPY_ATTR = "tvm_memplan.io_copy"
"""Marks the copy kernel of a model input (``input<i>``) or output (``output<i>``)."""


def _copy_kernel(ty: relax.TensorType, role: str) -> tirx.PrimFunc:
    shape = [int(d) for d in ty.shape.values]
    source = te.placeholder(shape, str(ty.dtype), "source")
    copy = te.compute(shape, lambda *i: source(*i), name="copy")
    func = te.create_prim_func([source, copy]).without_attr("global_symbol")
    return func.with_attr("op_pattern", 8).with_attr(IO_COPY_ATTR, role)


def _static_tensor(ty: relax.Type, what: str) -> relax.TensorType:
    if (
        not isinstance(ty, relax.TensorType)
        or ty.shape is None
        or not all(isinstance(d, tirx.IntImm) for d in getattr(ty.shape, "values", [None]))
    ):
        raise UserError(f"{what} is not a tensor of static shape: it cannot live in the arena")
    return ty


def with_io_tensors(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with ``main``'s inputs copied into new tensors first and its outputs copied last (see the
    module docstring). A parameter becomes the copy's result, so every reader reads the copy."""
    func = mod["main"]
    builder = relax.BlockBuilder(mod)
    params, copies = [], []
    for index, param in enumerate(func.params):
        ty = _static_tensor(param.ty, f"input {param.name}")
        fresh = relax.Var(param.name, ty)
        kernel = builder.add_func(_copy_kernel(ty, f"input{index}"), f"io_copy_input{index}")
        params.append(fresh)
        copies.append(relax.VarBinding(param, relax.call_tir(kernel, [fresh], out_ty=ty)))
    body = func.body
    returned = list(body.body.fields) if isinstance(body.body, relax.Tuple) else [body.body]
    outputs, finals = [], []
    for index, value in enumerate(returned):
        ty = _static_tensor(value.ty, f"output {index}")
        kernel = builder.add_func(_copy_kernel(ty, f"output{index}"), f"io_copy_output{index}")
        out = relax.Var(f"output{index}", ty)
        finals.append(relax.VarBinding(out, relax.call_tir(kernel, [value], out_ty=ty)))
        outputs.append(out)
    # blocks of their own, outside the dataflow blocks: there RewriteDataflowReshape would make a copy a view
    blocks = [relax.BindingBlock(copies), *body.blocks, relax.BindingBlock(finals)]
    result = relax.Tuple(outputs) if isinstance(body.body, relax.Tuple) else outputs[0]
    new_main = relax.Function(params, relax.SeqExpr(blocks, result), func.ret_ty, func.is_pure, func.attrs, func.span)
    new_mod = builder.get()
    new_mod["main"] = new_main
    return new_mod


def io_copies(mod: tvm.IRModule) -> dict[str, str]:
    """Kernel name -> ``input<i>`` or ``output<i>`` for the copy kernels :func:`with_io_tensors` added."""
    found = {}
    for gvar, func in mod.functions.items():
        role = func.attrs.get(IO_COPY_ATTR) if isinstance(func, tirx.PrimFunc) and func.attrs is not None else None
        if role is not None:
            found[gvar.name_hint] = str(role)
    return found
