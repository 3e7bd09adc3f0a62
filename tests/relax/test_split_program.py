"""``main`` as the splitter's simulator reads it: in the order the planner runs it, its simulated peak
is the arena the planner plans for the unsplit model (fusion, in-place kernels, concat elimination)."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_memplan.frontend import load_model, to_relax
from tvm_memplan.planner import plan_model
from tvm_memplan.relax.split import find_chains, in_order, memory_order, normalize, program_of, split_chains
from tvm_memplan.split.simulate import SplitChoice, peak, split_program

from .modules import compile_and_run, random_weights


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


def _two_convs(channels: int) -> tvm.IRModule:
    """x (``channels`` x 16 x 16) -> 3x3 conv to 4 channels -> ReLU -> 3x3 conv to 4 channels, returned."""
    const = random_weights(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, channels, 16, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, const(4, channels, 3, 3), padding=1))))
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(y, const(4, 4, 3, 3), padding=1)))
        bb.emit_func_output(out)
    return normalize(bb.get())


@pytest.mark.parametrize("channels", [3, 4, 8])
def test_the_simulated_blocked_peak_counts_the_layout_copies_at_the_edges(channels):
    """A blocked build (NCHW4c on plain LLVM) writes the returned tensor blocked into the arena before
    transforming it to NCHW, and copies an input whose channels fill whole blocks into the arena as
    NCHW4c (3 channels are read in place as NCHW1c): the simulator counts both. Split into row tiles, no whole
    copy is made: each tile slices its rows of the NCHW input and transforms the slice, both live at the
    transform. The 3-channel tiles' arena is 1 KiB over the simulated peak (the planner's offsets)."""
    mod = _two_convs(channels)
    target = tvm.target.Target({"kind": "llvm"})
    x = np.random.default_rng(0).standard_normal((1, channels, 16, 16)).astype("float32")
    _, trace = compile_and_run(mod, target, x, layout="blocked")
    program = program_of(mod, block=4)
    assert peak(program).bytes == trace.storage_bytes[0]
    tensor, copied = 4 * 4 * 16 * 16, 4 * channels * 16 * 16 if channels % 4 == 0 else 0
    assert peak(program).bytes == max(2 * tensor, copied + tensor)  # the ReLU's and the returned tensor's
    chain = max((c for c in find_chains(mod, 4) if not c.gathered), key=lambda c: len(c.spatial))
    choice = SplitChoice(chain, 4)
    _, split = compile_and_run(split_chains(mod, [choice], windows_in_place=False), target, x, layout="blocked")
    simulated = peak(split_program(program, [choice])).bytes
    if copied:
        assert simulated == split.storage_bytes[0]
    else:
        assert split.storage_bytes[0] - 1024 <= simulated <= split.storage_bytes[0]
