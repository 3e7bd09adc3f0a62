"""GoogLeNet (Inception v1) and Inception v3, torchvision layouts, without auxiliary heads.

* GoogLeNet: Szegedy et al., "Going Deeper with Convolutions", CVPR 2015, as torchvision
  ``googlenet``: BN after every conv (BasicConv2d), ceil-mode max pools, and the "5x5" branch
  implemented with a 3x3 kernel exactly like torchvision (kept there for weight compatibility).
* Inception v3: Szegedy et al., "Rethinking the Inception Architecture for Computer Vision",
  CVPR 2016, as torchvision ``inception_v3``: Mixed_5b..Mixed_7c (InceptionA/B/C/D/E), 299x299.

Every BasicConv2d (conv, BN, ReLU) is one conv with the BN folded in.
"""

from __future__ import annotations

import onnx

from .graph import GraphBuilder, T


def _basic(g: GraphBuilder, x: T, cout: int, k, stride=1, pad=0, base="conv") -> T:
    return g.conv(x, cout, k, stride, pad, bn=True, act="relu", base=base)


# --------------------------------------------------------------------------- GoogLeNet
_GOOGLENET_BLOCKS = {
    # name: (ch1x1, ch3x3red, ch3x3, ch5x5red, ch5x5, pool_proj)
    "3a": (64, 96, 128, 16, 32, 32),
    "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64),
    "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64),
    "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128),
    "5a": (256, 160, 320, 32, 128, 128),
    "5b": (384, 192, 384, 48, 128, 128),
}


def _inception_v1(g: GraphBuilder, x: T, c1, c3r, c3, c5r, c5, pp) -> T:
    b1 = _basic(g, x, c1, 1, base="b1")
    b2 = _basic(g, _basic(g, x, c3r, 1, base="b2a"), c3, 3, pad=1, base="b2b")
    b3 = _basic(g, _basic(g, x, c5r, 1, base="b3a"), c5, 3, pad=1, base="b3b")  # torchvision: 3x3
    b4 = _basic(g, g.maxpool(x, 3, 1, 1, ceil=True), pp, 1, base="b4")
    return g.concat([b1, b2, b3, b4])


def googlenet(resolution: int = 224, num_classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    g = GraphBuilder("googlenet", resolution, seed)
    x = g.input((1, 3, resolution, resolution))
    x = _basic(g, x, 64, 7, 2, 3, base="conv1")
    x = g.maxpool(x, 3, 2, ceil=True)
    x = _basic(g, x, 64, 1, base="conv2")
    x = _basic(g, x, 192, 3, pad=1, base="conv3")
    x = g.maxpool(x, 3, 2, ceil=True)
    for name, cfg in _GOOGLENET_BLOCKS.items():
        if name == "4a":
            x = g.maxpool(x, 3, 2, ceil=True)
        elif name == "5a":
            x = g.maxpool(x, 2, 2, ceil=True)
        with g.scope(f"inception{name}"):
            x = _inception_v1(g, x, *cfg)
    return g.finish(g.classifier(x, num_classes))


# --------------------------------------------------------------------------- Inception v3
def _avg3(g: GraphBuilder, x: T) -> T:
    # torchvision uses F.avg_pool2d(x, 3, stride=1, padding=1): count_include_pad=True
    return g.avgpool(x, 3, 1, 1, count_include_pad=True)


def _inception_a(g: GraphBuilder, x: T, pool_features: int) -> T:
    b1 = _basic(g, x, 64, 1, base="b1x1")
    b5 = _basic(g, _basic(g, x, 48, 1, base="b5x5_1"), 64, 5, pad=2, base="b5x5_2")
    b3 = _basic(g, x, 64, 1, base="b3x3dbl_1")
    b3 = _basic(g, b3, 96, 3, pad=1, base="b3x3dbl_2")
    b3 = _basic(g, b3, 96, 3, pad=1, base="b3x3dbl_3")
    bp = _basic(g, _avg3(g, x), pool_features, 1, base="bpool")
    return g.concat([b1, b5, b3, bp])


def _inception_b(g: GraphBuilder, x: T) -> T:
    b3 = _basic(g, x, 384, 3, 2, base="b3x3")
    bd = _basic(g, x, 64, 1, base="b3x3dbl_1")
    bd = _basic(g, bd, 96, 3, pad=1, base="b3x3dbl_2")
    bd = _basic(g, bd, 96, 3, 2, base="b3x3dbl_3")
    bp = g.maxpool(x, 3, 2)
    return g.concat([b3, bd, bp])


def _inception_c(g: GraphBuilder, x: T, c7: int) -> T:
    b1 = _basic(g, x, 192, 1, base="b1x1")
    b7 = _basic(g, x, c7, 1, base="b7x7_1")
    b7 = _basic(g, b7, c7, (1, 7), pad=(0, 3), base="b7x7_2")
    b7 = _basic(g, b7, 192, (7, 1), pad=(3, 0), base="b7x7_3")
    bd = _basic(g, x, c7, 1, base="b7x7dbl_1")
    bd = _basic(g, bd, c7, (7, 1), pad=(3, 0), base="b7x7dbl_2")
    bd = _basic(g, bd, c7, (1, 7), pad=(0, 3), base="b7x7dbl_3")
    bd = _basic(g, bd, c7, (7, 1), pad=(3, 0), base="b7x7dbl_4")
    bd = _basic(g, bd, 192, (1, 7), pad=(0, 3), base="b7x7dbl_5")
    bp = _basic(g, _avg3(g, x), 192, 1, base="bpool")
    return g.concat([b1, b7, bd, bp])


def _inception_d(g: GraphBuilder, x: T) -> T:
    b3 = _basic(g, _basic(g, x, 192, 1, base="b3x3_1"), 320, 3, 2, base="b3x3_2")
    b7 = _basic(g, x, 192, 1, base="b7x7x3_1")
    b7 = _basic(g, b7, 192, (1, 7), pad=(0, 3), base="b7x7x3_2")
    b7 = _basic(g, b7, 192, (7, 1), pad=(3, 0), base="b7x7x3_3")
    b7 = _basic(g, b7, 192, 3, 2, base="b7x7x3_4")
    bp = g.maxpool(x, 3, 2)
    return g.concat([b3, b7, bp])


def _inception_e(g: GraphBuilder, x: T) -> T:
    b1 = _basic(g, x, 320, 1, base="b1x1")
    b3 = _basic(g, x, 384, 1, base="b3x3_1")
    b3 = g.concat(
        [_basic(g, b3, 384, (1, 3), pad=(0, 1), base="b3x3_2a"), _basic(g, b3, 384, (3, 1), pad=(1, 0), base="b3x3_2b")]
    )
    bd = _basic(g, x, 448, 1, base="b3x3dbl_1")
    bd = _basic(g, bd, 384, 3, pad=1, base="b3x3dbl_2")
    bd = g.concat(
        [
            _basic(g, bd, 384, (1, 3), pad=(0, 1), base="b3x3dbl_3a"),
            _basic(g, bd, 384, (3, 1), pad=(1, 0), base="b3x3dbl_3b"),
        ]
    )
    bp = _basic(g, _avg3(g, x), 192, 1, base="bpool")
    return g.concat([b1, b3, bd, bp])


def inception_v3(resolution: int = 299, num_classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    g = GraphBuilder("inception_v3", resolution, seed)
    x = g.input((1, 3, resolution, resolution))
    x = _basic(g, x, 32, 3, 2, base="Conv2d_1a_3x3")
    x = _basic(g, x, 32, 3, base="Conv2d_2a_3x3")
    x = _basic(g, x, 64, 3, pad=1, base="Conv2d_2b_3x3")
    x = g.maxpool(x, 3, 2)
    x = _basic(g, x, 80, 1, base="Conv2d_3b_1x1")
    x = _basic(g, x, 192, 3, base="Conv2d_4a_3x3")
    x = g.maxpool(x, 3, 2)
    blocks = [
        ("Mixed_5b", _inception_a, (32,)),
        ("Mixed_5c", _inception_a, (64,)),
        ("Mixed_5d", _inception_a, (64,)),
        ("Mixed_6a", _inception_b, ()),
        ("Mixed_6b", _inception_c, (128,)),
        ("Mixed_6c", _inception_c, (160,)),
        ("Mixed_6d", _inception_c, (160,)),
        ("Mixed_6e", _inception_c, (192,)),
        ("Mixed_7a", _inception_d, ()),
        ("Mixed_7b", _inception_e, ()),
        ("Mixed_7c", _inception_e, ()),
    ]
    for name, fn, args in blocks:
        with g.scope(name):
            x = fn(g, x, *args)
    return g.finish(g.classifier(x, num_classes))
