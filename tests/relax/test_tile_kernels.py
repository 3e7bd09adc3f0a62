"""One kernel per split chain: a chain's tiles merged into one PrimFunc compute what the unsplit model
computes, bit for bit, in one VM call, with the tiles' buffers in a scratch tensor the arena plans."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_memplan.relax.passes import PlanReport
from tvm_memplan.relax.pipeline import pipeline, stage_passes
from tvm_memplan.relax.split import split_chains
from tvm_memplan.relax.split.outline import TILES_ATTR
from tvm_memplan.relax.tile_kernels import MergeTileKernels
from tvm_memplan.split.simulate import SplitChoice
from tvm_memplan.verify.run import run_vm

from .test_split_spatial import SHAPE, TARGET, _longest, _stem_module

_KERNEL_CALLS = (tvm.ir.Op.get("relax.call_tir"), tvm.ir.Op.get("relax.call_tir_inplace"))


@pytest.fixture(scope="module")
def stem():
    return _stem_module()


def _kernel_calls(mod: tvm.IRModule) -> list[str]:
    """The kernels ``main`` calls after TVM's fusion (and the tile passes), in order."""
    with TARGET:
        fused = tvm.transform.Sequential(stage_passes(TARGET).dataflow)(mod)
    return [
        b.value.args[0].name_hint
        for block in fused["main"].body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call) and any(b.value.op.same_as(op) for op in _KERNEL_CALLS)
    ]


def _run_planned(mod: tvm.IRModule, x: np.ndarray) -> tuple[np.ndarray, list[int], list[PlanReport]]:
    reports: list[PlanReport] = []
    with TARGET:
        executable = tvm.compile(mod, TARGET, relax_pipeline=pipeline(TARGET, reports.append, order="program"))
    (out,), trace = run_vm(executable, [x])
    return out, trace.storage_bytes, reports


@pytest.mark.parametrize("parts", [8])
def test_a_fused_chain_runs_as_one_kernel_bit_identical_and_as_planned(stem, parts):
    chain = _longest(stem)
    per_kernel = split_chains(stem, [SplitChoice(chain, parts)])
    fused = split_chains(stem, [SplitChoice(chain, parts, fused=True)])
    # the stem has two kernels outside the chain (the side convolution and the last one)
    assert len(_kernel_calls(per_kernel)) > 2 + parts
    calls = _kernel_calls(fused)
    assert len(calls) == 3 and sum(name.endswith("_fused") for name in calls) == 1

    x = np.random.default_rng(1).standard_normal(SHAPE).astype("float32")
    expected, _, _ = _run_planned(stem, x)
    got, requested, (report,) = _run_planned(fused, x)
    np.testing.assert_array_equal(got, expected)
    # the VM asks for the planned arena (scratch inside) and the output, nothing else
    assert requested == [report.arena_bytes, got.nbytes]
    # the scratch lives only during the chain's call: no more arena than the per-kernel tiles
    _, per_kernel_requested, _ = _run_planned(per_kernel, x)
    assert report.arena_bytes <= per_kernel_requested[0]


def test_other_targets_get_the_per_kernel_tiles_back(stem):
    """A GPU target binds each kernel to threads of its own: the chain's calls go back into ``main``."""
    chain = _longest(stem)
    with TARGET:
        fused = tvm.transform.Sequential(stage_passes(TARGET).dataflow[:-1])(
            split_chains(stem, [SplitChoice(chain, 3, fused=True)])
        )
    assert any(f.attrs is not None and TILES_ATTR in f.attrs for f in fused.functions.values())
    inlined = MergeTileKernels(tvm.target.Target({"kind": "cuda"}))(fused)
    assert not [g for g, f in inlined.functions.items() if isinstance(f, relax.Function) and g.name_hint != "main"]
    calls = [b for block in inlined["main"].body.blocks for b in block.bindings if isinstance(b.value, relax.Call)]
    with TARGET:
        per_kernel = tvm.transform.Sequential(stage_passes(TARGET).dataflow)(
            split_chains(stem, [SplitChoice(chain, 3)])
        )
    assert len(calls) == len([b for block in per_kernel["main"].body.blocks for b in block.bindings])


def test_mobilenet_with_fused_spatial_and_channel_chains_verifies():
    """A spatial chain (row tiles written into the full tensor) and a channel chain (partial sums,
    written in place over each other and into the output) of a real network, each one kernel."""
    from tvm_memplan.frontend import load_model, to_relax
    from tvm_memplan.planner import plan_model
    from tvm_memplan.relax.split import find_chains, normalize, program_of
    from tvm_memplan.split.chain import disjoint
    from tvm_memplan.split.simulate import peak, split_program
    from tvm_memplan.verify import verify_plan

    model = load_model("zoo:mobilenet_v2?width=0.35&resolution=48")
    mod = normalize(to_relax(model))
    program, chains = program_of(mod), find_chains(mod)

    def best(candidates):
        return min(candidates, key=lambda c: peak(split_program(program, [SplitChoice(c, 4)])).bytes)

    spatial = best([c for c in chains if c.spatial and not c.gathered and c.units >= 4])
    channel = best([c for c in chains if c.kind == "temporal" and disjoint([c, spatial])])
    split = split_chains(mod, [SplitChoice(spatial, 4, fused=True), SplitChoice(channel, 4, fused=True)])
    assert sum(name.endswith("_fused") for name in _kernel_calls(split)) == 2
    plan = plan_model(model, "llvm", prepare=lambda _: split, order="program")  # the module normalized above
    result = verify_plan(plan, stock=False)  # vs onnxruntime, VM requests vs the plan
    assert result.ok, result.problems


def test_a_gathered_chain_is_not_fused(stem):
    """Its last tiles are kept until the end: one kernel would hold them and the output at once."""
    chain = _longest(stem, gathered=True)
    assert not chain.fusable and _longest(stem).fusable
    with pytest.raises(ValueError, match="one kernel"):
        split_chains(stem, [SplitChoice(chain, 3, fused=True)])


def test_fused_and_per_kernel_tiles_are_measured_apart(stem):
    """The latency cache keys a chain module by what its time depends on, the fused tiles included."""
    from tvm_memplan.relax.split import chain_signature

    chain = _longest(stem)
    signatures = {
        chain_signature(split_chains(stem, [SplitChoice(chain, parts, fused=fused)]))
        for parts in (2, 3)
        for fused in (False, True)
    }
    assert len(signatures) == 4
