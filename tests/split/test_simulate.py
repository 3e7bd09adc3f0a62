"""The memory simulator on hand-built programs (no TVM)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_memplan.planning import Buffer, Operator, Problem, plan_aliased, tensor_lifetimes
from tvm_memplan.planning.order import OrderGraph
from tvm_memplan.split.simulate import (
    Branch,
    Chain,
    Program,
    SplitChoice,
    Step,
    blocked_bytes,
    in_place,
    peak,
    split_program,
)

from .programs import inverted_residual


def test_peak_is_the_largest_live_set():
    program, _ = inverted_residual()
    p = peak(program)
    assert p.bytes == 6 * 8 * 1000 * 2  # h and d live together
    assert set(p.live) == {"h", "d"}


def test_blocked_bytes_round_channels_up_to_whole_blocks():
    """NCHW16c holds 8 channels in one block of 16, 24 in two; NCHW and other ranks are not padded."""
    assert blocked_bytes((1, 8, 10, 10), 4) == 8 * 100 * 4
    assert blocked_bytes((1, 8, 10, 10), 4, 16) == 16 * 100 * 4
    assert blocked_bytes((1, 24, 10, 10), 1, 16) == 32 * 100
    assert blocked_bytes((1, 32, 10, 10), 4, 16) == blocked_bytes((1, 32, 10, 10), 4)
    assert blocked_bytes((1, 3, 5), 4, 16) == blocked_bytes((2, 3, 5, 5), 4, 16) // 2 // 5 == 3 * 5 * 4


@given(st.integers(1, 70), st.integers(1, 9), st.sampled_from([4, 8, 16]))
def test_a_row_tile_of_a_blocked_tensor_is_its_rows_share(channels, rows, block):
    """A tile of whole rows holds those rows of every block, padded channels included."""
    whole = blocked_bytes((1, channels, rows, 3), 4, block)
    assert whole == rows * blocked_bytes((1, channels, 1, 3), 4, block) >= blocked_bytes((1, channels, rows, 3), 4)
    assert whole < blocked_bytes((1, channels + block, rows, 3), 4, block)


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
    steps = [
        Step("x", "x", ()),
        Step("a", "c", ("x",)),
        Step("b", "c", ("x",)),
        Step("cat", "c", ()),
        Step("p", "p", ("c",)),
        Step("y", "y", ("p",)),
        Step("out", "out", ("y",)),
    ]
    program = Program(steps, sizes, {"a": "c", "b": "c", "cat": "c"})
    chain = Chain((Branch("a", (), 8, 8), Branch("b", (), 24, 24)), "cat", ("p",), "y", 2000)
    assert peak(program).bytes == 1600 + 400  # c and p
    split = split_program(program, [SplitChoice(chain, 4)])
    assert "c" not in split.sizes and "p" not in split.sizes
    # branch b's share of c is 3/4, a quarter of it per tile: 300; its share of p per tile: 75
    assert split.sizes["c#b#0"] == 300 and split.sizes["p#b#0"] == 75
    assert peak(split).bytes == 100 + 300 + 75 + 100


def test_an_anchored_chain_runs_after_its_anchor():
    """Attention: the query projection q heads a row chain whose scores read the keys k, computed
    after q; the tiles run once k exists (the chain's anchor), q never exists whole."""
    sizes = {"x": 100, "q": 100, "k": 100, "s": 400, "o": 100}
    steps = [
        Step("x", "x", ()),
        Step("q", "q", ("x",)),
        Step("k", "k", ("x",)),
        Step("s", "s", ("q", "k")),
        Step("o", "o", ("s", "x")),
        Step("out", "out", ("o",)),
    ]
    program = Program(steps, sizes)
    chain = Chain((Branch("q", ("s", "o"), 4, 4),), None, (), None, 500, rows=True, anchor="k")
    split = split_program(program, [SplitChoice(chain, 4)])
    names = [s.name for s in split.steps]
    assert names[:3] == ["x", "k", "q#q#0"] and names[-1] == "out"
    assert "q" not in split.sizes and "s" not in split.sizes
    # x, k and the output whole, one tile of q and s at a time
    assert peak(split).bytes == 100 + 100 + 100 + 25 + 100
    assert peak(program).bytes == 100 + 100 + 100 + 400  # x, q, k, s


def test_an_anchor_inside_another_chain_places_the_tiles_after_that_chain():
    sizes = {"x": 100, "q": 100, "k": 200, "kt": 100, "s": 400, "o": 100}
    steps = [
        Step("x", "x", ()),
        Step("q", "q", ("x",)),
        Step("k", "k", ("x",)),
        Step("kt", "kt", ("k",)),
        Step("s", "s", ("q", "kt")),
        Step("o", "o", ("s", "x")),
        Step("out", "out", ("o",)),
    ]
    program = Program(steps, sizes)
    keys = Chain((Branch("k", ("kt",), 4, 4),), None, (), None, 200, rows=True)
    queries = Chain((Branch("q", ("s", "o"), 4, 4),), None, (), None, 500, rows=True, anchor="kt")
    split = split_program(program, [SplitChoice(queries, 2), SplitChoice(keys, 2)])
    names = [s.name for s in split.steps]
    assert names.index("q#q#0") > max(i for i, n in enumerate(names) if n.startswith("kt#k#"))
    assert all(n not in names for n in ("q", "k", "kt", "s", "o"))


@st.composite
def _programs(draw) -> Program:
    """Random kernels in order, each writing a new tensor from earlier ones (some of them read
    at the written index, which an in-place kernel may overwrite); the last one returned."""
    count = draw(st.integers(2, 14))
    steps, sizes = [], {}
    for i in range(count):
        reads = tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else ()))
        pointwise = tuple(f"t{r}" for r in reads if draw(st.booleans()))
        steps.append(Step(f"t{i}", f"t{i}", tuple(f"t{r}" for r in reads), pointwise))
        if i < count - 1:  # the result lives outside the arena
            sizes[f"t{i}"] = 64 * draw(st.integers(1, 4))
    return Program(steps, sizes)


@settings(max_examples=200, deadline=None)
@given(_programs())
def test_simulated_peak_is_the_planners_bound(program):
    """The simulator's peak equals the lower bound of the planning problem the planner builds from the
    same kernels (lifetimes, in-place outputs as aliases of the input they overwrite) and the peak
    of the order search's model in program order; no placement of the problem is smaller."""
    lifetimes = tensor_lifetimes(program.steps)
    names = [t for t in dict.fromkeys(s.writes for s in program.steps) if t in program.sizes]
    buffers = [Buffer(t, program.sizes[t], *lifetimes[t]) for t in names]
    index = {t: i for i, t in enumerate(names)}
    inside = in_place(program, lifetimes)
    problem = Problem(buffers, aliases={index[t]: (index[source], 0) for t, (source, _, _) in inside.items()})
    graph = OrderGraph.from_operators(
        [Operator(s.name, s.reads, (s.writes,)) for s in program.steps],
        program.sizes,
        inplace={i: s.overwrites for i, s in enumerate(program.steps)},
    )
    simulated = peak(program).bytes
    assert simulated == problem.lower_bound() == graph.peak(range(len(program.steps)))
    plan, _ = plan_aliased(problem, time_budget=0.5)
    assert plan.arena_bytes >= simulated
