import pytest
import tvm


@pytest.fixture(scope="session")
def target() -> tvm.target.Target:
    return tvm.target.Target("llvm")
