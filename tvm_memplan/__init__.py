"""tvm_memplan: memory planning passes for Apache TVM Relax.

``tvm.compile(mod, target, relax_pipeline=tvm_memplan.pipeline(target))`` swaps TVM's
whole-buffer planner for an offset arena that reaches the liveness lower bound.
"""

from __future__ import annotations

import sys
from typing import Any

__version__ = "0.1.0"


def pipeline(target: Any = None, **options: Any):
    """TVM's default Relax pipeline for ``target`` with the memplan passes in place of SPBM."""
    from .relax.pipeline import pipeline as _pipeline

    return _pipeline(target, **options)


from . import errors  # noqa: E402
from .options import MemplanOptions, config  # noqa: E402

if "tvm" in sys.modules:  # TVM came first: give it the GPU runtimes setup-gpu installed (else its entry point does)
    from .backends.runtimes import load_installed as _load_gpu_runtimes

    _load_gpu_runtimes()

__all__ = ["MemplanOptions", "__version__", "config", "errors", "pipeline"]
