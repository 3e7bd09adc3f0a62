"""Chains as modules of their own, for latency measurement (one signature per kind of block), and
simulator tensor names as a reader wants them."""

from __future__ import annotations

import hashlib
import re

import tvm
from tvm import relax

from ...split.chain import Chain
from ..ir_utils import op_name, static_shape, top_level_bindings
from ..module import relax_functions
from .normalize import constant_bindings, normalize
from .operators import DEQUANTIZE, channels
from .outline import TILES_ATTR, rebind


def chain_module(mod: tvm.IRModule, chain: Chain) -> tvm.IRModule:
    """The chain alone: its outside tensors as parameters, its last tensor returned, binding
    names kept (so :func:`split_chains` applies to it as to the whole model). In a QDQ module the
    bindings computed from constants (weights) and the dequantize of an outside tensor come along,
    so the chain's integer kernels are lowered as in the whole model, and read int8 parameters."""
    func = mod["main"]
    table = {b.var.name: b for b in top_level_bindings(func)}
    constants = constant_bindings(func)
    links = [table[n] for n in chain.bindings]
    pending = list(links)
    while pending:
        for v in relax.analysis.free_vars(pending.pop().value):
            if v.name in table and table[v.name] not in links and (v in constants or _dequantizes(table[v.name])):
                links.append(table[v.name])
                pending.append(table[v.name])
    order = {b.var.name: i for i, b in enumerate(top_level_bindings(func))}
    links.sort(key=lambda b: order[b.var.name])
    defined = {b.var for b in links}
    externals = list(dict.fromkeys(v for b in links for v in relax.analysis.free_vars(b.value) if v not in defined))
    params = [relax.Var(v.name, v.ty) for v in externals]
    remap = dict(zip(externals, params, strict=True))
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            for i, b in enumerate(links):
                value = rebind(b.value, remap)
                emit = bb.emit_output if i == len(links) - 1 else bb.emit
                remap[b.var] = emit(value, name_hint=b.var.name)
        bb.emit_func_output(remap[links[-1].var])
    return normalize(bb.get())


def _dequantizes(binding: relax.VarBinding) -> bool:
    """A QDQ model's dequantize of an activation (its integer kernel's operand)."""
    return op_name(binding.value) == DEQUANTIZE


def chain_signature(mod: tvm.IRModule) -> str:
    """What a chain module's latency depends on (operators, attributes, shapes; tiles that run as
    one kernel), not its weights or variable names: identical blocks of a network share one
    measurement."""
    tiles = sorted((g.name_hint, f) for g, f in relax_functions(mod) if f.attrs is not None and TILES_ATTR in f.attrs)
    text = "\n".join(f.script(show_meta=False) for f in [mod["main"], *(f for _, f in tiles)])
    names: dict[str, str] = {}
    text = re.sub(r"\b(lv\d*(?:_\d+)?|gv\d*)\b", lambda m: names.setdefault(m.group(1), f"v{len(names)}"), text)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def describe_tensors(mod: tvm.IRModule, names: list[str]) -> list[str]:
    """Simulator tensor names as a reader wants them: the operator and shape behind each
    (``lv9#lv#1`` is tile 2 of the chain at ``lv``, written by the depthwise convolution ``lv9``)."""
    table = {b.var.name: b for b in top_level_bindings(mod["main"])}
    described = []
    for name in names:
        base, _, tile = name.partition("#")
        binding = table.get(base)
        if binding is None:
            described.append(name)
            continue
        op = (op_name(binding.value) or "kernel").removeprefix("relax.").removeprefix("nn.")
        if op == "conv2d" and int(binding.value.attrs.groups) > 1:
            op = "depthwise conv2d" if int(binding.value.attrs.groups) == channels(binding.var) else "grouped conv2d"
        shape = "x".join(str(d) for d in (static_shape(binding.var.ty) or ())[1:])
        what = f"{op} {shape} ({base})"
        if tile:
            head, t = tile.split("#")[:2]
            what = f"tile {int(t) + 1} of {what}, chain at {head}"
        described.append(what)
    return described
