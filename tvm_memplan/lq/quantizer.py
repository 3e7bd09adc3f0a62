"""LQ-Nets quantizers fitted with QEM (Zhang et al., ECCV 2018; docs/design.md, "LQ dense").

A quantized value is the dot product of a learned basis ``a`` (K floats) with a K-bit code.
Codes are either ``pm1`` (bits mean -1/+1, the quantizer thesis's choice, symmetric levels for signed data)
or ``01`` (bits mean 0/1, LQ-Nets' activation codes: zero is a level, fits non-negative data).
Weights get one basis per output channel with ``pm1`` codes, activations one basis per layer.

QEM alternates (1) the optimal codes for a fixed basis, found by thresholds halfway between
the sorted levels, and (2) the least-squares basis for those codes. Step (2) is a ridge
regression pulled towards the previous basis: ``BᵀB`` is singular whenever a bit goes unused,
and the pull keeps such a bit where it was instead of sending it to zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..errors import UserError

Codes = Literal["pm1", "01"]
CODES: tuple[str, ...] = ("pm1", "01")
MIN_BITS, MAX_BITS = 1, 4
# Phi^-1(0.75): LQ-Nets scales its uniform initial levels by this normal quantile.
NORM_PPF_0_75 = 0.6744897501960817


def check_bits(bits: int, what: str) -> int:
    """Bit widths the kernels support; anything else is a user error, not a crash."""
    if not isinstance(bits, (int, np.integer)) or not MIN_BITS <= int(bits) <= MAX_BITS:
        raise UserError(f"{what} must be an integer in {MIN_BITS}..{MAX_BITS}, got {bits!r}")
    return int(bits)


def code_matrix(bits: int, codes: Codes) -> np.ndarray:
    """(2**bits, bits) values of every code word; bit i of word c is ``(c >> i) & 1``."""
    words = np.arange(1 << bits)[:, None]
    b = (words >> np.arange(bits)[None, :]) & 1
    return (2.0 * b - 1.0) if codes == "pm1" else b.astype(np.float64)


@dataclass(frozen=True)
class LQQuantizer:
    """A fitted quantizer for C channels: channel c maps code word w to ``basis[c] · code(w)``."""

    basis: np.ndarray
    """(C, K) float64 learned basis, one row per channel."""
    codes: Codes

    @property
    def bits(self) -> int:
        return int(self.basis.shape[1])

    @property
    def channels(self) -> int:
        return int(self.basis.shape[0])

    def sorted_levels(self) -> tuple[np.ndarray, np.ndarray]:
        """(C, L) levels in ascending order and the (C, L) code word of each."""
        levels = self.basis @ code_matrix(self.bits, self.codes).T
        order = np.argsort(levels, axis=1, kind="stable")
        return np.take_along_axis(levels, order, axis=1), order.astype(np.uint8)

    def thresholds(self) -> np.ndarray:
        """(C, L-1) float32 decision thresholds, exactly the constants the packing kernel compares with."""
        levels, _ = self.sorted_levels()
        return ((levels[:, 1:] + levels[:, :-1]) / 2).astype(np.float32)

    def encode(self, x: np.ndarray) -> np.ndarray:
        """(C, n) values → (C, n) uint8 code words of their nearest level.

        The rule is the kernel's: level index = number of thresholds strictly below x, compared
        in float32, so the numpy codes and the packed bits agree exactly.
        """
        x = np.asarray(x, dtype=np.float32)
        thr = self.thresholds()
        _, words = self.sorted_levels()
        index = np.zeros(x.shape, dtype=np.int64)
        for t in range(thr.shape[1]):
            index += x > thr[:, t : t + 1]
        return np.take_along_axis(words, index, axis=1)

    def decode(self, words: np.ndarray) -> np.ndarray:
        """(C, n) code words → (C, n) float64 values."""
        levels = self.basis @ code_matrix(self.bits, self.codes).T
        return np.take_along_axis(levels, words.astype(np.int64), axis=1)

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """x with every value replaced by its level (fake quantization)."""
        return self.decode(self.encode(x))

    def code_bits(self, x: np.ndarray) -> np.ndarray:
        """(K, C, n) uint8 bit-planes of the codes of x: bit 1 means +1 (pm1) or 1 (01)."""
        words = self.encode(x)
        return ((words[None, :, :] >> np.arange(self.bits)[:, None, None]) & 1).astype(np.uint8)

    def pm1_form(self) -> tuple[np.ndarray, np.ndarray]:
        """(scales (C, K), offset (C,)) with value = offset + Σ scales·s, s ∈ {-1, +1}.

        The kernel only multiplies ±1 planes; {0,1} codes become b = (1 + s)/2, so a basis a
        turns into scales a/2 plus a constant offset Σa/2 that folds into the layer bias.
        """
        if self.codes == "pm1":
            return self.basis.copy(), np.zeros(self.channels)
        return self.basis / 2.0, self.basis.sum(axis=1) / 2.0


def initial_basis(x: np.ndarray, bits: int, codes: Codes) -> np.ndarray:
    """LQ-Nets' initialisation: uniform levels (powers of two) scaled by Φ⁻¹(0.75) times the spread.

    pm1: a_i = 2^i · Φ⁻¹(0.75)·σ / 2^(K-1), as LQ-Nets does for weights (σ = channel std);
    01: a_i = 2^i · 2Φ⁻¹(0.75)·r / (2^K - 1), its activation rule with r the root mean square.
    """
    powers = 2.0 ** np.arange(bits)[None, :]
    if codes == "pm1":
        spread = np.sqrt(np.mean(np.square(x - x.mean(axis=1, keepdims=True)), axis=1))
        base = NORM_PPF_0_75 * spread / 2.0 ** (bits - 1)
    else:
        spread = np.sqrt(np.mean(np.square(x), axis=1))
        base = 2.0 * NORM_PPF_0_75 * spread / (2.0**bits - 1.0)
    base = np.where(base > 0, base, 1e-8)
    return base[:, None] * powers


def _canonical(basis: np.ndarray, codes: Codes) -> np.ndarray:
    """Sort the basis (a_0 < a_1 < ...); ±1 codes also make it non-negative,
    since flipping a basis sign and its bit gives the same levels."""
    if codes == "pm1":
        basis = np.abs(basis)
    return np.sort(basis, axis=1)


def fit_qem(
    x: np.ndarray,
    bits: int,
    codes: Codes = "pm1",
    *,
    target: np.ndarray | None = None,
    iters: int = 30,
    ridge: float = 1e-3,
    init: np.ndarray | None = None,
    tol: float = 1e-7,
) -> LQQuantizer:
    """Fit one basis per row of ``x`` (C, n) by QEM.

    ``target`` (same shape) is what the levels should reproduce; by default x itself. The
    seed's fine-tuning passes x = inputs seen after the already-quantized upstream layers and
    target = the float model's inputs, so the codes come from what the layer really receives
    while the basis is fitted to what it should have received.
    ``ridge`` is the weight of ||a - a_prev||² relative to the mean diagonal of BᵀB.
    Returns the basis with the smallest error seen (QEM is monotone only up to the ridge).
    """
    bits = check_bits(bits, "bits")
    if codes not in CODES:
        raise UserError(f"codes must be one of {', '.join(CODES)}, got {codes!r}")
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"fit_qem expects (channels, n) data, got shape {x.shape}")
    y = x.astype(np.float64) if target is None else np.asarray(target, dtype=np.float64)
    if y.shape != x.shape:
        raise ValueError(f"target shape {y.shape} differs from data shape {x.shape}")
    if init is None and target is not None:
        # Start from the plain fit of x: its error against the target is the first one tracked,
        # so fitting to a target never ends worse than ignoring it.
        init = fit_qem(x, bits, codes, iters=iters, ridge=ridge, tol=tol).basis
    basis = _canonical(initial_basis(y, bits, codes) if init is None else np.array(init, dtype=np.float64), codes)
    cm = code_matrix(bits, codes)
    eye = np.eye(bits)
    best, best_err = basis, np.inf
    for _ in range(iters):
        quant = LQQuantizer(basis, codes)
        words = quant.encode(x).astype(np.int64)
        err = np.mean(np.square(quant.decode(words) - y), axis=1)
        improved = err < best_err
        best = np.where(improved[:, None], basis, best)
        best_err = np.minimum(err, best_err)
        # Normal equations per channel from code-word histograms: BᵀB = Σ_w count_w c_w c_wᵀ,
        # Bᵀy = Σ_w (Σ_{x: word w} y) c_w — no (n, K) matrix is ever built.
        cells = (words + cm.shape[0] * np.arange(x.shape[0])[:, None]).ravel()
        size = x.shape[0] * cm.shape[0]
        counts = np.bincount(cells, minlength=size).reshape(x.shape[0], -1).astype(np.float64)
        sums = np.bincount(cells, weights=y.ravel(), minlength=size).reshape(x.shape[0], -1)
        btb = np.einsum("cw,wi,wj->cij", counts, cm, cm)
        bty = sums @ cm
        lam = ridge * np.maximum(np.trace(btb, axis1=1, axis2=2) / bits, 1.0)
        rhs = (bty + lam[:, None] * basis)[:, :, None]
        new = np.linalg.solve(btb + lam[:, None, None] * eye, rhs)[:, :, 0]
        new = _canonical(new, codes)
        change = np.max(np.abs(new - basis) / (np.abs(basis).max(axis=1, keepdims=True) + 1e-30))
        basis = new
        if change < tol:
            break
    quant = LQQuantizer(basis, codes)
    err = np.mean(np.square(quant.quantize(x) - y), axis=1)
    best = np.where((err < best_err)[:, None], basis, best)
    return LQQuantizer(best, codes)


def fit_weights(weight: np.ndarray, bits: int, **options: object) -> LQQuantizer:
    """Per-output-channel ±1 quantizer of a (N, O) dense weight (channels = columns)."""
    return fit_qem(np.ascontiguousarray(weight.T), bits, "pm1", **options)


def choose_activation_codes(x: np.ndarray, codes: str = "auto") -> Codes:
    """``auto`` picks {0,1} codes for non-negative inputs (pixels, ReLU outputs: zero is a level
    and no level is wasted below zero) and ±1 codes for signed inputs (tanh outputs)."""
    if codes == "auto":
        return "01" if float(np.min(x)) >= 0.0 else "pm1"
    if codes not in CODES:
        raise UserError(f"activation codes must be auto, pm1 or 01, got {codes!r}")
    return codes  # type: ignore[return-value]


def fit_activations(
    x: np.ndarray,
    bits: int,
    codes: str = "auto",
    *,
    target: np.ndarray | None = None,
    max_samples: int = 1 << 20,
    seed: int = 0,
    **options: object,
) -> LQQuantizer:
    """One per-layer quantizer for all values of the calibration inputs x (any shape).

    Large calibration sets are subsampled (same positions in x and target) to ``max_samples``.
    """
    flat = np.asarray(x, dtype=np.float32).ravel()
    tflat = None if target is None else np.asarray(target, dtype=np.float32).ravel()
    if flat.size > max_samples:
        pick = np.random.default_rng(seed).choice(flat.size, max_samples, replace=False)
        flat = flat[pick]
        tflat = None if tflat is None else tflat[pick]
    kind = choose_activation_codes(flat, codes)
    return fit_qem(flat[None, :], bits, kind, target=None if tflat is None else tflat[None, :], **options)
