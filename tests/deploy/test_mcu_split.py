"""``build --target cortex-m7 --emit-c DIR --split acg`` on an int8 (QDQ) model, run on the emulated
Cortex-M7: the row tiles run the whole-layer C kernels, the last kernel of each tile writes its rows
of the full tensor (MCUNetV2's patch-based inference), the tiles share one copy of their weights, and
the outputs keep onnxruntime's codes with the arena the plan's."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import tvm

from tvm_memplan.deploy.emit_c import emit_c
from tvm_memplan.deploy.standalone import measure_c
from tvm_memplan.frontend import load_model, to_relax
from tvm_memplan.quant.mcu_kernels import C_KERNELS, POINTWISE_KERNEL, ROW_COPY_KERNEL, ROW_PLACE_KERNEL
from tvm_memplan.relax.ir_utils import top_level_bindings
from tvm_memplan.relax.split import find_chains, normalize, program_of, split_chains
from tvm_memplan.split.simulate import SplitChoice, peak, split_program

from .conftest import SPLIT_LIMIT, needs_arm, run_cli_json

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


def _distinct_weights(directory: Path) -> bool:
    arrays = re.findall(r"const (\w+) \w+\[\d+\][^=]*= \{([^}]*)\};", (directory / "model_weights.c").read_text())
    return bool(arrays) and len(set(arrays)) == len(arrays)


@needs_arm
def test_split_int8_model_runs_on_the_emulated_m7_within_the_memory_limit(capsys, int8_model, tmp_path):
    directory = tmp_path / "c"
    split = ("--split", "acg", "--memory-limit", str(SPLIT_LIMIT), "--search-seconds", "10")
    built = run_cli_json(
        capsys, "build", str(int8_model), "--target", "cortex-m7", "--emit-c", str(directory), "--order-seconds", "1",
        *split, "--split-cache", str(tmp_path / "cache.jsonl"),
    )  # fmt: skip
    assert built["split"] and built["arena_bytes"] <= SPLIT_LIMIT
    assert _distinct_weights(directory)  # each weight once, however many tiles read it
    measured = run_cli_json(capsys, "measure", str(directory), "--device", "qemu-cortex-m7")["memplan"]
    assert measured["correct"], measured
    assert measured["arena_bytes"] == measured["planned_arena_bytes"] == built["arena_bytes"]


def _stem_choice(mod: tvm.IRModule, rolling: bool = False) -> SplitChoice:
    """The first chain of three window kernels (the stem's) in three row tiles (``mod`` normalized)."""
    order = {b.var.name: i for i, b in enumerate(top_level_bindings(mod["main"]))}
    chains = [c for c in find_chains(mod) if not c.gathered and sum(op.window is not None for op in c.ops) == 3]
    return SplitChoice(min(chains, key=lambda c: order[c.ops[0].name]), 3, rolling=rolling)


def _stem_in_three_row_tiles(mod: tvm.IRModule) -> tvm.IRModule:
    """The first chain of three window kernels (the stem's), split into three row tiles."""
    mod = normalize(mod)
    return split_chains(mod, [_stem_choice(mod)])


@needs_cc
def test_row_tiles_of_c_kernels_write_into_their_rows(int8_model, tmp_path):
    """The stem's chain (window kernel, depthwise, 1x1 projection) in three row tiles: each tile's
    projection writes its rows of the full tensor, with no copy, and the C keeps onnxruntime's codes."""
    directory = tmp_path / "c"
    emitted = emit_c(str(int8_model), directory, "cortex-m7", prepare=_stem_in_three_row_tiles, order="program")
    calls = re.findall(rf"({'|'.join(C_KERNELS)})\((.*)\);", (directory / "kernels.c").read_text())
    into_rows = [args for name, args in calls if name == POINTWISE_KERNEL and "&(root[" in args]
    # three tiles of 4 rows of the 8x12x12 projection, their planes 12 x 12 apart
    assert len(into_rows) == 3 and all(args.endswith(", 16, 8, 48, 16", 0, args.index(", -128")) for args in into_rows)
    assert all(args.endswith(", 144") for args in into_rows)
    assert not any("write_rows" in kernel for kernel in emitted.model.kernel_names)
    assert _distinct_weights(directory)
    result = measure_c(directory, "host")
    assert result.correct and result.arena_bytes == result.planned_arena_bytes, result


@needs_arm
def test_row_tiles_read_their_int8_input_rows_by_word_copies_on_the_emulated_m7(int8_model, tmp_path):
    """With int8 inputs (``--int8-io``) the stem's three row tiles take their input rows (with the halo) through
    :data:`ROW_COPY_KERNEL` (whole rows by LDM/STM) instead of TVM's sliced copy; the emulated M7 gives
    onnxruntime's codes."""
    directory = tmp_path / "c"
    emit_c(str(int8_model), directory, "cortex-m7", prepare=_stem_in_three_row_tiles, order="program", int8_io=True)
    kernels = (directory / "kernels.c").read_text()
    assert len(re.findall(rf"\b{ROW_COPY_KERNEL}\(", kernels)) == 1 + 3  # its definition, one call per tile
    assert "strided_slice" not in kernels
    result = measure_c(directory, "qemu-cortex-m7")
    assert result.correct and result.arena_bytes == result.planned_arena_bytes, result


@needs_arm
def test_row_tiles_with_a_line_buffer_of_int8_rows_on_the_emulated_m7(int8_model, tmp_path):
    """The stem's three row tiles keeping a line buffer, per kernel: each tile's kept int8 rows go to the top of
    the next tile's buffer through :data:`ROW_PLACE_KERNEL` (not TVM's byte loop); the outputs agree with
    onnxruntime as the unsplit build's do, and the arena is the plan's and the simulator's."""

    def rolling(mod: tvm.IRModule) -> tvm.IRModule:
        mod = normalize(mod)
        return split_chains(mod, [_stem_choice(mod, rolling=True)])

    split_dir, whole_dir = tmp_path / "rolling", tmp_path / "whole"
    emitted = emit_c(str(int8_model), split_dir, "cortex-m7", prepare=rolling, order="program", int8_io=True)
    emit_c(str(int8_model), whole_dir, "cortex-m7", order="program", int8_io=True)
    assert [n for n in emitted.model.kernel_names if n.startswith("place_rows")] == ["place_rows"] * 2  # tiles 1, 2
    kernels = (split_dir / "kernels.c").read_text()
    assert len(re.findall(rf"\b{ROW_PLACE_KERNEL}\(", kernels)) == 1 + 1  # its definition, the kernel's call
    split, whole = measure_c(split_dir, "qemu-cortex-m7"), measure_c(whole_dir, "qemu-cortex-m7")
    assert split.correct and whole.correct and split.diff_lsb == whole.diff_lsb, (split, whole)
    normalized = normalize(to_relax(load_model(str(int8_model))))
    simulated = peak(split_program(program_of(normalized), [_stem_choice(normalized, rolling=True)])).bytes
    assert split.arena_bytes == split.planned_arena_bytes == simulated < whole.arena_bytes
