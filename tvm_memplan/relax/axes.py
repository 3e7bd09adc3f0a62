"""TIR → the splitter's loop-nest model (:mod:`tvm_memplan.split.graph`).

Every ``call_tir`` of a legalized module becomes a :class:`~tvm_memplan.split.graph.Kernel`: its
blocks' iterators (spatial or reduction, from the block's ``iter_type``) and the index of every
buffer access, parsed into affine expressions where it is one (``None`` where it is not). This is
all the analyser needs from TVM; the axis connection graph itself is TVM-free.
"""

from __future__ import annotations

import tvm
from tvm import relax, s_tir, tirx

from ..split.graph import Access, Affine, AxisKind, Block, Graph, Kernel, LoopAxis, Tensor, TensorRole, View
from .ir_utils import static_shape, top_level_bindings


def affine(expr: tirx.PrimExpr, axes: set[str]) -> Affine | None:
    """``expr`` as ``const + sum(coeff * axis)`` over the named iterators, with ``axis // divisor`` terms
    (a grouped convolution's group), or None."""
    if isinstance(expr, tirx.IntImm):
        return Affine((), int(expr.value))
    if isinstance(expr, tirx.Var):
        return Affine(((expr.name, 1),)) if expr.name in axes else None
    if isinstance(expr, tirx.Cast):
        return affine(expr.value, axes)
    if isinstance(expr, tirx.FloorDiv):
        a, b = affine(expr.a, axes), affine(expr.b, axes)
        if a is None or b is None or b.terms or b.quotients or b.const <= 0:
            return None
        if b.const == 1:
            return a
        axis = a.single_axis()
        if axis is None or a.const:
            return None
        return Affine((), 0, ((axis, b.const, 1),))
    if isinstance(expr, (tirx.Add, tirx.Sub)):
        a, b = affine(expr.a, axes), affine(expr.b, axes)
        if a is None or b is None:
            return None
        sign = 1 if isinstance(expr, tirx.Add) else -1
        terms = dict(a.terms)
        for name, coeff in b.terms:
            terms[name] = terms.get(name, 0) + sign * coeff
        quotients = {(n, d): c for n, d, c in a.quotients}
        for name, divisor, coeff in b.quotients:
            quotients[(name, divisor)] = quotients.get((name, divisor), 0) + sign * coeff
        return Affine(
            tuple((n, c) for n, c in terms.items() if c),
            a.const + sign * b.const,
            tuple((n, d, c) for (n, d), c in quotients.items() if c),
        )
    if isinstance(expr, tirx.Mul):
        a, b = affine(expr.a, axes), affine(expr.b, axes)
        if a is None or b is None:
            return None
        if not (a.terms or a.quotients):
            a, b = b, a
        if b.terms or b.quotients:
            return None
        k = b.const
        return Affine(
            tuple((n, c * k) for n, c in a.terms if c * k),
            a.const * k,
            tuple((n, d, c * k) for n, d, c in a.quotients if c * k),
        )
    return None


def _blocks(sch: s_tir.Schedule, parent) -> list:
    found = []
    for child in sch.get_child_blocks(parent):
        found.append(sch.get(child))
        found.extend(_blocks(sch, child))
    return found


def _access(region, axes: set[str]) -> Access:
    return Access(region.source.name, tuple(affine(rng.min, axes) for rng in region.region))


def kernel_model(name: str, func: tirx.PrimFunc, args: tuple[str, ...]) -> Kernel:
    """The loop-nest model of one PrimFunc called with graph tensors ``args`` (output last)."""
    sch = s_tir.Schedule(func)
    blocks = []
    buffers = {p.name: tuple(int(d) for d in p.shape) for p in func.params}
    for block in _blocks(sch, sch.get_sblock("root")):
        for buf in block.alloc_buffers:
            buffers[buf.name] = tuple(int(d) for d in buf.shape)
        if not block.writes:
            continue
        names = {iv.var.name for iv in block.iter_vars}
        axes = tuple(
            LoopAxis(
                iv.var.name, AxisKind.SPATIAL if int(iv.iter_type) == 0 else AxisKind.REDUCTION, int(iv.dom.extent)
            )
            for iv in block.iter_vars
        )
        blocks.append(
            Block(block.name_hint, axes, _access(block.writes[0], names), tuple(_access(r, names) for r in block.reads))
        )
    for block in _blocks(sch, sch.get_sblock("root")):
        for region in (*block.reads, *block.writes):
            buffers.setdefault(region.source.name, tuple(int(d) for d in region.source.shape))
    return Kernel(
        name,
        str(func.attrs["global_symbol"]) if func.attrs and "global_symbol" in func.attrs else name,
        tuple(p.name for p in func.params),
        args,
        buffers,
        tuple(blocks),
    )


def graph_model(mod: tvm.IRModule, function: str = "main") -> Graph:
    """The kernels of ``function`` (every ``call_tir`` in program order), its tensors and views."""
    func = mod[function]
    tensors: dict[str, Tensor] = {}
    kernels: list[Kernel] = []
    views: list[View] = []
    names: dict[relax.Expr, str] = {}

    def tensor_name(expr: relax.Expr, role: TensorRole) -> str | None:
        if isinstance(expr, relax.Var):
            return names.get(expr)
        if isinstance(expr, tvm.ir.GenericConst):
            shape = static_shape(expr.ty)
            if shape is None:
                return None
            name = f"const{len(tensors)}"
            tensors[name] = Tensor(name, shape, _itemsize(expr.ty), TensorRole.CONSTANT)
            return name
        return None

    for param in func.params:
        shape = static_shape(param.ty)
        if shape is not None:
            names[param] = param.name
            tensors[param.name] = Tensor(param.name, shape, _itemsize(param.ty), TensorRole.INPUT)
    outputs = _returned(func)
    for binding in top_level_bindings(func):
        var, value = binding.var, binding.value
        shape = static_shape(var.ty)
        if shape is None:
            continue
        name = var.name
        while name in tensors:
            name += "_"
        role = TensorRole.OUTPUT if var in outputs else TensorRole.INTERMEDIATE
        if isinstance(value, relax.Call) and value.op.same_as(tvm.ir.Op.get("relax.call_tir")):
            args = tuple(tensor_name(a, TensorRole.INTERMEDIATE) for a in value.args[1].fields)
            if any(a is None for a in args):
                continue
            names[var] = name
            tensors[name] = Tensor(name, shape, _itemsize(var.ty), role)
            gvar = value.args[0]
            kernels.append(kernel_model(name, mod[gvar], (*args, name)))
        elif isinstance(value, relax.Call) and value.op.same_as(tvm.ir.Op.get("relax.reshape")):
            source = tensor_name(value.args[0], TensorRole.INTERMEDIATE)
            if source is None:
                continue
            names[var] = name
            tensors[name] = Tensor(name, shape, _itemsize(var.ty), role)
            views.append(View(name, source, _same_axes(tensors[source].shape, shape)))
        elif isinstance(value, relax.Var) and value in names:
            names[var] = names[value]
    return Graph(tensors, kernels, views)


def _itemsize(ty) -> int:
    return tvm.runtime.DataType(str(ty.dtype)).bits // 8


def _returned(func: relax.Function) -> set:
    body = func.body.body
    if isinstance(body, relax.Tuple):
        return {f for f in body.fields if isinstance(f, relax.Var)}
    return {body} if isinstance(body, relax.Var) else set()


def _same_axes(source: tuple[int, ...], view: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Axes a reshape keeps: same extent with the same number of elements before it."""

    def prefixes(shape):
        out, acc = [], 1
        for d in shape:
            out.append(acc)
            acc *= d
        return out

    ps, pv = prefixes(source), prefixes(view)
    return tuple(
        (i, j)
        for i, (ds, a) in enumerate(zip(source, ps, strict=True))
        for j, (dv, b) in enumerate(zip(view, pv, strict=True))
        if ds == dv > 1 and a == b
    )
