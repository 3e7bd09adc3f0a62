"""Fine-grained splitting on Relax (docs/design.md, "Fine-grained splitting"): normalize the module,
find the chains the axis connection graph joins (channel, row and spatial chains), rewrite the
chosen ones into tiles, and model ``main`` for the memory simulator.

- :mod:`.normalize`: constants folded, importer kernels raised to operators, batch norms folded;
- :mod:`.index`: :class:`~.index.FunctionIndex`, ``main`` as the chain finders read it;
- :mod:`.chains`: the chain finders (channel and row chains; :mod:`.spatial_chains` the spatial ones);
- :mod:`.rewrite`: the tiles in the high-level module;
- :mod:`.program`: ``main`` as a simulator program, in the order the planner would run it;
- :mod:`.measure`: chains as modules of their own for latency measurement.
"""

from .chains import find_chains
from .index import FunctionIndex, axis_graph
from .measure import chain_module, chain_signature, describe_tensors
from .normalize import normalize
from .program import in_order, memory_order, program_of
from .rewrite import split_chains

__all__ = [
    "FunctionIndex",
    "axis_graph",
    "chain_module",
    "chain_signature",
    "describe_tensors",
    "find_chains",
    "in_order",
    "memory_order",
    "normalize",
    "program_of",
    "split_chains",
]
