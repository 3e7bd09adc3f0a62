"""ResNeXt-50 (32x4d), torchvision layout.

Xie et al., "Aggregated Residual Transformations for Deep Neural Networks", CVPR 2017, and
torchvision ``resnext50_32x4d``: bottleneck blocks [3, 4, 6, 3], 32 groups of width 4 in the first
stage, stride on the grouped 3x3 conv ("ResNet v1.5"), 1x1 conv + BN projection shortcuts.
BatchNorms are folded into the convolutions.
"""

from __future__ import annotations

import onnx

from .graph import GraphBuilder, T


def _bottleneck(g: GraphBuilder, x: T, planes: int, stride: int, groups: int, base_width: int) -> T:
    width = int(planes * (base_width / 64.0)) * groups
    out_c = planes * 4
    y = g.conv(x, width, 1, bn=True, act="relu", base="conv1")
    y = g.conv(y, width, 3, stride, group=groups, bn=True, act="relu", base="conv2")
    y = g.conv(y, out_c, 1, bn=True, base="conv3")
    if stride != 1 or x.c != out_c:
        x = g.conv(x, out_c, 1, stride, bn=True, base="downsample")
    return g.relu(g.add(y, x))


def resnext(
    name: str, layers: list[int], groups: int, base_width: int, resolution: int, num_classes: int, seed: int
) -> onnx.ModelProto:
    g = GraphBuilder(name, resolution, seed)
    x = g.input((1, 3, resolution, resolution))
    x = g.conv(x, 64, 7, 2, 3, bn=True, act="relu", base="conv1")
    x = g.maxpool(x, 3, 2, 1)
    for stage, (n, planes) in enumerate(zip(layers, (64, 128, 256, 512), strict=True), start=1):
        for i in range(n):
            with g.scope(f"layer{stage}_{i}"):
                x = _bottleneck(g, x, planes, 2 if (i == 0 and stage > 1) else 1, groups, base_width)
    return g.finish(g.classifier(x, num_classes))


def resnext50_32x4d(resolution: int = 224, num_classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    return resnext("resnext50_32x4d", [3, 4, 6, 3], 32, 4, resolution, num_classes, seed)
