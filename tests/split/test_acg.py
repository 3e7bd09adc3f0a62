"""The axis connection graph on hand-built loop nests (no TVM)."""

from tvm_memplan.split.acg import build_acg
from tvm_memplan.split.graph import Access, Affine, AxisKind, Block, Graph, Kernel, LoopAxis, Tensor, TensorRole

S, R = AxisKind.SPATIAL, AxisKind.REDUCTION


def _tensor(name, shape, role=TensorRole.INTERMEDIATE):
    return Tensor(name, shape, 4, role)


def _matmul(name, a, b, c, m, k, n):
    block = Block(
        "matmul",
        (LoopAxis("i", S, m), LoopAxis("j", S, n), LoopAxis("k", R, k)),
        Access("C", (Affine.of(i=1), Affine.of(j=1))),
        (Access("A", (Affine.of(i=1), Affine.of(k=1))), Access("B", (Affine.of(k=1), Affine.of(j=1)))),
    )
    return Kernel(name, "matmul", ("A", "B", "C"), (a, b, c), {"A": (m, k), "B": (k, n), "C": (m, n)}, (block,))


def _relu(name, x, y, m, n):
    block = Block(
        "relu",
        (LoopAxis("i", S, m), LoopAxis("j", S, n)),
        Access("Y", (Affine.of(i=1), Affine.of(j=1))),
        (Access("X", (Affine.of(i=1), Affine.of(j=1))),),
    )
    return Kernel(name, "relu", ("X", "Y"), (x, y), {"X": (m, n), "Y": (m, n)}, (block,))


def test_matmul_axes_follow_the_seed():
    """C = A·B: A.s1 -> C.s1, A.s2 -> C.t1 (reduction), B.s1 -> C.t1, B.s2 -> C.s2."""
    tensors = {n: _tensor(n, s) for n, s in {"a": (4, 5), "b": (5, 6), "c": (4, 6)}.items()}
    graph = Graph(tensors, [_matmul("mm", "a", "b", "c", 4, 5, 6)])
    acg = build_acg(graph)
    rows, k, cols = acg.component_of("a", 0), acg.component_of("a", 1), acg.component_of("b", 1)
    assert rows is acg.component_of("c", 0)
    assert k is acg.component_of("b", 0)
    assert cols is acg.component_of("c", 1)
    assert len({rows.id, k.id, cols.id}) == 3
    assert k.kinds("mm") == {"reduction"}
    assert rows.kinds("mm") == {"spatial"}


def test_a_chain_is_a_candidate_and_constants_join_nothing():
    tensors = {
        "x": _tensor("x", (4, 5), TensorRole.INPUT),
        "w": _tensor("w", (5, 6), TensorRole.CONSTANT),
        "h": _tensor("h", (4, 6)),
        "y": _tensor("y", (4, 6), TensorRole.OUTPUT),
    }
    graph = Graph(tensors, [_matmul("mm", "x", "w", "h", 4, 5, 6), _relu("act", "h", "y", 4, 6)])
    acg = build_acg(graph)
    rows = acg.component_of("h", 0)
    assert rows.kernels == ["mm", "act"] and rows in acg.candidates()
    # the weight is a constant: its axes are no hubs
    assert acg.component_of("w", 0) is None
    assert rows.output_axis(graph, "act") == 0


def test_sliding_window_axes():
    """A 1-D convolution ``y[o] = sum_k x[2*o + k] * w[k]`` slides along o."""
    block = Block(
        "conv",
        (LoopAxis("o", S, 8), LoopAxis("k", R, 3)),
        Access("Y", (Affine.of(o=1),)),
        (Access("X", (Affine.of(o=2, k=1),)), Access("W", (Affine.of(k=1),))),
    )
    kernel = Kernel("conv", "conv", ("X", "W", "Y"), ("x", "w", "y"), {"X": (17,), "W": (3,), "Y": (8,)}, (block,))
    window = block.windows()["o"]
    assert (window.kernel, window.stride, window.halo) == (3, 2, 2)
    # output rows 2..4 need input rows 4..10: stride 2 per row plus a halo of kernel - 1
    assert kernel.input_boxes(((2, 5),))[0] == ((4, 11),)
    graph = Graph(
        {"x": _tensor("x", (17,)), "w": _tensor("w", (3,), TensorRole.CONSTANT), "y": _tensor("y", (8,))}, [kernel]
    )
    # the window's reduction axis indexes the same input axis: one component, sliding + reduction
    nodes = build_acg(graph).component_of("y", 0).nodes
    assert {(n.axis, n.kind) for n in nodes} == {("o", "sliding"), ("k", "reduction")}


def _grouped_conv(name, x, y, channels, groups):
    """``y[f] = sum_r x[(f // per_group) * per_group + r]``: a grouped 1-D convolution's channel index."""
    per_group = channels // groups
    block = Block(
        "group_conv",
        (LoopAxis("f", S, channels), LoopAxis("r", R, per_group)),
        Access("Y", (Affine.of(f=1),)),
        (Access("X", (Affine((("r", 1),), 0, (("f", per_group, per_group),)),)),),
    )
    shapes = {"X": (channels,), "Y": (channels,)}
    return Kernel(name, "group_conv", ("X", "Y"), (x, y), shapes, (block,))


def test_grouped_convolution_joins_channels_through_the_group():
    """ResNeXt's grouped convolution reads its input channel through ``f // per_group``: the output
    channel axis joins the input's (one component, as for a depthwise convolution), and the input
    channels a range of output channels needs are whole groups."""
    kernel = _grouped_conv("gc", "x", "y", 8, 4)
    graph = Graph({"x": _tensor("x", (8,)), "y": _tensor("y", (8,))}, [kernel])
    acg = build_acg(graph)
    assert acg.component_of("x", 0) is acg.component_of("y", 0)
    assert acg.component_of("y", 0).kernels == ["gc"]
    # output channels 2..5 are groups 1 and 2: input channels 2..5; channel 3 alone needs its group
    assert kernel.input_boxes(((2, 6),))[0] == ((2, 6),)
    assert kernel.input_boxes(((3, 4),))[0] == ((2, 4),)


def test_quotient_terms_bound_intervals_exactly():
    expr = Affine((("r", 1),), 1, (("f", 4, 4),))  # 4 * (f // 4) + r + 1
    assert expr.axes == ("r", "f")
    assert expr.single_axis() is None
    values = {4 * (f // 4) + r + 1 for f in range(5, 11) for r in range(2)}
    assert expr.interval({"f": (5, 11), "r": (0, 2)}) == (min(values), max(values) + 1)
