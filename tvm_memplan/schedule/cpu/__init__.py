"""Default CPU schedule rules, tried in order (:data:`DEFAULT_RULES`).

TVM 0.27's ``cpu_generic`` pipeline leaves convolutions, matmuls and pools as plain loop nests.
Five rules cover what the fused kernels of CNNs and transformers contain, after two for the int8
convolutions of CPUs with a dot-product instruction: regular ones lowered in its layout
(:class:`Int8Smlad` on a Cortex-M with the DSP extension, :class:`Int8DotProduct` elsewhere) and
depthwise ones on int32 vectors (:class:`Int8Depthwise`):

* :class:`BlockedConv` — a convolution in a blocked channel layout (NCHW[x]c) with its epilogue;
* :class:`TiledReduction` — one reduction block with injective producers and an elementwise
  epilogue (conv, depthwise/grouped conv, matmul, dense, pooling), register-tiled;
* :class:`RowWise` — softmax over the last axis, every step per row (`exp` once per element);
* :class:`Spatial` — injective kernels (elementwise, transpose, concat, pad);
* :class:`Generic` — anything else with reductions (layer norm, global pooling, sums).

Each is a dlight ``ScheduleRule``: it schedules the whole function or declines (None).
"""

from .base import CPUScheduleRule
from .blocked_conv import BlockedConv
from .generic import Generic
from .int8_depthwise import Int8Depthwise
from .int8_dot import Int8DotProduct
from .int8_smlad import Int8Smlad
from .row_wise import RowWise
from .spatial import Spatial
from .spec import CpuSpec, cpu_spec
from .tiled_reduction import TiledReduction

DEFAULT_RULES: tuple[CPUScheduleRule, ...] = (
    Int8Smlad(),
    Int8DotProduct(),
    Int8Depthwise(),
    BlockedConv(),
    TiledReduction(),
    RowWise(),
    Spatial(),
    Generic(),
)

__all__ = [
    "DEFAULT_RULES",
    "BlockedConv",
    "CPUScheduleRule",
    "CpuSpec",
    "Generic",
    "Int8Depthwise",
    "Int8DotProduct",
    "Int8Smlad",
    "RowWise",
    "Spatial",
    "TiledReduction",
    "cpu_spec",
]
