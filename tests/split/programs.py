"""Hand-built programs for the simulator and search tests."""

from tvm_memplan.split.simulate import Branch, Chain, Program, SpatialChain, Step
from tvm_memplan.split.spatial import RowOp, RowWindow


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


def row_pipeline(row_bytes: dict[str, int], rows: int = 16) -> tuple[Program, dict[tuple[str, str], SpatialChain]]:
    """x -> one 3x3 convolution per name of ``row_bytes`` (in order, each reading the one before) -> z, and
    the spatial chain from each name to each later one (by its first and last name)."""
    order = list(row_bytes)
    window = RowWindow(3, 1, 1, 1, rows)

    def chain(first: int, last: int) -> SpatialChain:
        names = order[first : last + 1]
        ops = tuple(
            RowOp(
                n,
                rows,
                row_bytes[n],
                window=window,
                reads=(names[i - 1],) if i else (),
                outside=() if i else ((order[first - 1] if first else "x"),),
            )
            for i, n in enumerate(names)
        )
        return SpatialChain(
            Branch(names[0], tuple(names[1:]), rows, 1), ops, sum(rows * row_bytes[n] for n in names[:-1])
        )

    steps = [Step(n, n, (order[i - 1] if i else "x",)) for i, n in enumerate(order)] + [Step("z", "z", (order[-1],))]
    sizes = {n: rows * b for n, b in row_bytes.items()} | {"z": rows * row_bytes[order[-1]]}
    chains = {(order[i], order[j]): chain(i, j) for i in range(len(order)) for j in range(i + 1, len(order))}
    return Program(steps, sizes), chains
