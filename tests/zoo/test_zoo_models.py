"""Every zoo model: valid ONNX, published parameter / MAC counts, runs in onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tvm_memplan import zoo
from tvm_memplan.errors import UserError

ort = pytest.importorskip("onnxruntime")

# PyTorch-counted parameters (conv/linear weights and biases + BN gamma/beta) of the default
# configuration, and multiply-accumulates at the default resolution. Sources:
#   torchvision model docs / weights metadata (num_params, GFLOPS): resnext50_32x4d, googlenet
#   (aux heads dropped, as the returned pretrained model), mobilenet_v2, inception_v3 (27,161,264
#   with the aux head; minus its 3,326,696 params = 23,834,568), densenet121, squeezenet1_0.
#   timm / Cadene pretrainedmodels: legacy_xception 22,855,952 (8.4 G MACs, Chollet 2017),
#   nasnetamobile 5,289,978 (NASNet paper, Table 2: 5.3 M params, 564 M Mult-Adds).
#   mlp: 784*512 + 512 + 512*10 + 10.
PUBLISHED = {
    # name: (params, MACs in millions)
    "resnext50_32x4d": (25_028_904, 4230),
    "googlenet": (6_624_904, 1500),
    "mobilenet_v2": (3_504_872, 300),
    "xception": (22_855_952, 8400),
    "inception_v3": (23_834_568, 5710),
    "densenet121": (7_978_856, 2830),
    "squeezenet1_0": (1_248_424, 820),
    "nasnet_a_mobile": (5_289_978, 564),
    "mlp": (407_050, 0.407),
}

# Reduced resolutions for onnxruntime runs (odd sizes exercise ceil-mode pools and NASNet's
# asymmetric SAME padding; 75 is Inception v3's minimum, as torchvision documents).
SMALL = {
    "resnext50_32x4d": 32,
    "googlenet": 40,
    "mobilenet_v2": 33,
    "xception": 41,
    "inception_v3": 75,
    "densenet121": 35,
    "squeezenet1_0": 47,
    "nasnet_a_mobile": 33,
    "mcu_cnn": 32,
    "mlp": 28,
}

EXPECTED = {
    "resnext50_32x4d",
    "googlenet",
    "mobilenet_v2",
    "xception",
    "inception_v3",
    "densenet121",
    "squeezenet1_0",
    "nasnet_a_mobile",
    "mcu_cnn",
    "mlp",
}


def _run_ort(model: onnx.ModelProto, seed: int = 1) -> np.ndarray:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(seed).standard_normal(zoo.input_shape(model)).astype(np.float32)
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def _declared_output(model: onnx.ModelProto) -> tuple[int, ...]:
    return tuple(d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim)


def test_names():
    assert set(zoo.names()) == EXPECTED | {"bert_tiny"}  # the transformer: tests/zoo/test_bert.py
    assert zoo.names() == sorted(zoo.names())


@pytest.fixture(scope="module")
def full_models():
    cache: dict[str, onnx.ModelProto] = {}

    def get(name):
        if name not in cache:
            cache[name] = zoo.build(name)
        return cache[name]

    return get


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_parameter_count(name, full_models):
    model = full_models(name)
    onnx.checker.check_model(model)
    expected, _ = PUBLISHED[name]
    count = zoo.num_params(model)
    # exact: the layer configurations are the published ones
    assert count == expected, f"{name}: {count:,} params, published {expected:,}"
    props = {p.key: p.value for p in model.metadata_props}
    assert int(props["tvm_memplan.zoo.params"]) == count  # builder's own tally agrees


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_macs(name, full_models):
    _, macs_m = PUBLISHED[name]
    macs = zoo.num_macs(full_models(name)) / 1e6
    assert macs == pytest.approx(macs_m, rel=0.01), f"{name}: {macs:.1f} M MACs"


def test_default_resolutions(full_models):
    for name in EXPECTED - {"mlp", "mcu_cnn"}:
        res = 299 if name in ("xception", "inception_v3") else 224
        assert zoo.input_shape(full_models(name)) == (1, 3, res, res)
        assert _declared_output(full_models(name)) == (1, 1000)
    assert zoo.input_shape(full_models("mlp")) == (1, 784)
    assert _declared_output(full_models("mlp")) == (1, 10)


@pytest.mark.parametrize(
    "width,params_m,macs_m",
    # TF-slim MobileNetV2 table (Sandler et al.): 0.35/0.5/0.75/1.0/1.4 at 224 ->
    # 1.66/1.95/2.61/3.47/6.06 M params (1001 classes), 59/97/209/300/582 M MACs.
    [(0.35, 1.66, 59), (0.5, 1.95, 97), (0.75, 2.61, 209), (1.0, 3.47, 300), (1.4, 6.06, 582)],
)
def test_mobilenet_v2_width(width, params_m, macs_m):
    model = zoo.build("mobilenet_v2", width=width)
    assert zoo.num_params(model) / 1e6 == pytest.approx(params_m, rel=0.02)
    assert zoo.num_macs(model) / 1e6 == pytest.approx(macs_m, rel=0.01)


def test_mobilenet_v2_channel_rounding():
    assert [zoo.make_divisible(c * 0.35) for c in (32, 16, 24, 32, 64, 96, 160, 320)] == [16, 8, 8, 16, 24, 32, 56, 112]
    model = zoo.build("mobilenet_v2", width=0.35, resolution=144)
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    inits = {t.name: t.dims for t in model.graph.initializer}
    assert all(inits[n.input[1]][0] % 8 == 0 for n in convs)
    assert inits[convs[-1].input[1]][0] == 1280  # last conv keeps 1280 for width < 1


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_runs_in_onnxruntime_small(name):
    kw = {} if name == "mlp" else {"resolution": SMALL[name]}
    model = zoo.build(name, **kw)
    onnx.checker.check_model(model)
    onnx.shape_inference.infer_shapes(model, strict_mode=True)
    y = _run_ort(model)
    assert y.shape == _declared_output(model)
    assert y.shape == ((1, 10) if name in ("mlp", "mcu_cnn") else (1, 1000))
    assert np.isfinite(y).all()
    assert 1e-3 < float(np.abs(y).max()) < 1e3  # random weights, but numerically sane


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED - {"mlp", "mcu_cnn"}))
def test_runs_in_onnxruntime_full_resolution(name, full_models):
    y = _run_ort(full_models(name))
    assert y.shape == (1, 1000)
    assert np.isfinite(y).all()
    assert 1e-3 < float(np.abs(y).max()) < 1e3


@pytest.mark.parametrize(
    "name,too_small",
    [
        ("inception_v3", 74),
        ("googlenet", 30),
        ("densenet121", 28),
        ("squeezenet1_0", 28),
        ("xception", 6),
        ("nasnet_a_mobile", 2),
        ("mcu_cnn", 3),
    ],
)
def test_resolution_too_small(name, too_small):
    with pytest.raises(ValueError, match="too small") as info:
        zoo.build(name, resolution=too_small)
    assert isinstance(info.value, UserError)
    assert name in str(info.value)
    zoo.build(name, resolution=too_small + 1)  # the smallest that works


def test_mcu_cnn_is_mcu_sized():
    model = zoo.build("mcu_cnn")
    assert zoo.input_shape(model) == (1, 3, 32, 32)
    inferred = onnx.shape_inference.infer_shapes(model)
    sizes = [4 * int(np.prod([d.dim_value for d in vi.type.tensor_type.shape.dim])) for vi in inferred.graph.value_info]
    assert 8 * 1024 <= max(sizes) <= 64 * 1024  # largest activation: tens of KB
    assert zoo.num_params(model) < 20_000
    assert zoo.input_shape(zoo.build("mcu_cnn", in_channels=1)) == (1, 1, 32, 32)


def test_ops_are_the_supported_set():
    allowed = {
        "Conv",
        "Relu",
        "Clip",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "Concat",
        "Add",
        "BatchNormalization",
        "Pad",
        "Slice",
        "Flatten",
        "Gemm",
        "MatMul",
        "Identity",
    }
    for name in sorted(EXPECTED):
        kw = {} if name == "mlp" else {"resolution": SMALL[name]}
        ops = {n.op_type for n in zoo.build(name, **kw).graph.node}
        assert ops <= allowed, (name, ops - allowed)
    # the interesting structures are there
    ops = lambda n, **kw: [x.op_type for x in zoo.build(n, **kw).graph.node]  # noqa: E731
    # DenseNet: layers 2..n of a block concat their inputs, plus one concat per block output
    assert ops("densenet121", resolution=32).count("Concat") == 6 + 12 + 24 + 16
    assert "Clip" in ops("mobilenet_v2", resolution=32)
    grouped = [
        a.i for n in zoo.build("resnext50_32x4d", resolution=32).graph.node for a in n.attribute if a.name == "group"
    ]
    assert grouped and set(grouped) == {32}
    assert ops("mlp", matmul=1).count("MatMul") == 2


def test_nasnet_cell_structure():
    model = zoo.build("nasnet_a_mobile", resolution=32)
    ops = [n.op_type for n in model.graph.node]
    # 2 stem cells + 2 reduction cells: 4-way concat; 12 normal cells: 6-way concat;
    # 3 factorized reductions (CellStem1 and the FirstCells after stem/reductions): 2-way
    concats = sorted(len(n.input) for n in model.graph.node if n.op_type == "Concat")
    assert concats.count(6) == 12 and concats.count(4) == 4 and concats.count(2) == 4
    # every cell sums 5 pairs
    assert ops.count("Add") == 16 * 5
    # final feature map of the default model: 1056 channels at 7x7
    full = zoo.build("nasnet_a_mobile")
    inferred = onnx.shape_inference.infer_shapes(full)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in inferred.graph.value_info}
    gap = next(n for n in full.graph.node if n.op_type == "GlobalAveragePool")
    assert shapes[gap.input[0]] == [1, 1056, 7, 7]


def test_deterministic_and_seeded():
    a = zoo.build("mcu_cnn").SerializeToString()
    assert a == zoo.build("mcu_cnn").SerializeToString()
    assert a != zoo.build("mcu_cnn", seed=1).SerializeToString()
