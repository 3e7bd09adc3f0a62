"""QEM quantizer: codes, levels, fitting, and the {0,1} ↔ ±1 rewrite the kernels rely on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_memplan.errors import UserError
from tvm_memplan.lq.quantizer import (
    LQQuantizer,
    choose_activation_codes,
    code_matrix,
    fit_activations,
    fit_qem,
    fit_weights,
    initial_basis,
)


@settings(max_examples=40, deadline=None)
@given(
    bits=st.integers(1, 4),
    codes=st.sampled_from(["pm1", "01"]),
    seed=st.integers(0, 2**16),
)
def test_encode_picks_a_nearest_level(bits, codes, seed):
    rng = np.random.default_rng(seed)
    basis = np.sort(rng.uniform(0.05, 1.0, (3, bits)), axis=1)
    quant = LQQuantizer(basis, codes)
    x = rng.normal(size=(3, 200)).astype(np.float32)
    got = quant.quantize(x)
    levels = basis @ code_matrix(bits, codes).T
    best = np.min(np.abs(x[:, :, None] - levels[:, None, :]), axis=2)
    # Thresholds are rounded to float32, so a value within float32 eps of a midpoint may go either way.
    assert np.all(np.abs(np.abs(got - x) - best) <= 1e-6 * (1 + np.abs(x)))


def test_code_bits_reassemble_the_levels():
    rng = np.random.default_rng(1)
    quant = LQQuantizer(np.array([[0.2, 0.7, 1.1]]), "pm1")
    x = rng.normal(size=(1, 64)).astype(np.float32)
    planes = quant.code_bits(x)  # (K, C, n)
    rebuilt = np.einsum("k,kcn->cn", quant.basis[0], 2.0 * planes - 1.0)
    np.testing.assert_allclose(rebuilt, quant.quantize(x))


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_qem_improves_on_the_initial_levels(bits):
    rng = np.random.default_rng(bits)
    w = rng.normal(0, 0.05, (256, 16)).astype(np.float32)
    fitted = fit_weights(w, bits)
    start = LQQuantizer(initial_basis(w.T.astype(np.float64), bits, "pm1"), "pm1")
    err = np.mean((fitted.quantize(w.T) - w.T) ** 2, axis=1)
    err0 = np.mean((start.quantize(w.T) - w.T) ** 2, axis=1)
    assert np.all(err <= err0 + 1e-15)
    assert np.all(np.diff(fitted.basis, axis=1) >= 0), "basis kept sorted"


def test_one_bit_gaussian_reaches_the_lloyd_max_optimum():
    x = np.random.default_rng(0).normal(size=(1, 200_000)).astype(np.float32)
    fitted = fit_qem(x, 1, "pm1")
    rel = np.sqrt(np.mean((fitted.quantize(x) - x) ** 2))
    assert rel == pytest.approx(np.sqrt(1 - 2 / np.pi), rel=0.01)
    assert fitted.basis[0, 0] == pytest.approx(np.sqrt(2 / np.pi), rel=0.01)


def test_singular_normal_equations_stay_finite():
    # A constant channel leaves most codes unused: BᵀB is singular without the ridge.
    x = np.zeros((2, 100), np.float32)
    x[1] = 0.5
    fitted = fit_qem(x, 3, "pm1")
    assert np.all(np.isfinite(fitted.basis))
    np.testing.assert_allclose(fitted.quantize(x)[1], 0.5, atol=0.05)


def test_zero_one_codes_equal_their_pm1_form():
    quant = LQQuantizer(np.array([[0.3, 0.9]]), "01")
    scales, offset = quant.pm1_form()
    x = np.random.default_rng(2).uniform(0, 1.5, (1, 50)).astype(np.float32)
    planes = quant.code_bits(x)
    as_pm1 = offset[:, None] + np.einsum("ck,kcn->cn", scales, 2.0 * planes - 1.0)
    np.testing.assert_allclose(as_pm1, quant.quantize(x))


def test_auto_codes_follow_the_sign_of_the_data():
    assert choose_activation_codes(np.array([0.0, 1.0])) == "01"
    assert choose_activation_codes(np.array([-0.1, 1.0])) == "pm1"
    assert choose_activation_codes(np.array([-0.1, 1.0]), "01") == "01"
    relu = np.maximum(np.random.default_rng(3).normal(size=(64, 32)), 0)
    fitted = fit_activations(relu, 2)
    assert fitted.codes == "01"
    assert np.any(fitted.quantize(relu.reshape(1, -1)) == 0.0), "zero is a level of {0,1} codes"


def test_target_fits_levels_to_what_the_input_should_have_been():
    # Fine-tuning: codes come from the inputs the layer sees, levels are fitted to the float ones.
    rng = np.random.default_rng(4)
    wanted = rng.normal(size=(1, 20_000)).astype(np.float32)
    seen = (wanted + rng.normal(0, 0.1, wanted.shape)).astype(np.float32)
    tuned = fit_qem(seen, 2, "pm1", target=wanted)
    plain = fit_qem(seen, 2, "pm1")
    tuned_err = np.mean((tuned.quantize(seen) - wanted) ** 2)
    plain_err = np.mean((plain.quantize(seen) - wanted) ** 2)
    assert tuned_err < plain_err


@pytest.mark.parametrize("bits", [0, 5, 2.5])
def test_bits_out_of_range_are_user_errors(bits):
    with pytest.raises(UserError):
        fit_qem(np.ones((1, 4), np.float32), bits)


def test_unknown_codes_are_user_errors():
    with pytest.raises(UserError):
        fit_activations(np.ones((4, 4)), 2, "ternary")
