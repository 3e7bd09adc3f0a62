"""Normalization before chain finding: constants folded, the importer's elementwise ``call_tir``
kernels raised back to Relax operators, inference batch norms folded to a multiply and an add,
every binding of ``main`` given its own name. A QDQ (int8) module keeps its weights' dequantize
(``LowerQDQ`` matches it after the split), computed first: constant bindings exist before any chain."""

from __future__ import annotations

import tvm
from tvm import relax, te, topi
from tvm.relax.expr_functor import PyExprMutator, mutator

from ...quant.qdq_graph import has_qdq
from ..ir_utils import fold_inference_batch_norms, static_shape, top_level_bindings
from ..module import with_blocks, with_functions

# call_tir kernels the ONNX importer emits for Clip and friends, raised back to Relax operators.
_RAISABLE = {
    "maximum": (topi.maximum, relax.op.maximum),
    "minimum": (topi.minimum, relax.op.minimum),
    "add": (topi.add, relax.op.add),
    "multiply": (topi.multiply, relax.op.multiply),
    "subtract": (topi.subtract, relax.op.subtract),
    "divide": (topi.divide, relax.op.divide),
}


def normalize(mod: tvm.IRModule) -> tvm.IRModule:
    """Fold constants, raise the importer's elementwise ``call_tir`` kernels to Relax operators
    (structurally equal to TOPI's) and inference batch norms to a multiply and an add, so the
    rewriter sees operators it can tile. A QDQ module is not folded (``FoldConstant`` would turn each
    weight's dequantize into a float constant no integer kernel reads); its constant bindings move
    to the start of ``main`` instead."""
    quantized = has_qdq(mod["main"])
    if not quantized:
        mod = relax.transform.FoldConstant()(mod)
    mod = fold_inference_batch_norms(mod)
    call_tir = tvm.ir.Op.get("relax.call_tir")

    @mutator
    class _Raise(PyExprMutator):
        def visit_call_(self, call: relax.Call) -> relax.Expr:
            call = super().visit_call_(call)
            if not call.op.same_as(call_tir):
                return call
            gvar, args = call.args[0], list(call.args[1].fields)
            entry = _RAISABLE.get(gvar.name_hint.rstrip("0123456789"))
            if entry is None or len(args) != 2:
                return call
            shapes = [static_shape(a.ty) for a in args]
            if any(s is None for s in shapes):
                return call
            holders = [te.placeholder(list(a.ty.shape.values), str(a.ty.dtype)) for a in args]
            reference = te.create_prim_func([*holders, entry[0](*holders)])
            try:
                tvm.ir.assert_structural_equal(
                    reference.without_attr("global_symbol"), mod[gvar].without_attr("global_symbol")
                )
            except ValueError:
                return call
            return entry[1](*args)

    raiser = _Raise(mod)
    gvar = mod.get_global_var("main")
    raiser.builder_.update_func(gvar, raiser.visit_expr(mod["main"]))
    mod = _unique_names(relax.transform.DeadCodeElimination()(raiser.builder_.finalize()))
    return _constants_first(mod) if quantized else mod


def constant_bindings(func: relax.Function) -> set[relax.Var]:
    """The bindings of ``func`` computed from constants alone (a QDQ model's dequantized weights and
    biases): the build folds or lowers them into constants, so they are no tensors of the arena."""
    found: set[relax.Var] = set()
    for binding in top_level_bindings(func):
        if isinstance(binding, relax.VarBinding) and all(v in found for v in relax.analysis.free_vars(binding.value)):
            found.add(binding.var)
    return found


def _constants_first(mod: tvm.IRModule) -> tvm.IRModule:
    """``main`` with its constant bindings moved to the start of its first dataflow block (their
    order kept), so a chain's weights exist before its head wherever the importer emitted them."""
    func = mod["main"]
    constant = constant_bindings(func)
    blocks = list(func.body.blocks)
    if not constant or not blocks:
        return mod
    hoisted = [b for block in blocks for b in block.bindings if b.var in constant]
    rest = [[b for b in block.bindings if b.var not in constant] for block in blocks]
    rest[0] = hoisted + rest[0]
    updated = with_blocks(func, [type(block)(bindings) for block, bindings in zip(blocks, rest, strict=True)])
    return with_functions(mod, {mod.get_global_var("main"): updated})


def _unique_names(mod: tvm.IRModule) -> tvm.IRModule:
    """Give every binding of ``main`` its own name: chains, the simulator and the latency cache
    name bindings, and Relax lets emitted ones repeat (the batch-norm fold's did)."""
    seen = {p.name for p in mod["main"].params}

    @mutator
    class _Rename(PyExprMutator):
        def visit_var_binding_(self, binding: relax.VarBinding) -> None:
            name = binding.var.name
            if name not in seen:
                seen.add(name)
                super().visit_var_binding_(binding)
                return
            index = 1
            while f"{name}_{index}" in seen:
                index += 1
            seen.add(f"{name}_{index}")
            value = self.visit_expr(binding.value)
            if isinstance(binding.var, relax.DataflowVar):
                renamed = self.builder_.emit(value, name_hint=f"{name}_{index}")
            else:
                renamed = self.builder_.emit_output(value, name_hint=f"{name}_{index}")
            self.set_var_remap(binding.var, renamed)

    renamer = _Rename(mod)
    renamer.builder_.update_func(mod.get_global_var("main"), renamer.visit_expr(mod["main"]))
    return renamer.builder_.finalize()
