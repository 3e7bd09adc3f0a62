"""Build a plan for TVM's C target, load the shared library and compare it with onnxruntime."""

import numpy as np
import onnxruntime as ort
import tvm
from tvm import relax


def assert_c_build_matches_onnxruntime(plan, model, tmp_path) -> None:
    path = str(tmp_path / "model.so")
    plan.build().export_library(path, options=["-O2"])
    vm = relax.VirtualMachine(tvm.runtime.load_module(path), tvm.cpu())
    inputs = model.random_inputs(0)
    out = vm["main"](*[tvm.runtime.tensor(v) for v in inputs.values()]).numpy()
    (reference,) = ort.InferenceSession(model.onnx_model.SerializeToString()).run(None, inputs)
    np.testing.assert_allclose(out, reference, rtol=1e-3, atol=1e-4)
