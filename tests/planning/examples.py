"""Problems shared by the planning tests."""

from __future__ import annotations

import random

from hypothesis import strategies as st

from tvm_memplan.planning import Buffer, Operator, Problem, problem_from_graph

# Pisarchyk & Lee 2020 (arXiv:2001.03288), the example network's tensor usage records:
# (size, first operator, last operator); the paper's intervals are inclusive.
PISARCHYK_LEE_RECORDS = [(32, 0, 1), (28, 1, 4), (36, 2, 5), (16, 3, 5), (8, 4, 5), (64, 5, 7), (10, 6, 8), (40, 7, 8)]


def pisarchyk_lee_problem() -> Problem:
    """The paper's 8 tensors, byte-granular: lower bound 124 (at operator 5), 234 without sharing."""
    buffers = [Buffer(f"t{i}", size, first, last + 1) for i, (size, first, last) in enumerate(PISARCHYK_LEE_RECORDS)]
    return Problem(buffers, alignment=1)


def nn_like_problem(num_tensors: int, seed: int = 0) -> Problem:
    """A chain of operators with random skip connections and mixed tensor sizes, like a CNN."""
    rng = random.Random(seed)
    operators, sizes = [], {}
    for i in range(num_tensors):
        reads = [i - 1] if i else ["input"]
        if i > 4 and rng.random() < 0.3:
            reads.append(rng.randint(max(0, i - 40), i - 2))
        operators.append(Operator(f"op{i}", tuple(reads), (i,)))
        sizes[i] = rng.choice([1, 2, 4, 8, 16]) * rng.choice([1024, 4096, 16384, 65536]) + rng.randrange(512)
    return problem_from_graph(operators, sizes)


def cut_square(pieces: int, seed: int, horizon: int = 64, height: int = 64) -> Problem:
    """Random guillotine cuts of a ``horizon`` x ``height`` rectangle into buffers.

    The pieces tile the rectangle, so ``height`` is both the lower bound and a feasible arena:
    a generator of hard instances with a known optimum (MiniMalloc's challenging set is built
    the same way).
    """
    rng = random.Random(seed)
    rects = [(0, horizon, 0, height)]  # (start, end, bottom, top)
    while len(rects) < pieces:
        k = max(
            range(len(rects)), key=lambda i: (rects[i][1] - rects[i][0]) * (rects[i][3] - rects[i][2]) * rng.random()
        )
        start, end, bottom, top = rects[k]
        if rng.random() < 0.5 and end - start > 1:
            cut = rng.randint(start + 1, end - 1)
            rects[k : k + 1] = [(start, cut, bottom, top), (cut, end, bottom, top)]
        elif top - bottom > 1:
            cut = rng.randint(bottom + 1, top - 1)
            rects[k : k + 1] = [(start, end, bottom, cut), (start, end, cut, top)]
    return Problem(
        [Buffer(i, top - bottom, start, end) for i, (start, end, bottom, top) in enumerate(rects)], alignment=1
    )


@st.composite
def problems(draw: st.DrawFn, max_buffers: int = 12, max_time: int = 10) -> Problem:
    """Random problems: sizes (zero included), lifetimes, extra conflict pairs and alignment."""
    n = draw(st.integers(0, max_buffers))
    buffers = []
    for i in range(n):
        start = draw(st.integers(0, max_time - 1))
        end = draw(st.integers(start + 1, max_time))
        buffers.append(Buffer(i, draw(st.integers(0, 300)), start, end))
    pairs = st.tuples(st.integers(0, max(n - 1, 0)), st.integers(0, max(n - 1, 0))).filter(lambda p: p[0] != p[1])
    conflicts = frozenset(draw(st.lists(pairs, max_size=4))) if n >= 2 else frozenset()
    alignment = draw(st.sampled_from([1, 8, 64]))
    return Problem(buffers, conflicts, alignment)
