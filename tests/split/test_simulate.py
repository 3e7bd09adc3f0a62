"""The memory simulator on hand-built programs (no TVM)."""

from tvm_memplan.split.simulate import Branch, Chain, Program, SplitChoice, Step, peak, split_program

from .programs import inverted_residual


def test_peak_is_the_largest_live_set():
    program, _ = inverted_residual()
    p = peak(program)
    assert p.bytes == 6 * 8 * 1000 * 2  # h and d live together
    assert set(p.live) == {"h", "d"}


def test_split_program_runs_tiles_and_keeps_outside_tensors():
    program, chain = inverted_residual()
    split = split_program(program, [SplitChoice(chain, 4)])
    names = [s.name for s in split.steps]
    assert names[:2] == ["x", "h#h#0"] and "h" not in split.sizes and "d" not in split.sizes
    assert sum(split.sizes[f"h#h#{t}"] for t in range(4)) == program.sizes["h"]
    # x (the chain's input) and y (the running sum) stay whole; a tile pair is live at a time
    assert peak(split).bytes == program.sizes["x"] + program.sizes["y"] + 2 * program.sizes["h"] // 4


def test_concat_tail_writes_the_last_tensor_in_regions():
    program, _ = inverted_residual()
    chain = Chain((Branch("h", ("d",), 48, 48),), None, (), None, program.sizes["h"])
    split = split_program(program, [SplitChoice(chain, 2)])
    assert "d" in split.sizes and "h" not in split.sizes
    assert peak(split).bytes == program.sizes["x"] + program.sizes["d"] + program.sizes["h"] // 2


def test_branches_joined_by_a_concat_never_materialize_it():
    """Two branches (a, b) concatenated into c (concat elimination: one tensor), pooled into p,
    reduced by the next convolution into y: split, c exists one branch tile at a time."""
    sizes = {"x": 100, "c": 1600, "p": 400, "y": 100}
    steps = [Step("x", "x", ()), Step("a", "c", ("x",)), Step("b", "c", ("x",)), Step("cat", "c", ()),
             Step("p", "p", ("c",)), Step("y", "y", ("p",)), Step("out", "out", ("y",))]
    program = Program(steps, sizes, {"a": "c", "b": "c", "cat": "c"})
    chain = Chain((Branch("a", (), 8, 8), Branch("b", (), 24, 24)), "cat", ("p",), "y", 2000)
    assert peak(program).bytes == 1600 + 400  # c and p
    split = split_program(program, [SplitChoice(chain, 4)])
    assert "c" not in split.sizes and "p" not in split.sizes
    # branch b's share of c is 3/4, a quarter of it per tile: 300; its share of p per tile: 75
    assert split.sizes["c#b#0"] == 300 and split.sizes["p#b#0"] == 75
    assert peak(split).bytes == 100 + 300 + 75 + 100
