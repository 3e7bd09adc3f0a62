"""tvm_memplan: memory planning passes for Apache TVM Relax.

``tvm.compile(mod, target, relax_pipeline=tvm_memplan.pipeline(target))`` swaps TVM's
whole-buffer planner for an offset arena that reaches the liveness lower bound.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def pipeline(target: Any = None, **options: Any):
    """TVM's default Relax pipeline for ``target`` with the memplan passes in place of SPBM."""
    from .relax.pipeline import pipeline as _pipeline

    return _pipeline(target, **options)


from . import errors  # noqa: E402
from .options import MemplanOptions, config  # noqa: E402

__all__ = ["MemplanOptions", "__version__", "config", "errors", "pipeline"]
