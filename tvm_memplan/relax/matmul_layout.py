"""Matmuls with constant weights read them packed in column panels, as GEMM libraries pack B.

``x @ W`` with a constant ``W`` of shape ``[K, N]`` reads, for one register tile of output columns, a few
vectors of each of the K rows of W, rows ``N * 4`` bytes apart: a ViT-B's 768 x 3072 weights came from
memory as 128-byte pieces 12 KiB apart, and its matmul ran 1.4x slower with the weights cold than warm.
Packed at compile time into panels ``[N / nb, K, nb]`` of ``nb`` columns (two vectors of the target; the
packing of BLIS (Van Zee & van de Geijn, 2015) and of onnxruntime's MLAS SGEMM), each panel is one
contiguous run that a task reads front to back. The kernel computes ``[..., N / nb, nb]`` and stores it as
``[..., N]`` (the same bytes). A product with one row (a classifier at batch 1)
keeps its row-major weights: its rule streams them in memory order.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te

from .ir_utils import constant_value, op_name, static_shape

PACKED_MATMUL = "matmul_packed"
"""The reduction block's name in :func:`matmul_packed`."""


def matmul_packed(data: te.Tensor, panels: te.Tensor) -> te.Tensor:
    """``data [..., K] @ W [K, N]`` from ``panels [N / nb, K, nb]`` (``panels[p, k, j] = W[k, p * nb + j]``).
    The reduction computes ``[..., N / nb, nb]`` (each tile's weights one panel, and TVM's ``pad_einsum``
    can pad its rows, :mod:`~tvm_memplan.schedule.cpu.tiled_reduction`); a reshape inside the kernel gives
    ``[..., N]``, so that the epilogue (bias, activation) still fuses into it."""
    reduce = te.reduce_axis((0, data.shape[-1]), name="k")
    count, _, width = panels.shape
    product = te.compute(
        (*data.shape[:-1], count, width),
        lambda *index: te.sum(data[(*index[:-2], reduce)] * panels[index[-2], reduce, index[-1]], axis=reduce),
        name=PACKED_MATMUL,
    )
    return te.compute(
        (*data.shape[:-1], count * width),
        lambda *index: product[(*index[:-1], index[-1] // width, index[-1] % width)],
        name="T_reshape",
    )


def panel_width(columns: int, lanes: int) -> int | None:
    """Columns per panel for a target with ``lanes`` float32 lanes: two vectors (the rules' vector tile), one
    where two do not divide ``columns``, None where neither does."""
    return next((width for width in (2 * lanes, lanes) if columns % width == 0), None)


@relax.expr_functor.mutator
class PackMatmulWeights(relax.PyExprMutator):
    """float32 ``matmul(x, W)`` with ``W`` a 2-D constant and more than one row becomes
    ``matmul_packed(x, panels(W))``; a weight several matmuls read (the tiles of a split chain) is
    packed once. Run as a module pass by :func:`~.layout.BlockedLayout`."""

    def __init__(self, mod: tvm.IRModule, lanes: int) -> None:
        super().__init__(mod)
        self.lanes = lanes
        self.packed: list[tuple[relax.Expr, relax.Expr]] = []

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if op_name(call) != "relax.matmul":
            return call
        data, weight = call.args
        shape, out = static_shape(data.ty), static_shape(call.ty)
        matrix = constant_value(weight)
        if matrix is None or matrix.ndim != 2 or shape is None or out is None or len(shape) < 2:
            return call
        if any(str(t.dtype) != "float32" for t in (data.ty, weight.ty, call.ty)):
            return call
        width = panel_width(out[-1], self.lanes)
        if width is None or int(np.prod(shape[:-1])) < 2:
            return call
        panels = self._panels(weight, matrix, width)
        return self.builder_.call_te(matmul_packed, data, panels, primfunc_name_hint=PACKED_MATMUL)

    def _panels(self, weight: relax.Expr, matrix: np.ndarray, width: int) -> relax.Expr:
        for original, panels in self.packed:
            if original.same_as(weight):
                return panels
        rows, columns = matrix.shape
        panels = relax.const(np.ascontiguousarray(matrix.reshape(rows, columns // width, width).transpose(1, 0, 2)))
        self.packed.append((weight, panels))
        return panels
