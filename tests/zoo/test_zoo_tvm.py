"""Small zoo models import into TVM 0.27 Relax, compile with the default pipeline and match
onnxruntime.

Compile times observed on the project's 2-core machine (single process): mlp 0.2 s, mcu_cnn 1.2 s,
squeezenet1_0@32 5 s, mobilenet_v2 w0.35@32 15 s, nasnet_a_mobile@33 29 s. Bigger models are
checked by hand, not here (see the zoo report).
"""

from __future__ import annotations

import numpy as np
import pytest

from tvm_memplan import zoo

tvm = pytest.importorskip("tvm")
ort = pytest.importorskip("onnxruntime")
from tvm import relax  # noqa: E402
from tvm.relax.frontend.onnx import from_onnx  # noqa: E402


@pytest.fixture(scope="module")
def target():
    return tvm.target.Target.from_device("cpu")


def _check(spec: str, target) -> None:
    model = zoo.build_spec(spec)
    x = np.random.default_rng(7).standard_normal(zoo.input_shape(model)).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {"input": x})[0]

    mod = from_onnx(model, keep_params_in_input=False)
    ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    dev = tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    out = vm["main"](tvm.runtime.tensor(x, dev))
    out = out.numpy() if hasattr(out, "numpy") else out[0].numpy()
    assert out.shape == ref.shape
    scale = max(float(np.abs(ref).max()), 1.0)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.parametrize(
    "spec",
    [
        "zoo:mlp",
        "zoo:mlp?matmul=1",
        "zoo:mcu_cnn",
        "zoo:mcu_cnn?in_channels=1&resolution=28",
    ],
)
def test_tvm_matches_onnxruntime(spec, target):
    _check(spec, target)


@pytest.mark.slow
@pytest.mark.parametrize(
    "spec",
    [
        "zoo:squeezenet1_0?resolution=32",
        "zoo:mobilenet_v2?width=0.35&resolution=32",
        # odd size: Pad + strided Slice of the factorized reductions, asymmetric SAME pads
        "zoo:nasnet_a_mobile?resolution=33",
    ],
)
def test_tvm_matches_onnxruntime_slow(spec, target):
    _check(spec, target)
