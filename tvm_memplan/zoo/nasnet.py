"""NASNet-A Mobile (4 @ 1056), 224x224.

Zoph et al., "Learning Transferable Architectures for Scalable Image Recognition", CVPR 2018;
cell wiring as the PyTorch ports (Cadene ``pretrainedmodels`` ``nasnetamobile`` / timm
``nasnetamobile``): stem conv (32, 3x3 stride 2, no padding), CellStem0, CellStem1, then
3 x [FirstCell + 3 NormalCells] separated by ReductionCell0 / ReductionCell1, filters = 1056 // 24 = 44
doubling at each reduction, ReLU -> global average pool -> linear.

Each "branch separable" is ReLU, sep(k, stride), BN, ReLU, sep(k, 1), BN where sep = depthwise kxk
+ pointwise 1x1; BNs are folded. The ports emulate TensorFlow ``SAME`` padding of stride-2 ops with
ZeroPad2d + crop (``MaxPoolPad``, ``AvgPoolPad``, ``name='specific'``, ``BranchSeparablesReduction``);
here those ops get the equivalent explicit asymmetric ``SAME`` pads directly, and the factorized
reduction path 2 (pad right/bottom, crop top/left, 1x1 average pool stride 2) becomes
``Slice(start=1, step=2)`` after a Pad that is only needed when the size is odd. ReLUs of the same
tensor are shared (the ports recompute them per branch).
"""

from __future__ import annotations

import onnx

from .graph import GraphBuilder, T


def _branch(
    g: GraphBuilder, x: T, cout: int, k: int, stride: int, same: bool = False, stem: bool = False, base: str = "branch"
) -> T:
    """BranchSeparables (``stem``: BranchSeparablesStem, whose first sep already maps to cout)."""
    mid = cout if stem else x.c
    pad = "same" if (same and stride > 1) else (k - 1) // 2
    with g.scope(base):
        y = g.separable(g.relu(x), mid, k, stride, pad, bn=True, act="relu", base="sep1")
        return g.separable(y, cout, k, 1, (k - 1) // 2, bn=True, base="sep2")


def _avg3(g: GraphBuilder, x: T) -> T:
    return g.avgpool(x, 3, 1, 1, count_include_pad=False)


def _pool_s2(g: GraphBuilder, x: T, kind: str, same: bool) -> T:
    pad = "same" if same else 1
    if kind == "max":
        return g.maxpool(x, 3, 2, pad)
    return g.avgpool(x, 3, 2, pad, count_include_pad=False)


def _relu_conv_bn(g: GraphBuilder, x: T, cout: int, base: str) -> T:
    return g.conv(g.relu(x), cout, 1, bn=True, base=base)


def _factorized_reduction(g: GraphBuilder, x_prev: T, cout: int) -> T:
    """path_1 / path_2 of CellStem1 and FirstCell, then final_path_bn (folded into both convs)."""
    r = g.relu(x_prev)
    with g.scope("path1"):
        p1 = g.conv(g.avgpool(r, 1, 2, 0), cout // 2, 1, bn=True)
    with g.scope("path2"):
        h, w = r.hw
        p2 = r if (h % 2 == 0 and w % 2 == 0) else g.pad(r, 0, 0, h % 2, w % 2)
        p2 = g.conv(g.slice_hw(p2, 1, 2), cout - cout // 2, 1, bn=True)
    return g.concat([p1, p2])


def _reduction_body(
    g: GraphBuilder, left: T, right: T, c: int, same: bool, stem: bool = False, raw: T | None = None
) -> T:
    """Shared by CellStem0 / CellStem1 / ReductionCell0 / ReductionCell1.

    ``left`` is the 1x1-projected input (x1 / x_left / x_right in the ports' naming, the operand of
    the pools), ``right`` the operand of the 7x7/5x5 right-hand branches (CellStem0: the raw stem
    output through BranchSeparablesStem, ``stem=True``).
    """
    src = raw if raw is not None else right
    c0 = g.add(
        _branch(g, left, c, 5, 2, same, base="c0_left"), _branch(g, src, c, 7, 2, same, stem=stem, base="c0_right")
    )
    c1 = g.add(_pool_s2(g, left, "max", same), _branch(g, src, c, 7, 2, same, stem=stem, base="c1_right"))
    c2 = g.add(_pool_s2(g, left, "avg", same), _branch(g, src, c, 5, 2, same, stem=stem, base="c2_right"))
    c3 = g.add(_avg3(g, c0), c1)
    c4 = g.add(_branch(g, c0, c, 3, 1, same, base="c4_left"), _pool_s2(g, left, "max", same))
    return g.concat([c1, c2, c3, c4])


def _cell_stem_0(g: GraphBuilder, x: T, c: int) -> T:
    x1 = _relu_conv_bn(g, x, c, "conv_1x1")
    return _reduction_body(g, x1, x1, c, same=False, stem=True, raw=x)


def _cell_stem_1(g: GraphBuilder, x_conv0: T, x_stem_0: T, c: int) -> T:
    left = _relu_conv_bn(g, x_stem_0, c, "conv_1x1")
    right = _factorized_reduction(g, x_conv0, c)
    return _reduction_body(g, left, right, c, same=True)


def _reduction_cell(g: GraphBuilder, x: T, x_prev: T, c: int) -> T:
    x_left = _relu_conv_bn(g, x_prev, c, "conv_prev_1x1")
    x_right = _relu_conv_bn(g, x, c, "conv_1x1")
    # ports: comb_iter_0_left(x_right) ... right-hand branches take x_left, pools take x_right
    return _reduction_body(g, x_right, x_left, c, same=True)


def _normal_cell(g: GraphBuilder, x: T, x_prev: T, c_left: int, c: int, first: bool) -> T:
    if first:  # FirstCell: x_prev is one reduction step larger
        x_left = _factorized_reduction(g, x_prev, 2 * c_left)
    else:
        x_left = _relu_conv_bn(g, x_prev, c_left, "conv_prev_1x1")
    x_right = _relu_conv_bn(g, x, c, "conv_1x1")
    c0 = g.add(_branch(g, x_right, c, 5, 1, base="c0_left"), _branch(g, x_left, c, 3, 1, base="c0_right"))
    c1 = g.add(_branch(g, x_left, c, 5, 1, base="c1_left"), _branch(g, x_left, c, 3, 1, base="c1_right"))
    c2 = g.add(_avg3(g, x_right), x_left)
    c3 = g.add(_avg3(g, x_left), _avg3(g, x_left))
    c4 = g.add(_branch(g, x_right, c, 3, 1, base="c4_left"), x_right)
    return g.concat([x_left, c0, c1, c2, c3, c4])


def nasnet_a_mobile(
    resolution: int = 224,
    num_classes: int = 1000,
    seed: int = 0,
    penultimate_filters: int = 1056,
    stem_filters: int = 32,
) -> onnx.ModelProto:
    if penultimate_filters % 24 or (penultimate_filters // 24) % 4:
        raise ValueError("nasnet_a_mobile: penultimate_filters must be a multiple of 96")
    f = penultimate_filters // 24
    g = GraphBuilder("nasnet_a_mobile", resolution, seed)
    x = g.input((1, 3, resolution, resolution))
    x_conv0 = g.conv(x, stem_filters, 3, 2, 0, bn=True, base="conv0")
    with g.scope("cell_stem_0"):
        x_stem_0 = _cell_stem_0(g, x_conv0, f // 4)
    with g.scope("cell_stem_1"):
        x_stem_1 = _cell_stem_1(g, x_conv0, x_stem_0, f // 2)
    prev, cur = x_stem_0, x_stem_1
    idx = 0
    for stage, mult in enumerate((1, 2, 4)):
        if stage > 0:
            with g.scope(f"reduction_cell_{stage - 1}"):
                prev, cur = cur, _reduction_cell(g, cur, prev, mult * f)
            idx += 2
        for i in range(4):
            with g.scope(f"cell_{idx}"):
                first = i == 0
                c_left = mult * f // 2 if first else mult * f
                prev, cur = cur, _normal_cell(g, cur, prev, c_left, mult * f, first)
            idx += 1
    x = g.relu(cur)
    return g.finish(g.classifier(x, num_classes, base="last_linear"))
