"""Spatial chains of an int8 (QDQ) model: the row tiles go through ``LowerQDQ`` as the whole model does,
so every tile runs the integer kernels and the split build's outputs are bit for bit the unsplit int8
build's; the VM's requests equal the plan, and the 1-byte arena shrinks."""

import numpy as np
import onnx
import pytest
import tvm

from tvm_memplan.frontend import load_model, to_relax
from tvm_memplan.planner import plan_model
from tvm_memplan.quant.lower import LowerQDQ
from tvm_memplan.relax.ir_utils import top_level_bindings
from tvm_memplan.relax.pipeline import pipeline
from tvm_memplan.relax.split import (
    chain_module,
    find_chains,
    in_order,
    memory_order,
    normalize,
    program_of,
    split_chains,
)
from tvm_memplan.relax.split.normalize import constant_bindings
from tvm_memplan.split.chain import SpatialChain
from tvm_memplan.split.simulate import SplitChoice, peak, split_program
from tvm_memplan.verify import verify_plan
from tvm_memplan.verify.run import run_vm

from ..quant import models

TARGET = tvm.target.Target({"kind": "llvm"})


@pytest.fixture(scope="module")
def int8_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("int8split") / "early.int8.onnx"
    onnx.save(models.quantize_qdq(models.early_activation()), str(path))
    return load_model(str(path))


@pytest.fixture(scope="module")
def normalized(int8_model):
    return normalize(to_relax(int8_model))


def _run(mod: tvm.IRModule, x: np.ndarray):
    with TARGET:
        executable = tvm.compile(mod, TARGET, relax_pipeline=pipeline(TARGET, order="program"))
    return run_vm(executable, [x])


def _kept_float(mod: tvm.IRModule) -> list[str]:
    reports = []
    with TARGET:
        LowerQDQ(reports.append, TARGET)(mod)
    return [op for report in reports for op in report.kept_float]


def _stem_chain(mod: tvm.IRModule, gathered: bool = False) -> SpatialChain:
    """The chain from the stem convolution through the depthwise one and the projection."""
    order = {b.var.name: i for i, b in enumerate(top_level_bindings(mod["main"]))}
    chains = [c for c in find_chains(mod) if c.gathered == gathered and sum(op.window is not None for op in c.ops) == 3]
    return min(chains, key=lambda c: order[c.ops[0].name])


def test_an_int8_module_keeps_its_dequantized_weights_and_has_spatial_chains_only(normalized):
    chains = find_chains(normalized)
    assert chains and all(isinstance(c, SpatialChain) for c in chains)
    assert not _kept_float(normalized)
    # the simulator sees the int8 tensors LowerQDQ leaves: the stem's 16x24x24 output is 1 byte an element
    assert peak(program_of(normalized)).bytes <= 16 * 24 * 24 + 16 * 12 * 12 + 8 * 12 * 12


def test_the_memory_order_of_an_int8_module_keeps_its_weights_first(normalized):
    """The order the search simulates in names no weight binding (no arena tensor); the reordered
    module computes them first, as normalize placed them, and peaks no higher."""
    order = memory_order(normalized, 1.0)
    constants = {v.name for v in constant_bindings(normalized["main"])}
    assert constants and not constants & set(order)
    ordered = in_order(normalized, order)
    names = [b.var.name for b in top_level_bindings(ordered["main"])]
    assert set(names[: len(constants)]) == constants and names[len(constants) :] == order
    assert peak(program_of(ordered)).bytes <= peak(program_of(normalized)).bytes


@pytest.mark.parametrize(
    "parts, gathered, rolling",
    [(2, False, False), (3, False, False), (3, True, False), (3, False, True), (4, True, True)],
)
def test_int8_row_tiles_are_bit_identical_and_the_arena_shrinks(normalized, parts, gathered, rolling):
    """Also with a line buffer (``rolling``): the rows a tile keeps for the next are int8 codes."""
    x = np.random.default_rng(1).standard_normal((1, 3, 24, 24)).astype("float32")
    (expected,), unsplit_trace = _run(normalized, x)
    choice = SplitChoice(_stem_chain(normalized, gathered), parts, rolling=rolling)
    split = split_chains(normalized, [choice])
    # every tile is an integer kernel; the float ops left are the rows of the float input each tile quantizes
    assert set(_kept_float(split)) == {"relax.strided_slice"}
    (got,), trace = _run(split, x)
    np.testing.assert_array_equal(got, expected)
    assert trace.storage_bytes[0] < unsplit_trace.storage_bytes[0]
    simulated = peak(split_program(program_of(normalized), [choice])).bytes
    assert abs(trace.storage_bytes[0] - simulated) <= 0.15 * simulated


def test_a_chain_module_of_an_int8_model_keeps_its_integer_kernels(normalized):
    alone = chain_module(normalized, _stem_chain(normalized, gathered=False))
    assert not _kept_float(alone)
    assert all(str(p.ty.dtype) in ("int8", "float32") for p in alone["main"].params)


def test_split_int8_plan_verifies_against_the_unsplit_int8_build(int8_model):
    def prepare(mod):
        mod = normalize(mod)
        return split_chains(mod, [SplitChoice(_stem_chain(mod), 3)])

    plan = plan_model(int8_model, "llvm", prepare=prepare, order="program")
    unsplit = plan_model(int8_model, "llvm", order="program")
    assert plan.total("arena_bytes") < unsplit.total("arena_bytes")
    result = verify_plan(plan)  # vs stock TVM and onnxruntime, VM requests vs the plan
    assert result.ok, result.problems
    inputs = int8_model.random_inputs(3)
    (split_out,), _ = run_vm(plan.build(), inputs)
    (unsplit_out,), _ = run_vm(unsplit.build(), inputs)
    np.testing.assert_array_equal(split_out, unsplit_out)


def test_a_tile_reading_an_int8_tensor_from_outside_is_priced_with_its_copy(normalized):
    """A chain headed by the depthwise convolution reads the stem's int8 tensor: each tile dequantizes a
    copy of its rows (the integer kernel's operand), which the simulator counts."""
    chain = next(c for c in find_chains(normalized) if not c.gathered and c.ops[0].copied_row_bytes)
    assert chain.ops[0].copied_row_bytes == 16 * 24  # a row of the 16x24x24 int8 stem tensor
    x = np.random.default_rng(4).standard_normal((1, 3, 24, 24)).astype("float32")
    choice = SplitChoice(chain, 3)
    (got,), trace = _run(split_chains(normalized, [choice]), x)
    (expected,), _ = _run(normalized, x)
    np.testing.assert_array_equal(got, expected)
    simulated = peak(split_program(program_of(normalized), [choice])).bytes
    assert abs(trace.storage_bytes[0] - simulated) <= 0.05 * simulated


def test_an_input_in_the_arena_counts_until_its_last_reader(normalized):
    """``build --io-in-arena``: the float input (quantized by the stem's kernel as it reads it) is an
    arena tensor of the simulator too."""
    alone, with_input = program_of(normalized), program_of(normalized, inputs_in_arena=True)
    assert "x" not in alone.sizes and with_input.sizes["x"] == 3 * 24 * 24 * 4
    assert peak(alone).bytes < peak(with_input).bytes <= peak(alone).bytes + with_input.sizes["x"]
