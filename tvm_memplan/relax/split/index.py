"""``main`` of a normalized module indexed for the chain finders: bindings, uses, outputs,
definitions, and the axis connection graph of its legalized TIR."""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax

from ...quant.qdq_graph import has_qdq
from ...split.acg import AxisConnectionGraph, build_acg
from ..axes import graph_model
from ..ir_utils import top_level_bindings
from .normalize import constant_bindings
from .operators import CHANNEL, blocked_tensors


def axis_graph(mod: tvm.IRModule) -> tuple[AxisConnectionGraph, object]:
    """The axis connection graph of a normalized module, from its legalized TIR."""
    # reshapes stay views (as TVM later makes them), so their kept axes connect
    graph = graph_model(relax.transform.LegalizeOps({"relax.reshape": lambda _bb, call: call})(mod))
    return build_acg(graph), graph


@dataclass
class FunctionIndex:
    """``main`` of a normalized module as the chain finders read it."""

    bindings: list[relax.VarBinding]
    uses: dict[relax.Var, list[int]]
    """Tensor -> indices of the bindings that read it."""
    outputs: set[relax.Var]
    """Tensors the function returns."""
    defined_at: dict[relax.Var, int]
    acg: AxisConnectionGraph
    constants: set[relax.Var]
    """Bindings computed from constants alone (:func:`~.normalize.constant_bindings`)."""
    quantized: bool
    """A QDQ module: its float tensors between a dequantize and a quantize live inside integer kernels."""
    block: int | None = None
    """Channels per block of the blocked layout the model is built in (None: NCHW): tiles' bytes count
    their channels rounded up to whole blocks (:func:`~.operators.nbytes`)."""
    blocked: frozenset[relax.Var] = frozenset()
    """The tensors that layout holds blocked (:func:`~.operators.blocked_tensors`)."""

    @classmethod
    def of(cls, mod: tvm.IRModule, block: int | None = None) -> FunctionIndex:
        func = mod["main"]
        bindings = top_level_bindings(func)
        uses: dict[relax.Var, list[int]] = {}
        for i, b in enumerate(bindings):
            for var in relax.analysis.free_vars(b.value):
                uses.setdefault(var, []).append(i)
        return cls(
            bindings,
            uses,
            set(relax.analysis.free_vars(func.body.body)),
            {b.var: i for i, b in enumerate(bindings)},
            axis_graph(mod)[0],
            constant_bindings(func),
            has_qdq(func),
            block,
            blocked_tensors(func) if block is not None else frozenset(),
        )

    def block_of(self, var: relax.Expr) -> int | None:
        """The channel block ``var`` is held in: :attr:`block` if the blocked build blocks it, else None."""
        return self.block if var in self.blocked else None

    def single_consumer(self, var: relax.Var) -> int | None:
        users = self.uses.get(var, [])
        return users[0] if len(users) == 1 and var not in self.outputs else None

    def component(self, var: relax.Var, axis: int = CHANNEL) -> int | None:
        """The axis connection graph's component of ``var``'s ``axis``."""
        comp = self.acg.component_of(var.name, axis)
        return comp.id if comp is not None else None

    def exists_before(self, arg: relax.Expr, index: int) -> bool:
        """``arg`` is not a tensor computed at binding ``index`` or later."""
        return not isinstance(arg, relax.Var) or self.defined_at.get(arg, -1) < index

    def escaping(self, members: list[int]) -> list[relax.Var]:
        """Tensors of the bindings ``members`` that the rest of the program reads (or returns)."""
        inside = set(members)
        return [
            self.bindings[k].var
            for k in members
            if self.bindings[k].var in self.outputs
            or any(u not in inside for u in self.uses.get(self.bindings[k].var, []))
        ]
