"""Hand-built programs for the simulator and search tests."""

from tvm_memplan.split.simulate import Branch, Chain, Program, Step


def inverted_residual(expand: int = 6, width: int = 8, rows: int = 1000) -> tuple[Program, Chain]:
    """x -> expand (head) -> dw (mid) -> project (tail, reduces the chain's channels) -> y."""
    c, e = width, width * expand
    sizes = {"x": c * rows, "h": e * rows, "d": e * rows, "y": c * rows}
    steps = [
        Step("x", "x", ()),
        Step("h", "h", ("x",)),
        Step("d", "d", ("h",)),
        Step("y", "y", ("d",)),
        Step("out", "out", ("y",)),
    ]
    return Program(steps, sizes), Chain((Branch("h", ("d",), e, e),), None, (), "y", sizes["h"] + sizes["d"])
