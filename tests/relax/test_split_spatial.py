"""Spatial chains: convolutions, pools and their epilogues cut into row tiles with halos compute
the same outputs, and the planner's arena for the split model is what the simulator predicted."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_memplan.planner import plan_model
from tvm_memplan.relax.split import find_chains, normalize, program_of, split_chains
from tvm_memplan.split.simulate import SplitChoice, peak, split_program

from .modules import compile_and_run, random_weights

TARGET = tvm.target.Target({"kind": "llvm"})
SHAPE = (1, 3, 33, 30)


def _stem_module() -> tvm.IRModule:
    """A strided stem with odd sizes, a depthwise conv, a max pool in ceil mode, a 1x1 projection
    with a residual add of a tensor from before the chain, a SiLU diamond, and a consumer."""
    const = random_weights(0)

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            side = bb.emit(relax.op.nn.conv2d(x, const(4, 3, 3, 3), strides=4))  # 4x8x7
            y = bb.emit(relax.op.nn.conv2d(x, const(8, 3, 3, 3), strides=2, padding=1))
            y = bb.emit(relax.op.add(y, const(1, 8, 1, 1)))
            y = bb.emit(relax.op.clip(y, 0.0, 6.0))
            y = bb.emit(relax.op.nn.conv2d(y, const(8, 1, 3, 3), padding=1, groups=8))
            y = bb.emit(relax.op.multiply(y, bb.emit(relax.op.sigmoid(y))))
            y = bb.emit(relax.op.nn.max_pool2d(y, pool_size=3, strides=2, ceil_mode=True))
            y = bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(y, const(4, 8, 1, 1))), side))
            y = bb.emit(relax.op.nn.conv2d(y, const(6, 4, 3, 3), padding=1))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return normalize(bb.get())


def _run(mod: tvm.IRModule, x: np.ndarray):
    return compile_and_run(mod, TARGET, x)


@pytest.fixture(scope="module")
def stem():
    return _stem_module()


def _longest(mod, windows: int = 4, gathered: bool = False):
    """The longest spatial chain with ``windows`` convolutions and pools."""
    chains = [
        c
        for c in find_chains(mod)
        if sum(op.window is not None for op in c.spatial) == windows and c.gathered == gathered
    ]
    return max(chains, key=lambda c: len(c.spatial))


def test_spatial_chains_span_windows_and_their_epilogues(stem):
    chain = _longest(stem)
    kinds = [op.window is not None for op in chain.spatial]
    assert sum(kinds) == 4  # stem conv, depthwise, pool, projection
    # and the last conv; from the side convolution, the stem convolution is a sibling (both read x)
    assert max(sum(op.window is not None for op in c.spatial) for c in find_chains(stem)) == 6
    # the residual operand comes from outside the chain and is read row by row
    assert any(op.outside and op.window is None for op in chain.spatial)
    assert chain.units == 8  # rows of the chain's last tensor
    assert chain.parts_ladder() == [2, 4, 8]


@pytest.mark.parametrize("parts, gathered", [(2, False), (3, False), (8, False), (3, True)])
def test_row_tiles_compute_the_same_outputs(stem, parts, gathered):
    x = np.random.default_rng(1).standard_normal(SHAPE).astype("float32")
    (expected,), _ = _run(stem, x)
    (got,), _ = _run(split_chains(stem, [SplitChoice(_longest(stem, gathered=gathered), parts)]), x)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_small_last_tensor_is_also_offered_gathered(stem):
    """The last tensor (4x8x7) is far smaller than the stem's (8x17x15): the chain is also offered
    with its last tiles kept and concatenated once, which the simulator prices at the end."""
    chain, gathered = _longest(stem), _longest(stem, gathered=True)
    assert gathered.spatial == chain.spatial and gathered.name.endswith("(rows, gathered)")
    program = program_of(stem)
    split = split_program(program, [SplitChoice(gathered, 4)])
    assert [s.name for s in split.steps if s.name.startswith(("write#", "gather#"))] == [f"gather#{chain.head}"]
    assert not [s for s in split_program(program, [SplitChoice(chain, 4)]).steps if s.name.startswith("gather#")]


@pytest.mark.parametrize("gathered", [False, True])
def test_vm_requests_equal_the_plan_and_the_simulator_is_close(stem, gathered):
    chain = _longest(stem, gathered=gathered)
    choice = SplitChoice(chain, 3)
    split = split_chains(stem, [choice])
    x = np.random.default_rng(2).standard_normal(SHAPE).astype("float32")
    _, trace = _run(split, x)
    _, unsplit_trace = _run(stem, x)
    simulated = peak(split_program(program_of(stem), [choice])).bytes
    arena = trace.storage_bytes[0]
    assert arena < unsplit_trace.storage_bytes[0]
    # alignment and the planner's in-place reuse: within a few percent of the simulator
    assert abs(arena - simulated) <= 0.1 * simulated


def test_mobilenet_stem_and_first_block_split_spatially_verify():
    from tvm_memplan.frontend import load_model
    from tvm_memplan.verify import verify_plan

    model = load_model("zoo:mobilenet_v2?width=0.35&resolution=48")

    def best(mod):
        program = program_of(mod)
        return min(
            (SplitChoice(c, 4) for c in find_chains(mod) if c.spatial),
            key=lambda choice: peak(split_program(program, [choice])).bytes,
        )

    def prepare(mod):
        mod = normalize(mod)
        return split_chains(mod, [best(mod)])

    plan = plan_model(model, "llvm", prepare=prepare, order="program")
    assert plan.total("arena_bytes") < plan_model(model, "llvm", order="program").total("arena_bytes")
    result = verify_plan(plan)  # vs stock TVM and onnxruntime, VM requests vs the plan
    assert result.ok, result.problems


INCEPTION_SHAPE = (1, 3, 26, 20)


def _inception_module() -> tvm.IRModule:
    """A stem, an inception module (a 1x1 branch, a 1x1 then 3x3 branch, a 3x3 max pool then 1x1
    branch, joined by a channel concat) and a strided pool after it, as GoogLeNet repeats them."""
    const = random_weights(3)

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(INCEPTION_SHAPE, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            stem = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, const(8, 3, 3, 3), padding=1))))
            a = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(stem, const(4, 8, 1, 1)))))
            b = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(stem, const(4, 8, 1, 1)))))
            b = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(b, const(6, 4, 3, 3), padding=1))))
            c = bb.emit(relax.op.nn.max_pool2d(stem, pool_size=3, strides=1, padding=1))
            c = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(c, const(2, 8, 1, 1)))))
            y = bb.emit(relax.op.concat([a, b, c], axis=1))
            y = bb.emit(relax.op.nn.max_pool2d(y, pool_size=3, strides=2, ceil_mode=True))
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(y, const(5, 12, 1, 1))))
        bb.emit_func_output(out)
    return normalize(bb.get())


@pytest.fixture(scope="module")
def inception():
    return _inception_module()


def _through_concat(mod, gathered: bool = False):
    """The longest spatial chain that joins branches in a concat."""
    chains = [c for c in find_chains(mod) if c.spatial and c.gathered == gathered and _joins(c)]
    return max(chains, key=lambda c: len(c.spatial))


def _joins(chain) -> bool:
    return any(len(op.reads) > 1 and op.window is None and not op.outside for op in chain.spatial)


def test_spatial_chains_run_through_an_inception_module(inception):
    """The branches start from the chain's own tensor or from its input (siblings of the head), meet
    in the concat, and go on through the strided pool: the halo counts windows along the deepest
    path (here stem, 1x1, 3x3, pool), not every window."""
    chain = _through_concat(inception)
    # stem, the branches' five convolutions and pools, the strided pool and the last convolution: 8 windows,
    # 4 on the deepest path
    assert sum(op.window is not None for op in chain.spatial) == 8
    assert chain.units == 13  # the pooled rows
    branches = find_chains(inception)
    sibling_heads = [c for c in branches if c.spatial and _joins(c) and str(c.spatial[0].outside[0]) != "x"]
    # from the stem's output: the 1x1 branch's convolution heads it, the other two branches are its siblings
    assert sibling_heads and all(sum(bool(op.window and op.outside) for op in c.spatial) == 3 for c in sibling_heads)


@pytest.mark.parametrize("parts, rolling", [(2, False), (3, False), (4, True)])
def test_inception_row_tiles_compute_the_same_outputs(inception, parts, rolling):
    x = np.random.default_rng(4).standard_normal(INCEPTION_SHAPE).astype("float32")
    (expected,), _ = _run(inception, x)
    choice = SplitChoice(_through_concat(inception), parts, rolling=rolling)
    (got,), trace = _run(split_chains(inception, [choice]), x)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_inception_tiles_lower_the_arena_as_simulated(inception):
    choice = SplitChoice(_through_concat(inception), 4)
    x = np.random.default_rng(5).standard_normal(INCEPTION_SHAPE).astype("float32")
    _, trace = _run(split_chains(inception, [choice]), x)
    _, unsplit_trace = _run(inception, x)
    simulated = peak(split_program(program_of(inception), [choice])).bytes
    assert trace.storage_bytes[0] < unsplit_trace.storage_bytes[0]
    assert abs(trace.storage_bytes[0] - simulated) <= 0.1 * simulated
