"""Vulkan through tvm_memplan's GLSL code generator, on this machine's Vulkan device (lavapipe in CI).

Kernel by kernel: each Relax module is built for Vulkan with tvm_memplan's pipeline (TVM's default GPU
schedules) and for LLVM, and both run on the same inputs. TIR kernels pin down constructs the zoo's
kernels may not show at small sizes (shared memory with barriers, vectors, scalar arguments).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax import op
from tvm.script import tirx as T

import tvm_memplan
from tvm_memplan.backends import vulkan as vulkan_codegen
from tvm_memplan.backends.sidecars import runtime_loaded
from tvm_memplan.backends.vulkan.build import compile_glsl
from tvm_memplan.backends.vulkan.glsl import kernel_to_glsl
from tvm_memplan.cli.main import main
from tvm_memplan.deploy import error_line
from tvm_memplan.deploy.rpc import start_farm
from tvm_memplan.errors import UserError
from tvm_memplan.frontend import LoadedModel
from tvm_memplan.planner import plan_model
from tvm_memplan.relax.offsets import scalar_params
from tvm_memplan.relax.pipeline import schedule_passes
from tvm_memplan.verify import verify_plan
from tvm_memplan.zoo.graph import GraphBuilder

from ..deploy.conftest import over_rpc
from .conftest import needs_device

FAST = ("--repeat", "1", "--min-repeat-ms", "1")
VULKAN = {"kind": "vulkan", "host": "llvm"}

vulkan_codegen.register()
ours = pytest.mark.skipif(not vulkan_codegen.is_ours(), reason="this TVM has its own Vulkan code generator")
needs_glslang = pytest.mark.skipif(
    vulkan_codegen.is_ours() and shutil.which(vulkan_codegen.GLSLANG) is None,
    reason="glslangValidator missing (Debian: glslang-tools)",
)


def needs_vulkan(test: Callable) -> Callable:
    """A Vulkan device, and what tvm_memplan's generator needs to build for it."""
    return needs_device("vulkan")(needs_glslang(test))


def glsl_of(executable) -> str:
    """The GLSL of every kernel in a built executable (the Vulkan module keeps it as its source)."""
    modules = [m for m in executable.mod._collect_from_import_tree(lambda m: True) if m.kind == "vulkan"]
    return "\n".join(m.inspect_source("glsl") for m in modules)


def run_both(build: Callable, *inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """``build(*params)`` as a Relax function run on Vulkan (tvm_memplan's pipeline) and on LLVM,
    and the Vulkan kernels' GLSL."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType(x.shape, str(x.dtype))) for i, x in enumerate(inputs)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(*params))
        bb.emit_func_output(out)
    outputs = []
    for config, dev in ((VULKAN, tvm.vulkan(0)), ({"kind": "llvm"}, tvm.cpu(0))):
        target = tvm.target.Target(config)
        executable = tvm.compile(bb.get(), target, relax_pipeline=tvm_memplan.pipeline(target))
        vm = relax.VirtualMachine(executable, dev)
        outputs.append(vm["main"](*(tvm.runtime.tensor(x, dev) for x in inputs)).numpy())
        if config is VULKAN:
            source = glsl_of(executable)
    return outputs[0], outputs[1], source


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + len(shape)).standard_normal(shape).astype("float32")


def elementwise(x, y):
    a = op.add(op.nn.gelu(x), op.multiply(op.tanh(x), op.sigmoid(y)))
    b = op.subtract(op.sqrt(op.abs(y)), op.exp(op.negative(x)))
    return op.divide(op.add(a, b), op.add(op.abs(x), relax.const(1.0)))


def pooling(x):
    pooled = op.nn.avg_pool2d(op.nn.max_pool2d(x, (3, 3), strides=(2, 2), padding=(1, 1)), (2, 2), strides=(2, 2))
    return op.add(pooled, op.mean(pooled, axis=[2, 3], keepdims=True))


def reductions(x, gamma, beta):
    normed = op.nn.layer_norm(x, gamma, beta, axes=[-1])
    return op.add(normed, op.sum(op.multiply(op.nn.softmax(x), normed), axis=[1], keepdims=True))


def gather(table, ids):
    wrapped = op.where(op.less(ids, relax.const(0, "int64")), op.add(ids, relax.const(50, "int64")), ids)
    # integer floor division and modulo: TVM lowers them with Let expressions
    shifted = op.floor_mod(op.add(wrapped, op.floor_divide(ids, relax.const(7, "int64"))), relax.const(50, "int64"))
    return op.take(table, shifted, axis=0)


@needs_vulkan
@pytest.mark.parametrize(
    "build, inputs, glsl",
    [
        (elementwise, lambda: (rand(4, 33), rand(4, 33, seed=1)), ["tvm_erf(", "tanh(", "exp("]),
        # a long reduction over few outputs stays with dlight (cross-thread: shared memory and barriers)
        (
            lambda x, w, b: op.nn.relu(op.add(op.matmul(x, w), b)),
            lambda: (rand(1, 256), rand(256, 24), rand(24)),
            ["shared precise float", "barrier();"],
        ),
        (
            lambda x, w: op.nn.relu(op.nn.conv2d(x, w, padding=(1, 1))),
            lambda: (rand(1, 3, 10, 10), rand(8, 3, 3, 3)),
            [" ? "],
        ),  # padding is an if_then_else
        (
            lambda x, w: op.clip(op.nn.conv2d(x, w, strides=(2, 2), padding=(1, 1), groups=8), 0.0, 6.0),
            lambda: (rand(1, 8, 9, 9), rand(8, 1, 3, 3)),
            ["min(", "max("],
        ),
        (pooling, lambda: (rand(1, 4, 9, 9),), ["max("]),
        # cross-thread reductions: TVM lowers them through shared memory (Vulkan's thread_warp_size is 1)
        (
            reductions,
            lambda: (rand(3, 300), rand(300), rand(300)),
            ["shared precise float", "barrier();", "sqrt(", "exp("],
        ),
    ],
    ids=["elementwise", "dense", "conv2d", "depthwise", "pooling", "softmax_layernorm_sum"],
)
def test_kernels_match_the_llvm_build(build, inputs, glsl):
    vulkan, llvm, source = run_both(build, *inputs())
    np.testing.assert_allclose(vulkan, llvm, rtol=1e-4, atol=1e-5)
    assert all(fragment in source for fragment in glsl), [f for f in glsl if f not in source]


@needs_vulkan
def test_int64_indices_integer_division_and_if_then_else():
    ids = np.array([[0, 3, -1, 49, -50, 7, 12], [1, 1, 2, -3, 30, 0, 49]], dtype="int64")
    vulkan, llvm, source = run_both(gather, rand(50, 16), ids)
    np.testing.assert_array_equal(vulkan, llvm)
    assert "int64_t" in source and " ? " in source


@T.prim_func
def reverse_in_shared(a: T.Buffer((128,), "float32"), b: T.Buffer((128,), "float32")):
    """Each workgroup of 64 threads writes its block reversed: reads wait on the barrier."""
    bx = T.launch_thread("blockIdx.x", 2)
    tile = T.alloc_shared((64,), "float32")
    tx = T.launch_thread("threadIdx.x", 64)
    tile[tx] = a[bx * 64 + tx]
    T.tvm_storage_sync("shared")
    b[bx * 64 + tx] = tile[63 - tx]


@T.prim_func(s_tir=True)
def scaled_prefix(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32"), n: T.int32, alpha: T.float32):
    """Scalar arguments: b = alpha * a on the first n elements, 0 after."""
    for t in T.thread_binding(64, thread="threadIdx.x"):
        with T.sblock("b"):
            vt = T.axis.spatial(64, t)
            b[vt] = T.if_then_else(vt < n, a[vt] * alpha, T.float32(0))


@T.prim_func(s_tir=True)
def vector_axpy(a: T.Buffer((256,), "float32"), b: T.Buffer((256,), "float32"), c: T.Buffer((256,), "float32")):
    """float32x4 loads and stores (a vectorized inner loop)."""
    for t in T.thread_binding(64, thread="threadIdx.x"):
        for v in T.vectorized(4):
            with T.sblock("c"):
                i = T.axis.spatial(256, t * 4 + v)
                c[i] = a[i] * T.float32(2) + b[i]


def run_prim_func(func: tvm.tirx.PrimFunc, *args, **target_attrs) -> tuple[list[np.ndarray], str]:
    """Run ``func`` on Vulkan; returns the arrays after the call and the kernels' GLSL."""
    dev = tvm.vulkan(0)
    built = tvm.compile(func, target=tvm.target.Target({**VULKAN, **target_attrs}))
    tensors = [tvm.runtime.tensor(x, dev) if isinstance(x, np.ndarray) else x for x in args]
    built(*tensors)
    return [t.numpy() for t in tensors if not isinstance(t, (int, float))], glsl_of(built)


@needs_vulkan
def test_shared_memory_and_a_barrier():
    a = np.arange(128, dtype="float32")
    (_, b), glsl = run_prim_func(reverse_in_shared, a, np.zeros(128, "float32"))
    assert "shared precise float" in glsl and "barrier();" in glsl  # floats as written: no fma contraction
    np.testing.assert_array_equal(b, np.concatenate([a[63::-1], a[:63:-1]]))


@needs_vulkan
@pytest.mark.parametrize("n, alpha", [(10, 2.5), (64, -1.0), (0, 3.0)])
def test_scalar_arguments(n, alpha):
    a = rand(64)
    (_, b), glsl = run_prim_func(scaled_prefix, a, np.full(64, np.nan, "float32"), n, alpha)
    assert "layout(push_constant) uniform Args" in glsl
    np.testing.assert_allclose(b, np.where(np.arange(64) < n, a * np.float32(alpha), 0), rtol=1e-6)


@ours
@needs_vulkan
def test_more_scalars_than_push_constants_hold_is_a_one_line_error_naming_the_kernel():
    """TVM's runtime would pass them in a uniform buffer that launches still queued overwrite."""
    with pytest.raises(RuntimeError) as raised:  # a UserError raised under TVM's C++ arrives as RuntimeError
        run_prim_func(scaled_prefix, rand(64), np.zeros(64, "float32"), 5, 4.0, max_push_constants_size=8)
    assert error_line(raised.value).endswith(
        "Vulkan code generator: kernel scaled_prefix_kernel takes 2 scalar arguments (16 bytes), more than the 8 "
        "bytes of push constants (TVM's Vulkan runtime would pass them in a uniform buffer that launches still "
        "queued overwrite)"
    )


def dense_concat(inputs: int) -> LoadedModel:
    """DenseNet's widest kernel in small: ``inputs`` convolutions of one stem, concatenated, then
    BatchNorm and ReLU, which TVM fuses into one kernel of ``inputs + 1`` buffers."""
    g = GraphBuilder("dense_concat", 8)
    stem = g.conv(g.input((1, 3, 8, 8)), 8, 1, base="stem")
    features = [g.conv(stem, 4, 3, 1, 1) for _ in range(inputs)]
    return LoadedModel("dense_concat", g.finish(g.relu(g.batchnorm(g.concat(features)))))


def scheduled(plan) -> tvm.IRModule:
    """The planned module after the kernel passes (what codegen gets, before TVM's finalize passes)."""
    with plan.target:
        return tvm.transform.Sequential(schedule_passes(plan.target, plan.options))(plan.planned)


def test_a_kernel_over_the_push_constants_gets_the_arena_offsets_as_constants():
    plan = plan_model(dense_concat(20), VULKAN, order="program", time_budget=1.0)
    kernels = {
        gvar.name_hint: func for gvar, func in scheduled(plan).functions.items() if isinstance(func, tvm.tirx.PrimFunc)
    }
    assert max(scalar_params(func) for func in kernels.values()) <= 16  # 128 bytes of 8-byte slots
    concat = [func for name, func in kernels.items() if "concatenate" in name]
    assert len(concat) == 1 and len(concat[0].params) == 25  # 20 feature maps, BatchNorm's 4 constants, output
    baked = [int(param.ty.elem_offset.value) * 4 for param in concat[0].params[:20]]
    planned = {t["offset"] for arena in plan.main.arenas for t in arena["tensors"]}
    assert len(set(baked)) == 20 and set(baked) <= planned  # each feature map where the plan put it
    assert all(int(param.ty.elem_offset.value) == 0 for param in concat[0].params[20:])
    convs = [func for name, func in kernels.items() if name.startswith("conv2d")]
    assert convs and all(isinstance(p.ty.elem_offset, tvm.tirx.Var) for f in convs for p in f.params)


@needs_vulkan
def test_a_concat_of_twenty_feature_maps_runs_correctly_and_as_planned():
    plan = plan_model(dense_concat(20), VULKAN, order="program", time_budget=1.0)
    result = verify_plan(plan, stock=False)
    assert result.device == "vulkan:0" and result.ok, result.problems  # onnxruntime's outputs, requests = plan
    assert result.max_abs_diff_vs_onnxruntime is not None and result.trace_matches_plan
    assert result.zero_offset_calls == 0


@needs_vulkan
def test_vector_loads_and_stores():
    a, b = rand(256), rand(256, seed=1)
    (*_, c), glsl = run_prim_func(vector_axpy, a, b, np.zeros(256, "float32"))
    assert "vec4 " in glsl
    np.testing.assert_allclose(c, a * 2 + b, rtol=1e-6)


@T.prim_func(s_tir=True)
def calls_an_unknown_function(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
    for t in T.thread_binding(64, thread="threadIdx.x"):
        with T.sblock("b"):
            vt = T.axis.spatial(64, t)
            b[vt] = T.call_pure_extern("float32", "my_device_helper", a[vt])


@ours
def test_import_tvm_registers_the_generator_through_the_entry_point(tmp_path):
    """pyproject's ``tvm.backends`` entry point, installed as pip would, runs at ``import tvm``."""
    root = Path(__file__).resolve().parents[2]
    entry_points = tomllib.loads((root / "pyproject.toml").read_text())["project"]["entry-points"]["tvm.backends"]
    dist = tmp_path / "tvm_memplan_entry-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tvm_memplan_entry\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        "[tvm.backends]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    )
    probe = "import tvm; print(tvm.get_global_func('target.build.vulkan', allow_missing=True) is not None)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.strip() == "True", result.stderr


@T.prim_func
def lowered_constructs(
    a: T.handle("float32", "global"),
    b: T.handle("int64", "global"),
    c: T.handle("bool", "global"),
    d: T.handle("int8", "global"),
    h: T.handle("float16", "global"),
    n: T.int64,
):
    """A kernel as TVM's GPU lowering leaves it, with constants and types the zoo's kernels may not show."""
    A = T.decl_buffer((16,), data=a)
    B = T.decl_buffer((16,), "int64", data=b)
    C = T.decl_buffer((16,), "bool", data=c)
    D = T.decl_buffer((16,), "int8", data=d)
    H = T.decl_buffer((16,), "float16", data=h)
    tx = T.launch_thread("threadIdx.x", 4)
    A[tx] = T.max(A[tx], T.float32("-inf"))
    A[T.Ramp(tx * 4, 1, 4)] = A[T.Ramp(tx * 4, 1, 4)] * T.Broadcast(T.float32(2), 4)
    B[tx] = T.floordiv(B[tx], T.int64(-3)) + T.int64(-9223372036854775808)
    C[tx] = A[tx] > T.float32(0)
    D[tx] = T.Cast("int8", A[tx])
    H[tx] = T.Cast("float16", T.exp(A[tx]))
    B[tx + 4] = T.if_then_else(tx < 2, B[tx] + n, T.Cast("int64", T.floormod(tx, -3)))


@ours
@needs_glslang
def test_lowered_constructs_print_as_glsl_that_glslang_accepts(tmp_path):
    kernel = kernel_to_glsl("lowered_constructs", lowered_constructs)
    for fragment in (
        "uintBitsToFloat(0xff800000u)",
        "(-9223372036854775807l - 1l)",
        "uint8_t data[]",
        "int8_t(",
        "float16_t(exp(",
        "vec4(",
        "tvm_floordiv(",
        "tvm_floormod(",
        "layout(push_constant) uniform Args { layout(offset = 0) int64_t",
    ):
        assert fragment in kernel.glsl, fragment
    assert kernel.arg_types == ["handle"] * 5 + ["int64"] and kernel.launch_param_tags == []
    assert len(compile_glsl(kernel, tmp_path)) > 0


def test_an_unsupported_construct_is_a_one_line_user_error():
    kernel = tvm.tirx.PrimFunc([], tvm.tirx.Evaluate(T.call_extern("float32", "my_device_helper")))
    with pytest.raises(UserError) as raised:
        kernel_to_glsl("k", kernel)
    assert str(raised.value) == (
        "Vulkan code generator: kernel k uses call to my_device_helper as a statement, which has no GLSL form here"
    )


@ours
@needs_vulkan
def test_compiling_an_unsupported_construct_names_it_and_the_kernel():
    with pytest.raises(RuntimeError) as raised:  # a UserError raised under TVM's C++ arrives as RuntimeError
        tvm.compile(calls_an_unknown_function, target=tvm.target.Target(VULKAN))
    line = error_line(raised.value)
    assert "kernel calls_an_unknown_function_kernel uses call to my_device_helper" in line


@ours
@pytest.mark.parametrize(
    "attribute, value, hint",
    [
        ("RUNTIME_FACTORY", "ffi.Module.create.no_such_runtime", "tvm-memplan setup-gpu"),
        # glslangValidator is looked for after the runtime: without the runtime the message is the one above
        pytest.param(
            "GLSLANG",
            "no-such-glslangValidator",
            "apt-get install glslang-tools",
            marks=pytest.mark.skipif(
                not runtime_loaded("vulkan"), reason="no Vulkan runtime: run tvm-memplan setup-gpu"
            ),
        ),
    ],
)
def test_build_says_in_one_line_what_to_install(capsys, monkeypatch, tmp_path, attribute, value, hint):
    monkeypatch.setattr(vulkan_codegen, attribute, value)
    code = main(["build", "zoo:mlp?hidden=16", "--target", "vulkan", "-o", str(tmp_path / "v.so")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and hint in err
    assert not (tmp_path / "v.so").exists()


@needs_vulkan
def test_build_then_measure_matches_onnxruntime_and_the_plan(capsys, tmp_path):
    artifact = tmp_path / "cnn.so"
    assert main(["build", "zoo:mcu_cnn?resolution=16", "--target", "vulkan", "-o", str(artifact), "--json"]) == 0
    built = json.loads(capsys.readouterr().out)
    code = main(["measure", str(artifact), "--compare", "--json", *FAST, "--log", str(tmp_path / "log.jsonl")])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    for result in report.values():
        assert result["target"] == "vulkan" and result["reference"] == "onnxruntime"
        assert result["correct"], result["max_abs_diff"]
        assert result["requested_bytes"] == result["planned_bytes"]  # the VM asks for the plan
    assert report["memplan"]["planned_bytes"] == built["planned_bytes"]
    assert report["memplan"]["requested_bytes"] < report["stock"]["requested_bytes"]


@needs_vulkan
def test_measure_compare_through_a_loopback_tracker(capsys, tmp_path):
    """The exported library carries the SPIR-V in TVM's own format: the server's runtime loads it."""
    with start_farm({"gpu": 1}, lifetime=120) as farm:
        code = main(
            [
                "measure",
                "zoo:mlp?hidden=16",
                "--target",
                "vulkan",
                "--compare",
                *over_rpc(farm.tracker, "gpu", tmp_path / "log.jsonl"),
                "--json",
                *FAST,
            ]
        )
    out, err = capsys.readouterr()
    assert code == 0, err
    for result in json.loads(out).values():
        assert result["device"].startswith("rpc:gpu@") and result["correct"]
        assert result["requested_bytes"] == result["planned_bytes"]
