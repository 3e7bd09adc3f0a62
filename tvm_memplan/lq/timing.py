"""Timing the LQ benchmark's functions alike: TVM VM calls and PrimFuncs with TVM's
``time_evaluator``, numpy calls with the same repeat structure (median of repeats)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax


@dataclass(frozen=True)
class Timing:
    """How long to time each function: TVM's time_evaluator arguments."""

    number: int = 10
    repeat: int = 7
    min_repeat_ms: int = 50


def thread_count() -> int:
    """TVM's pool uses one thread unless TVM_NUM_THREADS is set."""
    return int(os.environ.get("TVM_NUM_THREADS", "1"))


def time_vm(vm: relax.VirtualMachine, args: Sequence[tvm.runtime.Tensor], timing: Timing) -> float:
    """Median µs of a whole ``main`` call."""
    result = vm.time_evaluator(
        "main", tvm.cpu(), number=timing.number, repeat=timing.repeat, min_repeat_ms=timing.min_repeat_ms
    )(*args)
    return float(result.median) * 1e6


def time_kernel(
    lib: tvm.runtime.Module, args: Sequence[tvm.runtime.Tensor], timing: Timing, best: bool = False
) -> float:
    """Median µs of a PrimFunc call; ``best``: the fastest repeat instead (what a limit probe wants,
    since other processes on a shared machine only ever slow a repeat down)."""
    result = lib.time_evaluator(
        lib.entry_name, tvm.cpu(), number=timing.number, repeat=timing.repeat, min_repeat_ms=timing.min_repeat_ms
    )(*args)
    return float(min(result.results) if best else result.median) * 1e6


def time_numpy(fn: Callable[[], object], timing: Timing) -> float:
    """Median µs of a numpy call, best of OpenBLAS on one thread and on all threads.

    On this VM OpenBLAS with two threads is 4x slower than with one at M=64 (its threads fight
    TVM's still-spinning pool workers), so the baseline gets whichever is faster.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # scikit-learn brings it; without it numpy keeps its default threads
        return _time_call(fn, timing)
    best = float("inf")
    for threads in sorted({1, thread_count()}):
        with threadpool_limits(limits=threads, user_api="blas"):
            best = min(best, _time_call(fn, timing))
    return best


def _time_call(fn: Callable[[], object], timing: Timing) -> float:
    """Median µs of ``fn`` with the same repeat structure as time_evaluator."""
    fn()
    number = timing.number
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    number = max(number, int(timing.min_repeat_ms / 1e3 / max(once, 1e-9)) + 1)
    samples = []
    for _ in range(timing.repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
    return float(np.median(samples)) * 1e6
