"""Model-level quantization: calibration on real inputs, fine-tuning, layers kept in float."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

from tvm_memplan.errors import UserError
from tvm_memplan.lq.calibrate import (
    LQConfig,
    apply_layers,
    batches,
    build,
    default_target,
    probe_inputs,
    quantize_module,
    refit_weight_scales,
)
from tvm_memplan.lq.relax_pass import find_dense_layers

from .models import mlp

TARGET = default_target()
SIZES = (40, 32, 24, 6)


def _module(batch=4):
    return from_onnx(mlp(SIZES, batch=batch), shape_dict={"x": [batch, SIZES[0]]})


def _data(n=64):
    return {"x": np.random.default_rng(0).normal(size=(n, SIZES[0])).astype(np.float32)}


def _float_forward(mod, x):
    vm = relax.VirtualMachine(build(mod, TARGET), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_probe_returns_each_layer_input():
    mod = relax.transform.FoldConstant()(_module())
    data = batches(mod, _data(16))
    got = probe_inputs(mod, ["dense0", "dense1", "dense2"], data, TARGET)
    x = np.concatenate([b[0] for b in data])
    sites = find_dense_layers(mod)
    h1 = np.maximum(x @ sites[0].weight + sites[0].bias, 0)
    np.testing.assert_allclose(got["dense0"], x)
    np.testing.assert_allclose(got["dense1"], h1, rtol=1e-5, atol=1e-5)
    assert got["dense2"].shape == (16, 24)


def test_quantize_module_reports_each_layer_before_fitting_it():
    calls = []
    quantize_module(
        _module(),
        _data(),
        LQConfig(2, 2, finetune=False, check_layers=False),
        TARGET,
        progress=lambda *call: calls.append(call),
    )
    assert calls == [("dense0", 0, 3), ("dense1", 1, 3), ("dense2", 2, 3)]


@pytest.mark.parametrize("finetune", [False, True])
def test_quantize_module_tracks_the_float_model(finetune):
    mod = _module()
    result = quantize_module(mod, _data(), LQConfig(4, 4, finetune=finetune, check_layers=False), TARGET)
    assert [r.status for r in result.report] == ["lq", "lq", "lq"]
    assert [r.act_codes for r in result.report] == ["pm1", "01", "01"]
    assert result.lq_bytes < result.float_bytes / 2  # tiny layers: the 16-channel padding shows
    x = np.random.default_rng(9).normal(size=(4, SIZES[0])).astype(np.float32)
    want = _float_forward(mod, x)
    got = _float_forward(result.module, x)
    # 4-bit LQ levels keep ~10 % relative error per layer on Gaussian-like data; three layers compound.
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.35


def test_finetuning_lowers_the_output_error_at_two_bits():
    mod = _module()
    x = np.random.default_rng(10).normal(size=(4, SIZES[0])).astype(np.float32)
    want = _float_forward(mod, x)
    errors = {}
    for finetune in (False, True):
        config = LQConfig(2, 2, finetune=finetune, edge_bits=0, check_layers=False)
        result = quantize_module(mod, _data(256), config, TARGET)
        errors[finetune] = np.linalg.norm(_float_forward(result.module, x) - want)
    assert errors[True] < errors[False]


def test_keep_first_last_leaves_them_on_the_fp32_kernel():
    mod = _module()
    result = quantize_module(mod, _data(), LQConfig(2, 2, keep_first_last=True), TARGET)
    assert [r.status for r in result.report] == ["float", "lq", "float"]
    assert "keep_first_last" in result.report[0].reason
    text = result.module.script()
    assert "fp32_dense_dense0" in text and "lq_dense_dense1" in text and "fp32_dense_dense2" in text


def test_layers_apply_at_another_batch_size():
    result = quantize_module(_module(4), _data(), LQConfig(3, 2), TARGET)
    one = apply_layers(_module(1), result.layers, TARGET)
    four = result.module
    x = np.random.default_rng(2).normal(size=(4, SIZES[0])).astype(np.float32)
    np.testing.assert_allclose(_float_forward(one, x[:1]), _float_forward(four, x)[:1], rtol=1e-5, atol=1e-5)


def test_refit_recovers_scales_and_shift():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(500, 20))
    bits = rng.integers(0, 2, (2, 3, 20)).astype(np.uint8)
    scales = np.array([[0.5, 1.0], [0.2, 0.3], [1.0, 2.0]])
    signs = 2.0 * bits - 1.0
    target = x @ np.einsum("jon,oj->no", signs, scales) + np.array([0.1, -0.2, 0.3])
    got, shift = refit_weight_scales(x, bits, np.ones((3, 2)), target, ridge=1e-9)
    np.testing.assert_allclose(got, scales, rtol=1e-5)
    np.testing.assert_allclose(shift, [0.1, -0.2, 0.3], atol=1e-5)


def test_calibration_errors_are_user_errors():
    mod = _module()
    with pytest.raises(UserError, match="expected"):
        batches(mod, {"x": np.zeros((8, 3), np.float32)})
    with pytest.raises(UserError, match="less than one"):
        batches(mod, {"x": np.zeros((2, SIZES[0]), np.float32)})
    with pytest.raises(UserError, match="no array named"):
        batches(mod, {"a": np.zeros((8, SIZES[0])), "b": np.zeros(3)})
    with pytest.raises(UserError):
        LQConfig(wbits=0)


def test_convnet_quantizes_end_to_end_with_finetuning():
    from .models import convnet

    mod = from_onnx(convnet(batch=2), shape_dict={"x": [2, 3, 8, 8]})
    calib = {"x": np.random.default_rng(1).normal(size=(16, 3, 8, 8)).astype(np.float32)}
    result = quantize_module(mod, calib, LQConfig(4, 4, finetune=True), TARGET)
    assert [(r.name, r.status, r.m, r.n) for r in result.report] == [
        ("conv0", "lq", 128, 27),
        ("conv1", "lq", 32, 72),
        ("dense2", "lq", 2, 96),
    ]
    x = np.random.default_rng(2).normal(size=(2, 3, 8, 8)).astype(np.float32)
    want = _float_forward(mod, x)
    got = _float_forward(result.module, x)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.35


def test_defaults_widen_the_first_and_last_layer_and_report_each_layer():
    result = quantize_module(_module(), _data(256), LQConfig(1, 1), TARGET)
    first, middle, last = result.report
    assert (first.wbits, first.abits, last.wbits, last.abits) == (4, 4, 4, 4)
    assert "first/last dense layer: at least 4 bits" in first.reason
    for layer in result.report:
        assert layer.status == "lq" and layer.output_rel_error > 0 and layer.tried
        # the check passed each layer at its final width, or it would have been widened
        assert layer.output_rel_error <= layer.error_limit or (layer.wbits, layer.abits) == (4, 4)
    assert middle.upstream_rel_error > 0  # fine-tuned: its inputs come from the quantized first layer


def test_a_layer_whose_error_explodes_is_widened_then_left_in_float(monkeypatch):
    from tvm_memplan.lq import calibrate

    # a limit no fit can meet: every width is tried, then the float fallback applies
    monkeypatch.setattr(calibrate, "FLOAT_SCALE", 0.0)
    result = quantize_module(_module(), _data(), LQConfig(2, 2, error_scale=0.0, edge_bits=0), TARGET)
    first = result.report[0]
    assert first.status == "float" and "at W4A4 exceeds" in first.reason
    assert [t.split(":")[0] for t in first.tried] == ["W2A2", "W3A3", "W4A4"]
    assert "fp32_dense_dense0" in result.module.script()


def test_the_check_widens_only_past_the_limit():
    from tvm_memplan.lq.calibrate import error_limit

    assert error_limit(1, 1) > error_limit(2, 2) > error_limit(3, 3) > error_limit(4, 4) > 0
    loose = quantize_module(_module(), _data(), LQConfig(2, 2, error_scale=100.0, edge_bits=0), TARGET)
    assert [(r.wbits, r.abits, r.reason) for r in loose.report] == [(2, 2, "")] * 3
