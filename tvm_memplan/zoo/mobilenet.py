"""MobileNetV2 with width multiplier and resolution, torchvision layout.

Sandler et al., "MobileNetV2: Inverted Residuals and Linear Bottlenecks", CVPR 2018, and
torchvision ``mobilenet_v2(width_mult=...)``: channels rounded with ``_make_divisible(c * width, 8)``,
the last 1x1 conv has ``_make_divisible(1280 * max(1, width), 8)`` channels, ReLU6 as ONNX Clip(0, 6).
Small settings (e.g. ``width=0.35, resolution=96..144``) are the MCU-class models of MCUNet-style
papers.
"""

from __future__ import annotations

import onnx

from .graph import GraphBuilder, T

# t (expansion), c (channels), n (repeats), s (first stride)
_SETTINGS = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
]


def make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    """torchvision / TF-slim ``_make_divisible``: nearest multiple of ``divisor``, never < 90 % of v."""
    if min_value is None:
        min_value = divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


def _inverted_residual(g: GraphBuilder, x: T, oup: int, stride: int, expand: int) -> T:
    hidden = int(round(x.c * expand))
    y = x
    if expand != 1:
        y = g.conv(y, hidden, 1, bn=True, act="relu6", base="expand")
    y = g.conv(y, hidden, 3, stride, 1, group=hidden, bn=True, act="relu6", base="dw")
    y = g.conv(y, oup, 1, bn=True, base="project")
    if stride == 1 and x.c == oup:
        y = g.add(x, y)
    return y


def mobilenet_v2(width: float = 1.0, resolution: int = 224, num_classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    if not width > 0:
        raise ValueError(f"mobilenet_v2: width must be > 0, got {width}")
    g = GraphBuilder("mobilenet_v2", resolution, seed)
    x = g.input((1, 3, resolution, resolution))
    x = g.conv(x, make_divisible(32 * width), 3, 2, 1, bn=True, act="relu6", base="features_0")
    idx = 1
    for t, c, n, s in _SETTINGS:
        oup = make_divisible(c * width)
        for i in range(n):
            with g.scope(f"features_{idx}"):
                x = _inverted_residual(g, x, oup, s if i == 0 else 1, t)
            idx += 1
    x = g.conv(x, make_divisible(1280 * max(1.0, width)), 1, bn=True, act="relu6", base=f"features_{idx}")
    return g.finish(g.classifier(x, num_classes, base="classifier"))
