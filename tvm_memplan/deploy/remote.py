"""The device side of RPC: a tracker and a server that can report the VM's storage requests.

Why a remote-side function: ``vm.set_instrument`` needs a callback in the process that runs the
VM, and TVM RPC cannot pass a client-side function to the server ("Cannot pass type ffi.Function
as an argument to the remote"). Tracing a local run of the same artifact is no substitute for a
cross-compiled one (an aarch64 library does not load here). So servers started by this module
register ``tvm_memplan.vm_alloc_trace``, which runs the VM once on the device with the
instrument and returns the requested byte sizes; a stock TVM server (for example the Android RPC
app) lacks it, and ``measure`` then reports the requested bytes as unknown.

This file imports only TVM so it runs unchanged on a device that has the ``apache-tvm`` wheel
and nothing else (the emulated arm64 device runs it by path):

    python remote.py tracker --port 9190 [--lifetime S]
    python remote.py server --tracker 127.0.0.1:9190 --key local [--lifetime S]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

TRACE_FUNCTION = "tvm_memplan.vm_alloc_trace"


DEVICE_KINDS = ("opencl", "vulkan", "cuda", "rocm", "metal", "webgpu")
"""Module kinds that hold device kernels."""


def kernel_counter(executable_module):
    """``count(symbol)``: the kernels one VM call of ``symbol`` launches. On a GPU, the device
    kernels TVM split out of that function (``SYMBOL_kernel``, ``SYMBOL_kernel_1``, ...); on a CPU,
    1 for a compiled function; 0 for the VM's builtins."""
    modules = executable_module._collect_from_import_tree(lambda m: True)  # noqa: SLF001 - TVM has no public walk
    devices = [m for m in modules if m.kind in DEVICE_KINDS]
    counts: dict[str, int] = {}

    def count(symbol: str) -> int:
        if symbol not in counts:
            found = 0
            while any(m.implements_function(f"{symbol}_kernel" + (f"_{found}" if found else "")) for m in devices):
                found += 1
            counts[symbol] = found or int(not devices and any(m.implements_function(symbol) for m in modules))
        return counts[symbol]

    return count


def alloc_trace(executable_module, device, *inputs) -> tuple[list[int], int, int]:
    """Run ``main`` once: the byte size of every ``vm.builtin.alloc_storage`` call, the number of
    ``vm.builtin.ensure_zero_offset`` calls (on OpenCL/Vulkan each at a nonzero offset is a copy),
    and the kernel launches (see :func:`kernel_counter`)."""
    from tvm import relax

    sizes: list[int] = []
    zero_offset_calls = 0
    launches = 0
    kernels = kernel_counter(executable_module)

    def instrument(func, func_symbol, before_run, ret_value, *args) -> int:
        nonlocal zero_offset_calls, launches
        # vm.builtin.alloc_storage(ctx, Shape([nbytes]), device_index, dtype_hint, scope)
        if before_run and func_symbol == "vm.builtin.alloc_storage":
            sizes.append(int(args[1][0]))
        elif before_run and func_symbol == "vm.builtin.ensure_zero_offset":
            zero_offset_calls += 1
        elif before_run and not func_symbol.startswith("vm.builtin."):
            launches += kernels(func_symbol)
        return 0

    vm = relax.VirtualMachine(executable_module, device)
    vm.set_instrument(instrument)
    vm["main"](*inputs)
    return sizes, zero_offset_calls, launches


def register_trace_function() -> None:
    """Register :data:`TRACE_FUNCTION`, returning JSON (RPC carries strings, not lists or dicts):
    ``{"storage": [bytes, ...], "zero_offset_calls": n, "launches": n, "tvm_num_threads": "2" or null}``
    from the device's side."""
    import tvm

    def trace(mod, dev, *inputs) -> str:
        storage, zero_offset_calls, launches = alloc_trace(mod, dev, *inputs)
        return json.dumps(
            {
                "storage": storage,
                "zero_offset_calls": zero_offset_calls,
                "launches": launches,
                "tvm_num_threads": os.environ.get("TVM_NUM_THREADS"),
            }
        )

    tvm.register_global_func(TRACE_FUNCTION, trace, override=True)


def _wait(lifetime: float, parent: int) -> None:
    """Sleep until ``lifetime`` passes or the process that started us is gone: never outlive a test."""
    deadline = time.monotonic() + lifetime
    while time.monotonic() < deadline and (parent <= 1 or _alive(parent)):
        time.sleep(0.5)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["tracker", "server"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--port", type=int, default=9190, help="first port to try (default 9190; the farm starts servers at 9090)"
    )
    parser.add_argument("--tracker", help="HOST:PORT of the tracker to register with (server)")
    parser.add_argument("--key", default="local", help="device key the server registers under")
    parser.add_argument("--lifetime", type=float, default=3600.0, help="exit after this many seconds")
    parser.add_argument("--parent-pid", type=int, default=0, help="exit when this process is gone")
    args = parser.parse_args(argv)

    from tvm import rpc
    from tvm.rpc.tracker import Tracker

    if args.role == "tracker":
        process = Tracker(args.host, port=args.port, port_end=args.port + 200, silent=True)
        print(f"tracker {args.host}:{process.port}", flush=True)
    else:
        if not args.tracker:
            parser.error("server needs --tracker HOST:PORT")
        host, port = args.tracker.rsplit(":", 1)
        process = rpc.Server(
            args.host,
            port=args.port,
            port_end=args.port + 200,
            tracker_addr=(host, int(port)),
            key=args.key,
            silent=True,
            server_init_callback=register_trace_function,
        )
        print(f"server {args.host}:{process.port} key={args.key}", flush=True)
    try:
        _wait(args.lifetime, args.parent_pid)
    except KeyboardInterrupt:
        pass
    finally:
        process.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
