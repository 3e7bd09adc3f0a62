"""Channel chains: found by the axis connection graph of the legalized TIR, split into tiles
that compute the same outputs."""

from dataclasses import replace

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_memplan.frontend import load_model, to_relax
from tvm_memplan.planner import plan_model
from tvm_memplan.relax.split import (
    axis_graph,
    chain_module,
    chain_signature,
    find_chains,
    normalize,
    program_of,
    split_chains,
)
from tvm_memplan.split.search import search
from tvm_memplan.split.simulate import SplitChoice, disjoint, peak, split_program

TARGET = tvm.target.Target({"kind": "llvm"})


def _run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, TARGET), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def _disjoint_chains(chains):
    chosen = []
    for chain in sorted(chains, key=lambda c: -c.tile_bytes):
        if disjoint(chosen + [chain]):
            chosen.append(chain)
    return chosen


@pytest.fixture(scope="module")
def mcu():
    return normalize(to_relax(load_model("zoo:mcu_cnn")))


def test_chains_of_mcu_cnn(mcu):
    chains = {c.head: c for c in find_chains(mcu) if not c.spatial}
    # conv1 -> bias -> relu -> pool -> depthwise -> bias -> relu, reduced by the next 1x1 conv
    first = chains["lv"]
    (branch,) = first.branches
    assert first.tail is not None and len(branch.mids) >= 4 and first.units == 8
    # the chain's tensors share one component of the axis connection graph along channels
    acg, _ = axis_graph(mcu)
    component = acg.component_of(first.head, 1)
    assert all(acg.component_of(name, 1) is component for name in branch.mids)
    assert acg.component_of(first.tail, 1) is not component


@pytest.mark.parametrize("parts", [2, 3, 8])
def test_split_model_computes_the_same_outputs(mcu, parts):
    chosen = _disjoint_chains(find_chains(mcu))
    split = split_chains(mcu, [SplitChoice(c, min(parts, c.units)) for c in chosen])
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")
    np.testing.assert_allclose(_run(split, x), _run(mcu, x), rtol=1e-4, atol=1e-5)


def test_overlapping_choices_are_refused(mcu):
    chains = find_chains(mcu)
    a = next(c for c in chains if c.tail is not None)
    b = next(c for c in chains if c.head == a.tail)
    with pytest.raises(ValueError, match="overlaps"):
        split_chains(mcu, [SplitChoice(a, 2), SplitChoice(b, 2)])


def test_importer_clip_kernels_are_raised_to_operators():
    mod = normalize(to_relax(load_model("zoo:mobilenet_v2?width=0.35&resolution=32")))
    text = mod["main"].script(show_meta=False)
    assert "R.call_tir" not in text and "R.minimum" in text
    chains = find_chains(mod)
    # expand 1x1 -> ReLU6 -> depthwise -> ReLU6, reduced by the projection
    assert any(c.tail is not None and len(c.branches[0].mids) >= 5 for c in chains)


@pytest.mark.parametrize(
    "spec, shape",
    [("zoo:squeezenet1_0?resolution=64", (1, 3, 64, 64)), ("zoo:googlenet?resolution=64", (1, 3, 64, 64))],
)
def test_concat_branches_split_together(spec, shape):
    """Fire and inception modules: branches meeting in a concat, pooled, reduced by the next conv."""
    mod = normalize(to_relax(load_model(spec)))
    groups = [c for c in find_chains(mod) if len(c.branches) > 1]
    assert groups
    chosen = _disjoint_chains(groups)
    split = split_chains(mod, [SplitChoice(c, 2) for c in chosen])
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    np.testing.assert_allclose(_run(split, x), _run(mod, x), rtol=1e-4, atol=1e-4)


def test_pool_branches_split_over_the_pooled_channels():
    """An inception module's pool branch: the pool of the module's input (kept whole for the other
    branches) is made tile by tile from slices of that input and reduced by its projection."""
    mod = normalize(to_relax(load_model("zoo:googlenet?resolution=64")))
    chains = [c for c in find_chains(mod) if not c.spatial]
    table = {b.var.name: b for block in mod["main"].body.blocks for b in block.bindings}
    pools = [c for c in chains if table[c.head].value.op.name == "relax.nn.max_pool2d"]
    assert pools and all(c.tail is not None for c in pools)
    nested = next(c for c in chains if len(c.branches) > 1 and any(b.pool for b in c.branches))
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype("float32")
    # a pool chain and, in another module, a concat chain whose pool branch's projection sums
    # partial convolutions of pooled slices (the pooled tensor never exists): same outputs
    other = next(c for c in pools if disjoint([c, nested]))
    split = split_chains(mod, [SplitChoice(other, 4), SplitChoice(nested, 2)])
    np.testing.assert_allclose(_run(split, x), _run(mod, x), rtol=1e-4, atol=1e-4)
    program = program_of(mod)
    pooled = next(program.tensor(b.pool) for b in nested.branches if b.pool)
    assert pooled not in split_program(program, [SplitChoice(nested, 2)]).sizes
    # a pool chain overlaps its module's concat chain: the search exchanges one for the other
    # where that lowers the peak, and ends lower than with neither kind of pool tiles
    with_pools = search(program, chains, 1.0, lambda c, n: 0.0, budget=1.0)
    plain = [replace(c, branches=tuple(replace(b, pool=None) for b in c.branches)) for c in chains if c not in pools]
    without = search(program, plain, 1.0, lambda c, n: 0.0, budget=1.0)
    assert disjoint([c.chain for c in with_pools.best.choices])
    assert with_pools.best.peak_bytes < without.best.peak_bytes


def test_simulated_peak_matches_the_planned_arena():
    model = load_model("zoo:mobilenet_v2?width=0.35&resolution=48")
    mod = normalize(to_relax(model))
    chosen = [SplitChoice(c, min(4, c.units)) for c in _disjoint_chains(find_chains(mod))]
    simulated = peak(split_program(program_of(mod), chosen)).bytes
    planned = plan_model(
        model, "llvm", prepare=lambda m: split_chains(normalize(m), chosen), order="program", inplace=True
    ).total("arena_bytes")
    unsplit = plan_model(model, "llvm", order="program").total("arena_bytes")
    assert planned < unsplit
    assert peak(program_of(mod)).bytes == unsplit
    # the simulator ignores in-place reuse and alignment: within a few percent of the planner
    assert abs(planned - simulated) <= 0.1 * simulated


def test_identical_blocks_share_a_signature():
    mod = normalize(to_relax(load_model("zoo:mobilenet_v2?width=0.35&resolution=48")))
    signatures = [chain_signature(chain_module(mod, c)) for c in find_chains(mod)]
    assert len(set(signatures)) < len(signatures)


def test_transformer_sequence_axis_is_a_candidate():
    """The analyser works on any TIR: in BERT-tiny the token (sequence) axis connects the
    projections, the attention and the feed-forward kernels."""
    mod = normalize(to_relax(load_model("zoo:bert_tiny")))
    acg, graph = axis_graph(mod)
    sequence = acg.component_of(mod["main"].params[0].name, 1)  # token ids (1, sequence)
    assert sequence in acg.candidates() and len(sequence.kernels) >= 10
    assert "spatial" in {n.kind for n in sequence.nodes}


def test_transformer_feed_forward_splits_into_row_tiles():
    """BERT-tiny at 32 tokens peaks in its feed-forward blocks: row chains (matmul, GELU, matmul,
    residual add, layer norm, all row-wise) run a few tokens at a time and compute the same."""
    model = load_model("zoo:bert_tiny?resolution=32")
    mod = normalize(to_relax(model))
    rows = [c for c in find_chains(mod) if c.rows]
    table = {b.var.name: b for block in mod["main"].body.blocks for b in block.bindings}
    assert any(any(table[n].value.op.name == "relax.erf" for n in c.bindings) for c in rows)  # the GELU inside
    chosen = [SplitChoice(c, 4) for c in _disjoint_chains(rows)]
    split = split_chains(mod, chosen)
    ids = np.random.default_rng(0).integers(0, 30000, (1, 32)).astype("int64")
    np.testing.assert_allclose(_run(split, ids), _run(mod, ids), rtol=1e-5, atol=1e-5)
    before = plan_model(model, "llvm").total("arena_bytes")
    after = plan_model(model, "llvm", prepare=lambda m: split_chains(normalize(m), chosen)).total("arena_bytes")
    assert after < before


def test_attention_splits_along_the_query_rows():
    """From a query projection the row chain spans the attention (scores against whole keys,
    softmax, context against whole values, the heads' transposes and reshapes) and the block
    after it; its tiles run once the keys and values exist, and compute the same."""
    model = load_model("zoo:bert_tiny?resolution=32")
    mod = normalize(to_relax(model))
    table = {b.var.name: b for block in mod["main"].body.blocks for b in block.bindings}
    attention = [c for c in find_chains(mod) if c.rows and c.anchor is not None]
    assert len(attention) == 2  # one per encoder layer
    for chain in attention:
        ops = [table[n].value.op.name for n in chain.bindings]
        assert {"relax.nn.softmax", "relax.permute_dims", "relax.reshape", "relax.nn.layer_norm"} <= set(ops)
        assert ops.count("relax.matmul") >= 5  # query, scores, context, output, feed-forward
        names = list(table)
        assert names.index(chain.anchor) > names.index(chain.head)
    # alone (as the measurer times it) the keys and values are parameters: the tiles run at the head
    alone = chain_module(mod, attention[0])
    tvm.compile(split_chains(alone, [SplitChoice(attention[0], 2)]), TARGET)
    # 8 tiles: in program order, fewer tiles keep the keys, values and more scores live than the
    # coarse plan does (the planner reorders them lower; the simulator orders only the coarse model)
    chosen = [SplitChoice(c, 8) for c in attention]
    split = split_chains(mod, chosen)
    ids = np.random.default_rng(0).integers(0, 30000, (1, 32)).astype("int64")
    np.testing.assert_allclose(_run(split, ids), _run(mod, ids), rtol=1e-5, atol=1e-5)
    program = program_of(mod)
    simulated = peak(split_program(program, chosen)).bytes
    assert simulated < peak(program).bytes
    before = plan_model(model, "llvm").total("arena_bytes")
    after = plan_model(model, "llvm", prepare=lambda m: split_chains(normalize(m), chosen)).total("arena_bytes")
    assert after == simulated and before == peak(program).bytes


def _exported_block(path) -> str:
    """An inverted-residual block as exporters write it when they fold nothing: BatchNormalization
    after each convolution, Clip with bounds from Constant nodes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def array(name, shape, scale=0.2, offset=0.0):
        return numpy_helper.from_array((offset + scale * rng.standard_normal(shape)).astype(np.float32), name)

    def batch_norm(name, source, out, channels):
        inits = [
            array(f"{name}_s", channels, 0.1, 1.0),
            array(f"{name}_b", channels, 0.1),
            array(f"{name}_m", channels, 0.1),
            numpy_helper.from_array((1 + 0.1 * rng.random(channels)).astype(np.float32), f"{name}_v"),
        ]
        return helper.make_node("BatchNormalization", [source] + [i.name for i in inits], [out]), inits

    bn1, inits1 = batch_norm("bn1", "c1", "n1", 96)
    bn2, inits2 = batch_norm("bn2", "c2", "n2", 96)
    nodes = [
        helper.make_node("Constant", [], ["lo"], value=numpy_helper.from_array(np.array(0.0, np.float32))),
        helper.make_node("Constant", [], ["hi"], value=numpy_helper.from_array(np.array(6.0, np.float32))),
        helper.make_node("Conv", ["x", "w1"], ["c1"]),
        bn1,
        helper.make_node("Clip", ["n1", "lo", "hi"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=96, strides=[2, 2]),
        bn2,
        helper.make_node("Clip", ["n2", "lo", "hi"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["y"]),
    ]
    inits = [array("w1", (96, 16, 1, 1)), array("w2", (96, 1, 3, 3)), array("w3", (24, 96, 1, 1)), array("b3", (24,))]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 28, 28])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24, 14, 14])],
        inits + inits1 + inits2,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, str(path))
    return str(path)


def test_unfolded_batch_norm_and_clip_from_constants_split(tmp_path):
    model = load_model(_exported_block(tmp_path / "block.onnx"))
    mod = normalize(to_relax(model))
    names = [b.var.name for block in mod["main"].body.blocks for b in block.bindings]
    assert len(names) == len(set(names))
    chain = next(c for c in find_chains(mod) if c.tail is not None)
    assert chain.head == names[0] and len(chain.branches[0].mids) >= 6  # BN, Clip, depthwise, BN, Clip
    x = np.random.default_rng(1).standard_normal((1, 16, 28, 28)).astype("float32")
    import onnxruntime as ort

    (reference,) = ort.InferenceSession(model.onnx_model.SerializeToString()).run(None, {"x": x})
    split = split_chains(mod, [SplitChoice(chain, 4)])
    np.testing.assert_allclose(_run(split, x), reference, rtol=1e-4, atol=1e-4)


def test_a_chain_whose_pool_shrinks_it_is_also_offered_without_partial_sums(mcu):
    """conv -> pool -> depthwise, reduced by a 1x1 conv: the search may tile it with partial sums
    of the tail or write the (pooled, smaller) last tensor tile by tile and run the tail whole."""
    variants = [c for c in find_chains(mcu) if c.head == "lv" and not c.spatial]
    assert sorted(c.tail is None for c in variants) == [False, True]
    whole_tail = next(c for c in variants if c.tail is None)
    assert whole_tail.bindings == tuple(n for n in next(c for c in variants if c.tail).bindings[:-1])
    x = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype("float32")
    np.testing.assert_allclose(
        _run(split_chains(mcu, [SplitChoice(whole_tail, 4)]), x), _run(mcu, x), rtol=1e-4, atol=1e-5
    )


def test_reshapes_are_views_in_the_simulator():
    """A reshape writes no tensor of its own (TVM rewrites it to a view): the simulator aliases it
    to its input, whatever its shape."""
    mod = normalize(to_relax(load_model("zoo:bert_tiny?resolution=16")))
    program = program_of(mod)
    reshapes = [
        b
        for block in mod["main"].body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call)
        and getattr(b.value.op, "name", "") == "relax.reshape"
        and isinstance(b.value.args[0], relax.Var)
        and b.value.args[0].name in program.sizes
    ]
    assert reshapes
    assert all(program.tensor(b.var.name) == program.tensor(b.value.args[0].name) for b in reshapes)


def _resnext_block(channels: int = 8, width: int = 16, groups: int = 4, size: int = 10) -> tvm.IRModule:
    """A ResNeXt bottleneck: 1x1 conv -> ReLU -> grouped 3x3 conv -> ReLU -> 1x1 conv."""
    rng = np.random.default_rng(0)

    def weight(*shape):
        return relax.const(rng.standard_normal(shape).astype("float32") * 0.3)

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, weight(width, channels, 1, 1))))
            g = bb.emit(relax.op.nn.conv2d(h, weight(width, width // groups, 3, 3), padding=1, groups=groups))
            g = bb.emit(relax.op.nn.relu(g))
            out = bb.emit_output(relax.op.nn.conv2d(g, weight(channels, width, 1, 1)))
        bb.emit_func_output(out)
    return normalize(bb.get())


def test_grouped_convolutions_join_a_channel_chain():
    """ResNeXt: the grouped convolution reads its input channels through ``f // per_group``; the axis
    connection graph joins them to its output channels, so the chain runs from the first 1x1
    convolution through the grouped one to the projection, in tiles of whole groups."""
    mod = _resnext_block()
    table = {b.var.name: b for block in mod["main"].body.blocks for b in block.bindings}
    chains = [c for c in find_chains(mod) if c.kind == "temporal"]
    grouped = [c for c in chains if any(getattr(table[m].value.attrs, "groups", 1) == 4 for m in c.branches[0].mids)]
    assert grouped, [c.name for c in chains]
    chain = grouped[0]
    assert chain.units == 4 and chain.tail is not None
    acg, _ = axis_graph(mod)
    assert acg.component_of(chain.head, 1) is acg.component_of(chain.branches[0].mids[-1], 1)
    x = np.random.default_rng(1).standard_normal((1, 8, 10, 10)).astype("float32")
    whole = _run(mod, x)
    for parts in (2, 4):
        split = split_chains(mod, [SplitChoice(chain, parts)])
        np.testing.assert_allclose(_run(split, x), whole, rtol=1e-4, atol=1e-4)
