"""zoo public API: names / build / parse_spec / describe / input_shape and their error paths."""

from __future__ import annotations

import pytest

from tvm_memplan import zoo
from tvm_memplan.errors import UserError


def test_describe_is_one_line_per_model():
    for name in zoo.names():
        text = zoo.describe(name)
        assert "\n" not in text
        assert text.startswith(name + ":")
        assert "Source:" in text
    assert "width=1.0" in zoo.describe("mobilenet_v2")


def test_params_lists_defaults():
    assert zoo.params("mobilenet_v2") == {"width": 1.0, "resolution": 224, "num_classes": 1000, "seed": 0}
    assert zoo.params("xception")["resolution"] == 299
    assert zoo.params("inception_v3")["resolution"] == 299
    for name in zoo.names():
        assert {"resolution", "num_classes", "seed"} <= set(zoo.params(name))


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("zoo:mobilenet_v2", ("mobilenet_v2", {})),
        ("mobilenet_v2", ("mobilenet_v2", {})),
        ("zoo:mobilenet_v2?", ("mobilenet_v2", {})),
        ("zoo:mobilenet_v2?width=0.35&resolution=144", ("mobilenet_v2", {"width": 0.35, "resolution": 144})),
        ("  zoo:mlp?hidden=256 ", ("mlp", {"hidden": 256})),
        ("zoo:mobilenet_v2?width=1", ("mobilenet_v2", {"width": 1})),
        ("zoo:mobilenet_v2?width=1e0", ("mobilenet_v2", {"width": 1.0})),
    ],
)
def test_parse_spec(spec, expected):
    name, kw = zoo.parse_spec(spec)
    assert (name, kw) == expected
    assert all(type(v) is type(expected[1][k]) for k, v in kw.items())


@pytest.mark.parametrize(
    "spec,fragment",
    [
        ("", "empty"),
        ("zoo:", "no model name"),
        ("zoo:resnet9000", "unknown zoo model"),
        ("zoo:mobilenet_v2?depth=3", "unknown parameter"),
        ("zoo:mobilenet_v2?width", "key=value"),
        ("zoo:mobilenet_v2?width=", "key=value"),
        ("zoo:mobilenet_v2?=3", "key=value"),
        ("zoo:mobilenet_v2?width=wide", "must be a number"),
        ("zoo:mobilenet_v2?width=nan", "finite"),
        ("zoo:mobilenet_v2?width=0.5&width=0.35", "twice"),
    ],
)
def test_parse_spec_errors(spec, fragment):
    with pytest.raises(UserError, match=fragment) as info:
        zoo.parse_spec(spec)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "name,kwargs,fragment",
    [
        ("resnet9000", {}, "unknown zoo model"),
        ("mlp", {"width": 2}, "unknown parameter"),
        ("mobilenet_v2", {"resolution": "big"}, "must be a number"),
        ("mobilenet_v2", {"resolution": True}, "must be a number"),
        ("mobilenet_v2", {"resolution": 3.5}, "must be an integer"),
        ("mobilenet_v2", {"resolution": 0}, ">= 1"),
        ("mobilenet_v2", {"num_classes": -1}, ">= 1"),
        ("mobilenet_v2", {"seed": -1}, ">= 0"),
        ("mobilenet_v2", {"width": 0}, "positive"),
        ("mobilenet_v2", {"width": -0.5}, "positive"),
        ("mcu_cnn", {"in_channels": 0}, ">= 1"),
        ("googlenet", {"resolution": 16}, "too small"),
        ("nasnet_a_mobile", {"penultimate_filters": 1000}, "multiple of 96"),
    ],
)
def test_build_errors(name, kwargs, fragment):
    with pytest.raises(UserError, match=fragment) as info:
        zoo.build(name, **kwargs)
    assert "\n" not in str(info.value)


def test_build_spec_roundtrip_and_metadata():
    spec = "zoo:mobilenet_v2?width=0.35&resolution=96"
    model = zoo.build_spec(spec)
    assert zoo.input_shape(model) == (1, 3, 96, 96)
    props = {p.key: p.value for p in model.metadata_props}
    assert props["tvm_memplan.zoo.spec"] == spec
    assert props["tvm_memplan.zoo.name"] == "mobilenet_v2"
    assert zoo.parse_spec(zoo.format_spec(*zoo.parse_spec(spec))) == zoo.parse_spec(spec)
    # a float that is an integer is accepted for an int parameter
    assert zoo.input_shape(zoo.build("mcu_cnn", resolution=48.0)) == (1, 3, 48, 48)


def test_num_classes():
    model = zoo.build("squeezenet1_0", resolution=64, num_classes=10)
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == [1, 10]


def test_input_shape_errors():
    from onnx import TensorProto, helper

    g = helper.make_graph([], "empty", [], [])
    with pytest.raises(UserError, match="no graph input"):
        zoo.input_shape(helper.make_model(g))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "dyn",
        [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
    )
    with pytest.raises(UserError, match="dynamic"):
        zoo.input_shape(helper.make_model(g))
