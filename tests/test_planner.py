"""Model-level planning on the zoo: the arena reaches the bound, and plans run correctly."""

import pytest

from tvm_memplan import zoo
from tvm_memplan.frontend import LoadedModel
from tvm_memplan.planner import plan_model
from tvm_memplan.verify import verify_plan

# Reduced input sizes keep CI fast; full sizes are in scripts/bench_memory.py.
SMALL = {
    "resnext50_32x4d": {"resolution": 64},
    "googlenet": {"resolution": 64},
    "mobilenet_v2": {"resolution": 64},
    "xception": {"resolution": 96},
    "inception_v3": {"resolution": 96},
    "densenet121": {"resolution": 64},
    "squeezenet1_0": {"resolution": 64},
    "nasnet_a_mobile": {"resolution": 64},
    "mcu_cnn": {},
    "mlp": {},
    "bert_tiny": {"resolution": 16},
}


def small_model(name: str) -> LoadedModel:
    return LoadedModel(name, zoo.build(name, **SMALL.get(name, {})))


def test_every_zoo_model_has_a_reduced_size():
    assert set(zoo.names()) <= set(SMALL)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMALL))
def test_arena_reaches_lower_bound_and_beats_tvm_default(name):
    plan = plan_model(small_model(name))
    arena, bound = plan.total("arena_bytes"), plan.total("lower_bound_bytes")
    assert plan.total("tensors") > 0
    assert arena == bound
    assert arena <= plan.tvm_default_bytes
    assert arena <= plan.total("naive_bytes")


# Every plan here uses the defaults: in-place kernels, concat elimination and order search.
VERIFIED = [
    ("mcu_cnn", {}),
    ("mlp", {}),
    ("mobilenet_v2", {"width": 0.35, "resolution": 64}),
    ("squeezenet1_0", {"resolution": 64}),
    ("resnext50_32x4d", {"resolution": 32}),
    ("densenet121", {"resolution": 32}),
    ("nasnet_a_mobile", {"resolution": 33}),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, params", VERIFIED, ids=[v[0] for v in VERIFIED])
def test_plan_runs_identically_to_stock_and_vm_requests_equal_plan(name, params):
    plan = plan_model(LoadedModel(name, zoo.build(name, **params)))
    baseline = plan_model(LoadedModel(name, zoo.build(name, **params)), inplace=False, order="program")
    assert plan.total("arena_bytes") <= baseline.total("arena_bytes")  # never worse than the plain arena
    result = verify_plan(plan)
    assert result.identical_to_stock, result.problems
    assert result.trace_matches_plan, result.problems
    assert result.max_abs_diff_vs_onnxruntime is not None and result.max_abs_diff_vs_onnxruntime < 1e-3
    assert result.ok, result.problems
