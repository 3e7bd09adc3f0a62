"""``exp``, ``sigmoid``, SiLU and ``erf`` in float32 as arithmetic that vectorizes.

TVM lowers ``exp`` (and ``sigmoid``, ``1 / (1 + exp(-x))``) to LLVM's ``llvm.exp`` intrinsic, which LLVM
without a vector math library scalarizes: a 16-lane vector becomes 16 calls to libm's ``expf``. In
EfficientNet-B0, whose expansion and depthwise convolutions end in SiLU (``x * sigmoid(x)``), those calls took
most of the network's time. Here ``exp`` is Cody and Waite's range reduction ``x = n ln 2 + r`` (``ln 2`` in
two parts, so ``r`` is exact) and Moshier's degree-7 polynomial for ``e^r`` on ``|r| <= ln 2 / 2`` (Cephes
``expf``, ~1 ulp), scaled by ``2^n`` built in the exponent bits: adds, multiplies, a floor and integer shifts,
all of which LLVM emits as vector instructions (the method of onnxruntime's MLAS and of vector libraries such
as SLEEF).

``erf`` likewise became a call to libm's ``erff`` per element: 600 µs for a 128 x 512 tensor on one Zen 4 core;
BERT-tiny's two matmul + GELU kernels took 42 % of its kernel time (onnxruntime: 1 ms for the whole network).
TOPI's ``fast_erf`` (a rational approximation on ``[-4, 4]``, the form of Eigen's float ``erf``) vectorizes: 17 µs,
within 3e-7.

Softmax kept TOPI's ``exp``: 32K ``expf`` calls in each of BERT-tiny's two attention softmaxes (128 x 128 per
head), 110 µs per call in the model against onnxruntime's 14 µs. It is TOPI's softmax with :func:`vector_exp`.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax, te, tirx, topi

LOG2E = 1.44269504088896341
LN2_HIGH = 0.693359375
"""ln 2 rounded to few mantissa bits, so ``n * LN2_HIGH`` is exact for the ``n`` of float32."""
LN2_LOW = -2.12194440e-4
EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
"""Moshier's coefficients of ``(e^r - 1 - r) / r^2`` on ``|r| <= ln 2 / 2``, highest degree first."""
EXP_MIN, EXP_MAX = -87.0, 88.0
"""Arguments are clamped here: ``2^n`` stays a normal float (``n`` in [-126, 127]); beyond, ``e^x``
under- or overflows float32 anyway (``e^88`` is 1.7e38, ``e^-87`` 1.6e-38)."""


def vector_exp(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """``e^x`` of a float32 expression, as the module docstring describes."""
    f32 = "float32"
    clamped = tirx.Var("clamped", f32)
    n = tirx.Var("n", f32)
    r = tirx.Var("r", f32)
    poly = tirx.const(EXP_POLY[0], f32)
    for coefficient in EXP_POLY[1:]:
        poly = poly * r + tirx.const(coefficient, f32)
    exp_r = poly * r * r + r + tirx.const(1.0, f32)
    exponent = tirx.Cast("int32", n) + tirx.const(127, "int32")
    two_to_n = tirx.reinterpret(f32, tirx.shift_left(exponent, tirx.const(23, "int32")))
    body = tirx.Let(r, clamped - n * tirx.const(LN2_HIGH, f32) - n * tirx.const(LN2_LOW, f32), exp_r * two_to_n)
    body = tirx.Let(n, tirx.floor(clamped * tirx.const(LOG2E, f32) + tirx.const(0.5, f32)), body)
    bounded = tirx.max(tirx.min(x, tirx.const(EXP_MAX, f32)), tirx.const(EXP_MIN, f32))
    return tirx.Let(clamped, bounded, body)


def vector_sigmoid(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """``1 / (1 + e^-x)``: 0 and 1 at the ends of the clamp, never NaN."""
    one = tirx.const(1.0, "float32")
    return one / (one + vector_exp(-x))


def _float32(name: str, compute: Callable[..., te.Tensor], attrs: Callable[[relax.Call], tuple] = lambda _: ()):
    """A legalization that emits ``compute(data, *attrs(call))`` for float32 data and TVM's own otherwise."""

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr | None:
        (data,) = call.args
        if str(getattr(data.ty, "dtype", "")) != "float32":
            return _default(call)(bb, call)
        return bb.call_te(compute, data, *attrs(call), primfunc_name_hint=name)

    return legalize


def _elementwise(name: str, scalar):
    def compute(tensor: te.Tensor) -> te.Tensor:
        return te.compute(tensor.shape, lambda *i: scalar(tensor(*i)), name="compute", tag=topi.tag.ELEMWISE)

    return _float32(name, compute)


def vector_softmax(data: te.Tensor, axis: int) -> te.Tensor:
    """TOPI's softmax (row max, ``exp`` of the difference, row sum, division) with :func:`vector_exp`."""
    shape = list(data.shape)
    axis = axis % len(shape)
    reduced = shape[:axis] + shape[axis + 1 :]

    def widen(indices, index):
        return (*indices[:axis], index, *indices[axis:])

    def narrow(indices):
        return (*indices[:axis], *indices[axis + 1 :])

    k_max = te.reduce_axis((0, shape[axis]), name="k")
    max_elem = te.compute(reduced, lambda *i: te.max(data(*widen(i, k_max)), axis=k_max), name="T_softmax_maxelem")
    exp = te.compute(shape, lambda *i: vector_exp(data(*i) - max_elem(*narrow(i))), name="T_softmax_exp")
    k_sum = te.reduce_axis((0, shape[axis]), name="k")
    expsum = te.compute(reduced, lambda *i: te.sum(exp(*widen(i, k_sum)), axis=k_sum), name="T_softmax_expsum")
    return te.compute(shape, lambda *i: exp(*i) / expsum(*narrow(i)), name="T_softmax_norm", attrs={"axis": axis})


def _default(call: relax.Call):
    return tvm.ir.Op.get(call.op.name).get_attr("FLegalize")


VECTOR_MATH_LEGALIZE = {
    "relax.exp": _elementwise("exp", vector_exp),
    "relax.sigmoid": _elementwise("sigmoid", vector_sigmoid),
    "relax.nn.silu": _elementwise("silu", lambda x: x * vector_sigmoid(x)),
    "relax.erf": _float32("erf", topi.fast_erf),
    "relax.nn.softmax": _float32("softmax", vector_softmax, lambda call: (int(call.attrs.axis),)),
}
"""Legalizations of float32 ``exp``, ``sigmoid``, SiLU, ``erf`` and softmax for
``LegalizeOps(customize_legalize_map=...)`` on targets whose code generator vectorizes (``llvm``); other dtypes
keep TVM's."""
