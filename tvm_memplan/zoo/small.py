"""Small models: SqueezeNet 1.0, an MCU-class CNN and a 2-layer MLP.

* SqueezeNet 1.0: Iandola et al., "SqueezeNet: AlexNet-level accuracy with 50x fewer parameters",
  2016, as torchvision ``squeezenet1_0`` (fire modules: squeeze 1x1, expand 1x1 + 3x3, concat;
  ceil-mode max pools; conv classifier). Convs have biases, no BN.
* ``mcu_cnn``: a microcontroller-class CNN in the style of TinyML benchmarks (conv, max pools,
  depthwise-separable blocks, one residual block, 32x32 input, activations of tens of KB). It is
  this project's own configuration, not a published network.
* ``mlp``: 784 -> 512 -> 10 with ReLU (the classic MNIST MLP), Gemm or MatMul + Add.
"""

from __future__ import annotations

import onnx

from .graph import GraphBuilder, T


# --------------------------------------------------------------------------- SqueezeNet 1.0
def _fire(g: GraphBuilder, x: T, squeeze: int, e1: int, e3: int) -> T:
    s = g.conv(x, squeeze, 1, bias=True, act="relu", base="squeeze")
    a = g.conv(s, e1, 1, bias=True, act="relu", base="expand1x1")
    b = g.conv(s, e3, 3, 1, 1, bias=True, act="relu", base="expand3x3")
    return g.concat([a, b])


def squeezenet1_0(resolution: int = 224, num_classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    g = GraphBuilder("squeezenet1_0", resolution, seed)
    x = g.input((1, 3, resolution, resolution))
    x = g.conv(x, 96, 7, 2, 0, bias=True, act="relu", base="conv1")
    x = g.maxpool(x, 3, 2, ceil=True)
    fires = [
        (16, 64, 64),
        (16, 64, 64),
        (32, 128, 128),
        "pool",
        (32, 128, 128),
        (48, 192, 192),
        (48, 192, 192),
        (64, 256, 256),
        "pool",
        (64, 256, 256),
    ]
    i = 2
    for cfg in fires:
        if cfg == "pool":
            x = g.maxpool(x, 3, 2, ceil=True)
            continue
        with g.scope(f"fire{i}"):
            x = _fire(g, x, *cfg)
        i += 1
    x = g.conv(x, num_classes, 1, bias=True, act="relu", base="classifier_conv")
    return g.finish(g.flatten(g.global_avgpool(x)))


# --------------------------------------------------------------------------- MCU CNN
def mcu_cnn(resolution: int = 32, in_channels: int = 3, num_classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    if in_channels < 1:
        raise ValueError(f"mcu_cnn: in_channels must be >= 1, got {in_channels}")
    g = GraphBuilder("mcu_cnn", resolution, seed)
    x = g.input((1, in_channels, resolution, resolution))
    x = g.conv(x, 8, 3, 1, 1, bn=True, act="relu", base="conv1")
    x = g.maxpool(x, 2, 2)
    with g.scope("ds1"):
        x = g.conv(x, 8, 3, 1, 1, group=8, bn=True, act="relu", base="dw")
        x = g.conv(x, 16, 1, bn=True, act="relu", base="pw")
    x = g.maxpool(x, 2, 2)
    with g.scope("ds2"):
        x = g.conv(x, 16, 3, 1, 1, group=16, bn=True, act="relu", base="dw")
        x = g.conv(x, 32, 1, bn=True, act="relu", base="pw")
    with g.scope("res"):
        y = g.conv(x, 32, 3, 1, 1, group=32, bn=True, act="relu", base="dw")
        y = g.conv(y, 32, 1, bn=True, base="pw")
        x = g.relu(g.add(x, y))
    return g.finish(g.classifier(x, num_classes))


# --------------------------------------------------------------------------- MLP
def mlp(
    resolution: int = 28, hidden: int = 512, num_classes: int = 10, matmul: int = 0, seed: int = 0
) -> onnx.ModelProto:
    """Input (1, resolution**2); ``matmul=1`` emits MatMul + Add (weights [in, out]) instead of Gemm."""
    if hidden < 1:
        raise ValueError(f"mlp: hidden must be >= 1, got {hidden}")
    g = GraphBuilder("mlp", resolution, seed)
    x = g.input((1, resolution * resolution))
    x = g.gemm(x, hidden, act="relu", base="fc1", matmul=bool(matmul))
    return g.finish(g.gemm(x, num_classes, base="fc2", matmul=bool(matmul)))
