"""Concat elimination: when a concat's inputs can be written straight into their slices of its output.

The rule both Relax → liveness models apply: the planner's (:mod:`tvm_memplan.relax.inplace`, on
the lowered concat kernels) and the splitter's simulator (:mod:`tvm_memplan.relax.split.program`,
on Relax operators). docs/design.md, "In-place kernels and concat elimination".
"""

from __future__ import annotations

from collections.abc import Sequence


def concat_layout(
    input_shapes: Sequence[tuple[int, ...]], output_shape: tuple[int, ...], itemsize: int
) -> list[int] | None:
    """Byte offsets of each input inside the output, when every input is a contiguous slice."""
    rank = len(output_shape)
    if any(len(shape) != rank for shape in input_shapes):
        return None
    for axis in range(rank):
        others_match = all(
            shape[:axis] == output_shape[:axis] and shape[axis + 1 :] == output_shape[axis + 1 :]
            for shape in input_shapes
        )
        if not others_match or sum(shape[axis] for shape in input_shapes) != output_shape[axis]:
            continue
        if any(dim != 1 for dim in output_shape[:axis]):
            return None  # slices along an inner axis interleave in memory
        inner = 1
        for dim in output_shape[axis + 1 :]:
            inner *= dim
        offsets, position = [], 0
        for shape in input_shapes:
            offsets.append(position * inner * itemsize)
            position += shape[axis]
        return offsets
    return None


def concat_slices(
    input_shapes: Sequence[tuple[int, ...]], output_shape: tuple[int, ...], itemsize: int, alignment: int
) -> tuple[list[int] | None, str | None]:
    """``(byte offsets of the inputs in the output, None)`` when they can be written in place, else
    ``(None, why the concat stays a copy)``: the slices must be contiguous and start at aligned offsets."""
    offsets = concat_layout(input_shapes, output_shape, itemsize)
    if offsets is None:
        return None, "inputs are not contiguous slices of the output (concat on an inner axis)"
    if any(delta % alignment for delta in offsets):
        return None, f"a slice offset is not {alignment}-byte aligned (a view there would copy)"
    return offsets, None
