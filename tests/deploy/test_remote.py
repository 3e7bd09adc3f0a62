"""The device-side trace counts kernel launches: device kernels on a GPU, compiled functions on a CPU."""

from __future__ import annotations

import tvm
from tvm.script import tirx as T

from tvm_memplan.deploy.remote import kernel_counter

from ..backends.conftest import needs_device
from ..relax.test_fusion import two_kernels


@T.prim_func
def double(a: T.Buffer((8,), "float32"), b: T.Buffer((8,), "float32")):
    for i in range(8):
        b[i] = a[i] * T.float32(2)


def test_a_cpu_function_is_one_launch_and_a_vm_builtin_none():
    count = kernel_counter(tvm.compile(tvm.IRModule({"double": double}), target="llvm").mod)
    assert count("double") == 1
    assert count("vm.builtin.alloc_storage") == 0


@needs_device("opencl")
def test_a_gpu_function_launches_each_of_its_device_kernels():
    target = tvm.target.Target({"kind": "opencl", "host": "llvm"})
    kernels = tvm.IRModule({"two_kernels": two_kernels.with_attr("global_symbol", "two_kernels")})
    count = kernel_counter(tvm.compile(kernels, target=target).mod)
    assert count("two_kernels") == 2
    assert count("vm.builtin.alloc_storage") == 0
