"""Run a Relax VM executable and record every storage allocation it requests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from ..deploy.targets import TARGETS
from ..errors import UserError


@dataclass
class AllocationTrace:
    """The byte sizes of the VM's ``alloc_storage`` calls, in order, and its ``ensure_zero_offset``
    calls (on OpenCL and Vulkan each one at a nonzero offset is a copy outside every plan)."""

    storage_bytes: list[int] = field(default_factory=list)
    zero_offset_calls: int = 0

    def instrument(self, func, func_symbol: str, before_run: bool, ret_value, *args) -> int:
        # vm.builtin.alloc_storage(ctx, Shape([nbytes]), device_index, dtype_hint, scope)
        if before_run and func_symbol == "vm.builtin.alloc_storage":
            self.storage_bytes.append(int(args[1][0]))
        elif before_run and func_symbol == "vm.builtin.ensure_zero_offset":
            self.zero_offset_calls += 1
        return 0


def flatten_outputs(value, session: tvm.rpc.RPCSession | None = None) -> list[np.ndarray]:
    """A VM result (a tensor or nested tuples of them) as a flat list of numpy arrays.

    Through an RPC session (``measure`` uses one even on this machine) a tuple result is an opaque
    remote object; its items are fetched one by one with the runtime's own ``ffi.ArraySize`` and
    ``ffi.ArrayGetItem``, which every TVM server has. (The VM's stateful ``get_outputs`` also works
    but kept the session, and so the device, from being given back.)"""
    if type(value).__name__ == "RPCObjectRef":
        if session is None:
            raise ValueError("a remote tuple result needs its RPC session to be unpacked")
        size = int(session.get_function("ffi.ArraySize")(value))
        item = session.get_function("ffi.ArrayGetItem")
        return [array for index in range(size) for array in flatten_outputs(item(value, index), session)]
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return [array for item in value for array in flatten_outputs(item, session)]
    return [value.numpy()]


def target_device(target: tvm.target.Target) -> tvm.runtime.Device:
    """Device 0 of the kind a build for ``target`` runs on (the CPU for llvm and c), so that a GPU
    build is run on its GPU; a one-line UserError when this machine has none."""
    kind = target.kind.name
    if kind in ("llvm", "c"):
        return tvm.cpu()
    known = TARGETS.get(kind)
    problem = known.runtime_problem() if known is not None else f"target {kind}: no device of this kind runs here"
    if problem:
        raise UserError(problem)
    return tvm.device(kind, 0)


def run_vm(
    executable: tvm.runtime.Executable,
    inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
    device: tvm.runtime.Device | None = None,
    function: str = "main",
) -> tuple[list[np.ndarray], AllocationTrace]:
    """Run ``function`` once on ``inputs`` and return its outputs and allocation trace."""
    device = device or tvm.cpu()
    vm = relax.VirtualMachine(executable, device)
    trace = AllocationTrace()
    vm.set_instrument(trace.instrument)
    arrays = list(inputs.values()) if isinstance(inputs, Mapping) else list(inputs)
    result = vm[function](*[tvm.runtime.tensor(a, device) for a in arrays])
    return flatten_outputs(result), trace
