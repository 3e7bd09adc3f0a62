"""Fine-grained splitting (docs/design.md, "Fine-grained splitting"), TVM-free: loop-nest model, axis
connection graph, the chains, memory simulator and the search. The Relax analyser and rewriter are in
:mod:`tvm_memplan.relax.split`; latency measurement in :mod:`tvm_memplan.deploy.chain_latency`."""
