"""Concat elimination's rule: contiguous slices at aligned offsets."""

import pytest

from tvm_memplan.planning.concat import concat_layout, concat_slices


@pytest.mark.parametrize(
    "shapes, out, expected",
    [
        ([(1, 2, 4), (1, 3, 4)], (1, 5, 4), [0, 32]),
        ([(2, 4), (2, 4)], (2, 8), None),  # inner axis: rows interleave
        ([(1, 1, 4), (1, 1, 4)], (1, 1, 8), [0, 16]),  # outermost non-unit axis is the last
    ],
)
def test_concat_layout(shapes, out, expected):
    assert concat_layout(shapes, out, 4) == expected


def test_concat_slices_need_aligned_offsets():
    assert concat_slices([(1, 2, 4), (1, 3, 4)], (1, 5, 4), 4, alignment=32) == ([0, 32], None)
    offsets, why = concat_slices([(1, 2, 4), (1, 3, 4)], (1, 5, 4), 4, alignment=64)
    assert offsets is None and "not 64-byte aligned" in why
    offsets, why = concat_slices([(2, 4), (2, 4)], (2, 8), 4, alignment=1)
    assert offsets is None and "inner axis" in why
