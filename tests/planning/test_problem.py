"""The problem model: bounds, padding, conflicts and MiniMalloc's CSV format."""

import pytest

from tvm_memplan.planning import Buffer, Problem, ProblemFormatError, align_up, read_minimalloc_csv, write_offsets_csv

from ..shared_inputs import MINIMALLOC_CHALLENGING as CHALLENGING
from .examples import pisarchyk_lee_problem


def test_pisarchyk_lee_bounds():
    problem = pisarchyk_lee_problem()
    assert problem.lower_bound() == 124  # t2 + t3 + t4 + t5 alive at operator 5
    assert problem.naive_bytes() == 234
    assert problem.horizon() == 9


def test_alignment_pads_sizes_and_the_bound():
    problem = Problem([Buffer("a", 1, 0, 2), Buffer("b", 65, 1, 3), Buffer("c", 0, 0, 3)])
    assert problem.alignment == 64
    assert problem.padded_sizes() == [64, 128, 0]
    assert problem.lower_bound() == 192
    assert problem.naive_bytes() == 192
    assert align_up(0, 64) == 0 and align_up(64, 64) == 64 and align_up(65, 64) == 128


def test_half_open_lifetimes_do_not_meet_at_the_boundary():
    first, second = Buffer("a", 8, 0, 2), Buffer("b", 8, 2, 4)
    assert not first.lives_with(second)
    assert Problem([first, second], alignment=1).lower_bound() == 8


def test_conflicts_are_normalised_and_checked():
    buffers = [Buffer("a", 8, 0, 1), Buffer("b", 8, 1, 2), Buffer("c", 8, 0, 2)]
    problem = Problem(buffers, conflicts=frozenset({(1, 0)}))
    assert problem.conflicts == frozenset({(0, 1)})
    assert problem.must_not_overlap(0, 1)  # lifetimes disjoint, but a declared conflict
    assert problem.must_not_overlap(2, 0)  # alive together
    assert not problem.must_not_overlap(1, 1)
    with pytest.raises(ValueError, match="does not name two buffers"):
        Problem(buffers, conflicts=frozenset({(0, 3)}))
    with pytest.raises(ValueError, match="does not name two buffers"):
        Problem(buffers, conflicts=frozenset({(2, 2)}))


def test_buffer_rejects_negative_size_and_empty_lifetime():
    with pytest.raises(ValueError, match="negative size"):
        Buffer("a", -1, 0, 1)
    with pytest.raises(ValueError, match="empty lifetime"):
        Buffer("a", 1, 3, 3)
    with pytest.raises(ValueError, match="alignment"):
        Problem([], alignment=0)


def test_csv_round_trip(tmp_path):
    path = tmp_path / "input.csv"
    path.write_text("id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\n\nb3,0,9,4\n")
    problem = read_minimalloc_csv(path, alignment=4)
    assert [b.name for b in problem.buffers] == ["b1", "b2", "b3"]
    assert problem.buffers[1] == Buffer("b2", 4, 3, 9)
    out = tmp_path / "output.csv"
    write_offsets_csv(out, problem, [0, 0, 4])
    assert out.read_text().splitlines() == ["id,lower,upper,size,offset", "b1,0,3,4,0", "b2,3,9,4,0", "b3,0,9,4,4"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("name,start,end,bytes\na,0,1,4\n", "expected the header"),
        ("", "expected the header"),
        ("id,lower,upper,size\n", "no buffers"),
        ("id,lower,upper,size\na,0,1\n", r":2: expected 4 columns, got 3"),
        ("id,lower,upper,size\na,0,1,4\nb,0,x,4\n", r":3: lower, upper and size must be integers"),
        ("id,lower,upper,size\na,5,5,4\n", r":2: need lower < upper and size >= 0"),
        ("id,lower,upper,size\na,0,5,-4\n", r":2: need lower < upper and size >= 0"),
    ],
)
def test_csv_errors_are_one_line(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ProblemFormatError, match=message) as error:
        read_minimalloc_csv(path)
    assert "\n" not in str(error.value)


def test_csv_missing_file_and_directory(tmp_path):
    with pytest.raises(ProblemFormatError, match="no such file") as error:
        read_minimalloc_csv(tmp_path / "absent.csv")
    assert "\n" not in str(error.value)
    with pytest.raises(ProblemFormatError, match="cannot read"):
        read_minimalloc_csv(tmp_path)


@pytest.mark.skipif(not CHALLENGING.is_dir(), reason="MiniMalloc benchmarks not on this machine")
def test_reads_a_challenging_instance():
    problem = read_minimalloc_csv(CHALLENGING / "A.1048576.csv")
    assert len(problem) == 154
    assert problem.lower_bound() == 1048576
    assert all(b.size % 64 == 0 for b in problem.buffers)
