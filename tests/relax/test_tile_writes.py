"""Row tiles written straight into their rows of the full tensor (no copy kernel)."""

import numpy as np
import tvm
from tvm import relax, te

from tvm_memplan.relax.pipeline import pipeline
from tvm_memplan.relax.split import split_chains
from tvm_memplan.relax.tile_writes import ROW_OFFSET_ATTR, WriteTilesInPlace, written_into_rows
from tvm_memplan.split.simulate import SplitChoice
from tvm_memplan.verify.run import run_vm

from .test_split_spatial import SHAPE, TARGET, _longest, _stem_module


def test_a_kernel_writes_its_tile_into_the_rows_of_the_full_tensor():
    x = te.placeholder((1, 4, 6, 5), name="x")
    y = te.compute((1, 4, 3, 5), lambda n, c, h, w: x[n, c, h + 1, w] * 2.0 + 1.0, name="y")
    kernel = written_into_rows(te.create_prim_func([x, y]), (1, 4, 10, 5), 4)
    a = np.random.default_rng(0).standard_normal((1, 4, 6, 5)).astype("float32")
    full = np.full((1, 4, 10, 5), 7.0, "float32")
    out = tvm.runtime.tensor(full)
    tvm.compile(tvm.IRModule({"main": kernel}), "llvm")["main"](tvm.runtime.tensor(a), out)
    np.testing.assert_array_equal(out.numpy()[:, :, 4:7], a[:, :, 1:4] * 2 + 1)
    # the other rows are left as they were
    np.testing.assert_array_equal(np.delete(out.numpy(), range(4, 7), axis=2), np.delete(full, range(4, 7), axis=2))


def test_a_tile_that_is_not_plain_rows_keeps_its_copy():
    x = te.placeholder((1, 4, 6, 5), name="x")
    y = te.compute((1, 4, 3, 5), lambda n, c, h, w: x[n, c, h, w], name="y")
    assert written_into_rows(te.create_prim_func([x, y]), (1, 8, 10, 5), 0) is None  # other channels
    assert written_into_rows(te.create_prim_func([x, y]), (1, 4, 10, 5), 8) is None  # beyond the rows


def _copies(mod: tvm.IRModule) -> int:
    return sum(
        1
        for f in mod.functions.values()
        if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and ROW_OFFSET_ATTR in f.attrs
    )


def test_split_spatial_chain_runs_without_copy_kernels():
    stem = _stem_module()
    split = split_chains(stem, [SplitChoice(_longest(stem), 3)])
    assert _copies(split) == 3
    with TARGET:
        lowered = tvm.transform.Sequential(
            [
                relax.transform.LegalizeOps(),
                relax.transform.AnnotateTIROpPattern(),
                relax.transform.FuseOps(),
                relax.transform.FuseTIR(),
                WriteTilesInPlace(),
            ]
        )(split)
    assert _copies(lowered) == 0
    x = np.random.default_rng(4).standard_normal(SHAPE).astype("float32")
    with TARGET:
        executable = tvm.compile(split, TARGET, relax_pipeline=pipeline(TARGET, order="program"))
        reference = tvm.compile(stem, TARGET, relax_pipeline=pipeline(TARGET, order="program"))
    (out,), _ = run_vm(executable, [x])
    (expected,), _ = run_vm(reference, [x])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
