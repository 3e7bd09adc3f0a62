"""DenseNet-121, torchvision layout.

Huang et al., "Densely Connected Convolutional Networks", CVPR 2017, and torchvision
``densenet121``: growth rate 32, bn_size 4, dense blocks (6, 12, 24, 16), transitions halve the
channels (compression 0.5) and average-pool 2x2. Every dense layer concatenates all earlier
feature maps of its block (one Concat per layer, as the PyTorch model exports), so the graph is
concat heavy. The pre-activation BatchNorms (norm1 of each layer, transitions, norm5) act on
concatenations and stay real ``BatchNormalization`` nodes; the BNs right after a conv (norm0,
norm2) are folded.
"""

from __future__ import annotations

import onnx

from .graph import GraphBuilder, T


def _dense_layer(g: GraphBuilder, features: list[T], growth: int, bn_size: int) -> T:
    x = features[0] if len(features) == 1 else g.concat(features)
    x = g.relu(g.batchnorm(x))
    x = g.conv(x, bn_size * growth, 1, bn=True, act="relu", base="conv1")
    return g.conv(x, growth, 3, 1, 1, base="conv2")


def _transition(g: GraphBuilder, x: T, cout: int) -> T:
    x = g.relu(g.batchnorm(x))
    x = g.conv(x, cout, 1, base="conv")
    return g.avgpool(x, 2, 2)


def densenet(
    name: str,
    growth: int,
    blocks: tuple[int, ...],
    init_features: int,
    bn_size: int,
    resolution: int,
    num_classes: int,
    seed: int,
) -> onnx.ModelProto:
    g = GraphBuilder(name, resolution, seed)
    x = g.input((1, 3, resolution, resolution))
    x = g.conv(x, init_features, 7, 2, 3, bn=True, act="relu", base="conv0")
    x = g.maxpool(x, 3, 2, 1)
    for b, n in enumerate(blocks, start=1):
        features = [x]
        for i in range(n):
            with g.scope(f"denseblock{b}_layer{i + 1}"):
                features.append(_dense_layer(g, features, growth, bn_size))
        with g.scope(f"denseblock{b}"):
            x = g.concat(features)
        if b != len(blocks):
            with g.scope(f"transition{b}"):
                x = _transition(g, x, x.c // 2)
    with g.scope("norm5"):
        x = g.relu(g.batchnorm(x))
    return g.finish(g.classifier(x, num_classes, base="classifier"))


def densenet121(resolution: int = 224, num_classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    return densenet("densenet121", 32, (6, 12, 24, 16), 64, 4, resolution, num_classes, seed)
