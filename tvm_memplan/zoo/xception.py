"""Xception (Chollet, "Xception: Deep Learning with Depthwise Separable Convolutions", CVPR 2017).

Layer configuration as Cadene's ``pretrainedmodels`` / timm ``legacy_xception`` port of the Keras
model: entry flow (two plain convs, blocks 128/256/728 with stride 2), middle flow (8 blocks of
three 728-channel separable convs), exit flow (728->1024 block, separable 1536 and 2048), 299x299.
A separable conv is a depthwise 3x3 followed by a pointwise 1x1 (no BN/ReLU in between); BNs are
folded. As in the paper and the port (whose first ReLU of a block is not in-place), the shortcut
takes the block's un-rectified input.
"""

from __future__ import annotations

import onnx

from .graph import GraphBuilder, T


def _block(g: GraphBuilder, x: T, cout: int, reps: int, stride: int, start_with_relu: bool, grow_first: bool) -> T:
    y = x
    filters = x.c
    units: list[int] = []
    if grow_first:
        units.append(cout)
        filters = cout
    units += [filters] * (reps - 1)
    if not grow_first:
        units.append(cout)
    for i, c in enumerate(units):
        if i > 0 or start_with_relu:
            y = g.relu(y)
        y = g.separable(y, c, 3, 1, 1, bn=True, base=f"sep{i + 1}")
    if stride != 1:
        y = g.maxpool(y, 3, stride, 1)
    skip = x
    if cout != x.c or stride != 1:
        skip = g.conv(x, cout, 1, stride, 0, bn=True, base="skip")
    return g.add(y, skip)


def xception(resolution: int = 299, num_classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    g = GraphBuilder("xception", resolution, seed)
    x = g.input((1, 3, resolution, resolution))
    x = g.conv(x, 32, 3, 2, 0, bn=True, act="relu", base="conv1")
    x = g.conv(x, 64, 3, 1, 0, bn=True, act="relu", base="conv2")
    cfg = [(128, 2, 2, False, True), (256, 2, 2, True, True), (728, 2, 2, True, True)]
    cfg += [(728, 3, 1, True, True)] * 8
    cfg += [(1024, 2, 2, True, False)]
    for i, (cout, reps, stride, swr, grow) in enumerate(cfg, start=1):
        with g.scope(f"block{i}"):
            x = _block(g, x, cout, reps, stride, swr, grow)
    x = g.separable(x, 1536, 3, 1, 1, bn=True, act="relu", base="conv3")
    x = g.separable(x, 2048, 3, 1, 1, bn=True, act="relu", base="conv4")
    return g.finish(g.classifier(x, num_classes))
