"""Named deploy targets: what the cuda target needs to compile its kernels, checked without a GPU."""

import pytest

from tvm_memplan.deploy import targets
from tvm_memplan.errors import UserError


@pytest.fixture
def no_nvcc(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no nvcc on PATH


def test_with_the_cuda_runtime_nvrtc_needs_cuda_bindings_not_nvcc(monkeypatch, no_nvcc):
    monkeypatch.setattr(targets, "_cuda_runtime_loaded", lambda: True)
    monkeypatch.delenv("TVM_CUDA_COMPILE_MODE", raising=False)
    monkeypatch.setattr(targets, "_cuda_bindings_installed", lambda: True)
    assert targets.cuda_compiler_problem() is None
    monkeypatch.setattr(targets, "_cuda_bindings_installed", lambda: False)
    problem = targets.cuda_compiler_problem()
    assert "cuda-bindings" in problem and "TVM_CUDA_COMPILE_MODE=nvcc" in problem
    with pytest.raises(UserError, match="target cuda: .*cuda-bindings") as raised:
        targets.get_target("cuda").check_codegen()
    assert "\n" not in str(raised.value)


def test_nvcc_mode_or_no_cuda_runtime_needs_nvcc(monkeypatch, no_nvcc):
    monkeypatch.setattr(targets, "_cuda_bindings_installed", lambda: True)
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")
    for loaded in (True, False):
        monkeypatch.setattr(targets, "_cuda_runtime_loaded", lambda loaded=loaded: loaded)
        assert "nvcc not found" in targets.cuda_compiler_problem()
    monkeypatch.delenv("TVM_CUDA_COMPILE_MODE")
    assert "nvcc not found" in targets.cuda_compiler_problem()  # no runtime: the nvcc requirement as before
