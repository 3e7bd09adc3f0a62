"""The shared Relax helpers: the inference batch norm's fold into a per-channel scale and shift."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

from tvm_memplan.relax.ir_utils import constant_value, inference_batch_norm


@pytest.mark.parametrize("center, scale", [(True, True), (False, True), (True, False)])
def test_an_inference_batch_norm_is_a_scale_and_a_shift(center: bool, scale: bool) -> None:
    rng = np.random.default_rng(0)
    gamma, beta, mean = (rng.standard_normal(3).astype("float32") for _ in range(3))
    var = rng.uniform(0.5, 2, 3).astype("float32")
    x = relax.Var("x", relax.TensorType((1, 3, 4, 4), "float32"))
    call = relax.op.nn.batch_norm(
        x,
        *(relax.const(a) for a in (gamma, beta, mean, var)),
        axis=1,
        epsilon=1e-3,
        center=center,
        scale=scale,
        training=False,
    )
    folded = inference_batch_norm(relax.BlockBuilder().normalize(call))
    multiply, shift = folded.args
    factor = constant_value(multiply.args[1])
    data = rng.standard_normal((1, 3, 4, 4)).astype("float32")
    expected = (data - mean.reshape(1, 3, 1, 1)) / np.sqrt(var.reshape(1, 3, 1, 1) + 1e-3)
    expected = expected * (gamma.reshape(1, 3, 1, 1) if scale else 1) + (beta.reshape(1, 3, 1, 1) if center else 0)
    np.testing.assert_allclose(data * factor + constant_value(shift), expected, rtol=1e-5, atol=1e-5)


def test_a_training_batch_norm_is_not_folded() -> None:
    x = relax.Var("x", relax.TensorType((1, 3, 4, 4), "float32"))
    stats = [relax.const(np.ones(3, "float32")) for _ in range(4)]
    call = relax.BlockBuilder().normalize(relax.op.nn.batch_norm(x, *stats, axis=1, training=True))
    assert inference_batch_norm(call) is None
