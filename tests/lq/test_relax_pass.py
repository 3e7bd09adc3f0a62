"""LQDense / FloatDense: which layers convert, what is left in float and why, and that the compiled
model computes what the quantizers say."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

from tvm_memplan.lq import kernels
from tvm_memplan.lq.calibrate import build, default_target
from tvm_memplan.lq.quantizer import fit_activations, fit_weights
from tvm_memplan.lq.relax_pass import FloatDense, LQDense, LQLayer, find_dense_layers, parameter_bytes

from .models import mlp, two_input_matmul

TARGET = default_target()


def _folded(model, shape_dict=None):
    return relax.transform.FoldConstant()(from_onnx(model, shape_dict=shape_dict))


def _layers(mod, x, wbits=2, abits=2):
    """Fit every convertible site on inputs computed in numpy (the float path)."""
    layers = {}
    h = x
    for site in find_dense_layers(mod):
        wq = fit_weights(site.weight, wbits, iters=5)
        act = fit_activations(h, abits, iters=5)
        layers[site.name] = LQLayer(site.name, wq.code_bits(site.weight.T), wq.pm1_form()[0], act, site.bias)
        h = np.maximum(h @ site.weight + site.bias, 0)
    return layers


def _simulate(mod, layers, x):
    """The quantized model in numpy: fake-quantized inputs times dequantized weights."""
    h = x
    sites = find_dense_layers(mod)
    for index, site in enumerate(sites):
        layer = layers[site.name]
        hq = layer.act.quantize(h.reshape(1, -1)).reshape(h.shape)
        h = hq @ layer.dequantized_weight() + layer.bias
        if index < len(sites) - 1:
            h = np.maximum(h, 0)
    return h


def _run(mod, x):
    vm = relax.VirtualMachine(build(mod, TARGET), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_finds_gemms_and_folds_their_bias():
    mod = _folded(mlp(), {"x": [1, 40]})
    sites = find_dense_layers(mod)
    assert [s.name for s in sites] == ["dense0", "dense1"]
    assert all(s.convertible and s.bias is not None for s in sites)
    assert [s.weight.shape for s in sites] == [(40, 24), (24, 6)]


@pytest.mark.parametrize("batch", [1, 7])
def test_lq_model_matches_the_numpy_simulation(batch):
    x = np.random.default_rng(0).normal(size=(batch, 40)).astype(np.float32)
    mod = _folded(mlp(), {"x": [batch, 40]})
    layers = _layers(mod, x)
    out = LQDense(layers, TARGET)(mod)
    text = out.script()
    assert "lq_dense_dense0" in text and "lq_dense_dense1" in text
    assert "R.matmul" not in text, "every dense layer replaced"
    # {0,1} codes for the non-negative ReLU input of dense1, ±1 for the signed x.
    assert layers["dense0"].act.codes == "pm1" and layers["dense1"].act.codes == "01"
    np.testing.assert_allclose(_run(out, x), _simulate(mod, layers, x), rtol=1e-4, atol=1e-4)


def test_pass_does_not_mutate_its_input():
    mod = _folded(mlp(), {"x": [1, 40]})
    before = mod.script()
    LQDense(_layers(mod, np.ones((1, 40), np.float32)), TARGET)(mod)
    assert mod.script() == before


def test_non_constant_weights_and_dynamic_shapes_stay_float():
    mod = _folded(two_input_matmul(), None)
    sites = find_dense_layers(mod)
    assert sites[0].reason == "weight is not a constant"
    assert sites[1].convertible
    dynamic = relax.transform.FoldConstant()(from_onnx(mlp(batch="N")))
    assert all(s.reason == "dynamic input shape" for s in find_dense_layers(dynamic))


def test_three_dimensional_input_is_flattened_to_rows():
    rng = np.random.default_rng(3)
    weight = rng.normal(size=(12, 5)).astype(np.float32)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3, 12), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, relax.const(weight)))
        bb.emit_func_output(out)
    mod = bb.get()
    site = find_dense_layers(mod)[0]
    assert site.convertible and site.rows == 6 and site.bias is None
    data = rng.normal(size=(2, 3, 12)).astype(np.float32)
    wq = fit_weights(weight, 3, iters=5)
    act = fit_activations(data, 3, iters=5)
    layer = LQLayer(site.name, wq.code_bits(weight.T), wq.pm1_form()[0], act, np.zeros(5))
    got = _run(LQDense({site.name: layer}, TARGET)(mod), data)
    expect = act.quantize(data.reshape(1, -1)).reshape(6, 12) @ layer.dequantized_weight()
    np.testing.assert_allclose(got, expect.reshape(2, 3, 5), rtol=1e-4, atol=1e-4)


def test_float_dense_is_exact_and_sizes_are_counted():
    x = np.random.default_rng(5).normal(size=(3, 40)).astype(np.float32)
    mod = _folded(mlp(), {"x": [3, 40]})
    reference = _run(mod, x)
    scheduled = FloatDense([s.name for s in find_dense_layers(mod)])(mod)
    np.testing.assert_allclose(_run(scheduled, x), reference, rtol=1e-5, atol=1e-5)
    assert parameter_bytes(mod) == 4 * (40 * 24 + 24 + 24 * 6 + 6)
    lq = LQDense(_layers(mod, x), TARGET)(mod)
    # Kw planes x V-channel tiles x 32-bit words per row x V lanes, plus float ax, aw and bias.
    v = kernels.LANES[kernels.kernel_flavor(TARGET)]
    packed = 4 * (2 * -(-24 // v) * 2 * v) + 4 * (2 * -(-6 // v) * 1 * v)
    expected = packed + 4 * (2 + 2 * 24 + 24) + 4 * (2 + 2 * 6 + 6)
    assert parameter_bytes(lq) == expected


def _conv_forward(sites, x, layers=None):
    """The convnet in numpy, float or quantized (fake-quantized im2col columns times dequantized weights).

    Returns the final output and the (rows, N) input matrix each layer multiplied.
    """
    h, seen = x, {}
    for index, site in enumerate(sites):
        cols = site.columns(h if site.conv is not None else h.reshape(h.shape[0], -1))
        seen[site.name] = cols
        if layers is None:
            out = cols @ site.weight + site.bias
        else:
            layer = layers[site.name]
            out = layer.act.quantize(cols.reshape(1, -1)).reshape(cols.shape) @ layer.dequantized_weight() + layer.bias
        if index == len(sites) - 1:
            return out, seen
        oh, ow = site.conv.out_hw
        h = np.maximum(out, 0).reshape(h.shape[0], oh, ow, -1).transpose(0, 3, 1, 2)


def test_convolutions_go_through_im2col_into_the_same_kernel():
    from .models import convnet

    x = np.random.default_rng(6).normal(size=(2, 3, 8, 8)).astype(np.float32)
    mod = _folded(convnet(), {"x": [2, 3, 8, 8]})
    sites = find_dense_layers(mod)
    assert [s.name for s in sites] == ["conv0", "conv1", "dense2"]
    assert all(s.convertible and s.bias is not None for s in sites)
    assert sites[1].conv.out_hw == (4, 4) and sites[1].rows == 32 and sites[1].weight.shape == (72, 6)
    reference, seen = _conv_forward(sites, x)
    np.testing.assert_allclose(_run(mod, x), reference, rtol=1e-4, atol=1e-4)

    layers = {}
    for site in sites:
        wq = fit_weights(site.weight, 2, iters=5)
        act = fit_activations(seen[site.name], 3, iters=5)
        layers[site.name] = LQLayer(site.name, wq.code_bits(site.weight.T), wq.pm1_form()[0], act, site.bias)
    lq = LQDense(layers, TARGET)(mod)
    assert "R.nn.conv2d" not in lq.script()
    expect, _ = _conv_forward(sites, x, layers)
    np.testing.assert_allclose(_run(lq, x), expect, rtol=1e-4, atol=1e-4)
