"""``main`` as the splitter's simulator reads it: in the order the planner runs it, its simulated peak
is the arena the planner plans for the unsplit model (fusion, in-place kernels, concat elimination)."""

import pytest
import tvm

from tvm_memplan.frontend import load_model, to_relax
from tvm_memplan.planner import plan_model
from tvm_memplan.relax.split import in_order, memory_order, normalize, program_of
from tvm_memplan.split.simulate import peak


@pytest.mark.parametrize(
    "spec",
    [
        "zoo:mcu_cnn",
        "zoo:bert_tiny",
        "zoo:squeezenet1_0?resolution=64",
        "zoo:densenet121?resolution=32",  # concats fused with the batch norm after them
    ],
)
def test_the_simulated_peak_is_the_planned_arena(spec):
    model = load_model(spec)
    mod = normalize(to_relax(model))
    ordered = in_order(mod, memory_order(mod, 2.0))
    # the simulator models the NCHW module the splitter tiles
    assert peak(program_of(ordered)).bytes == plan_model(model, order_seconds=2, layout="nchw").total("arena_bytes")


def test_bert_tiny_is_simulated_in_the_planners_order():
    """BERT-tiny in program order peaks while the scores, the queries, keys and values are all live;
    the planner computes the values after the scores, and so does the simulator's order."""
    model = load_model("zoo:bert_tiny")
    mod = normalize(to_relax(model))
    order = memory_order(mod, 2.0)
    names = [s.name for s in program_of(mod).steps]
    assert sorted(order) == sorted(names) and order != names
    assert peak(program_of(mod)).bytes > peak(program_of(in_order(mod, order))).bytes
    with pytest.raises(ValueError, match="every binding"):
        in_order(mod, order[1:])


@pytest.mark.parametrize("spec", ["zoo:bert_tiny", "zoo:mcu_cnn"])
def test_the_simulated_blocked_peak_is_the_planned_blocked_arena(spec):
    """In a blocked build only what follows a convolution is blocked: BERT-tiny's 4-D attention tensors
    (two heads) stay NCHW, unpadded, so its blocked peak is its NCHW arena; mcu_cnn's 8-channel
    convolution outputs take a block of 16."""
    model = load_model(spec)
    mod = normalize(to_relax(model))
    ordered = in_order(mod, memory_order(mod, 2.0, block=16))
    avx512 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
    planned = plan_model(model, order_seconds=2, layout="blocked", target=avx512).total("arena_bytes")
    assert peak(program_of(ordered, block=16)).bytes == planned
