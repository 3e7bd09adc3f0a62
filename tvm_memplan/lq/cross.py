"""aarch64 cross-building: a single kernel run under qemu-aarch64 with a tiny C driver.

The LLVM object of one PrimFunc needs no TVM runtime: the driver
provides the error hook, the workspace pair and a serial ``TVMBackendParallelLaunch`` (also
through the ``__TVMBackend*`` pointers a TVM library calls them by), builds
DLTensors for the arguments, calls ``__tvm_ffi_<name>`` and writes every argument back, so
Python can compare the results with the numpy reference. Emulated timings mean nothing;
correctness is real.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tvm
from tvm import tirx

CROSS_GCC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
_DTYPES = {np.dtype("float32"): (2, 32), np.dtype("uint32"): (1, 32), np.dtype("int32"): (0, 32)}


def arm64_target() -> tvm.target.Target:
    return tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]})


def have_arm64_toolchain() -> bool:
    """Whether the cross compiler and qemu-aarch64 are installed."""
    return shutil.which(CROSS_GCC) is not None and shutil.which(QEMU) is not None


def _include_dirs() -> list[Path]:
    import tvm_ffi

    root = Path(tvm_ffi.__file__).parent / "include"
    return [root]


_DRIVER = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlpack/dlpack.h>
#include <tvm/ffi/c_api.h>

void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  fprintf(stderr, "kernel error: %s:", kind);
  for (int32_t i = 0; i < n; ++i) fprintf(stderr, " %s", parts[i]);
  fprintf(stderr, "\n");
}
void* TVMBackendAllocWorkspace(int t, int id, uint64_t n, int c, int b) {
  return aligned_alloc(64, (n + 63) / 64 * 64);
}
int TVMBackendFreeWorkspace(int t, int id, void* p) { free(p); return 0; }
typedef struct { void* sync_handle; int32_t num_task; } TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int, TVMParallelGroupEnv*, void*);
/* Runs the tasks one after another; three of them so the uneven split is exercised too. */
int TVMBackendParallelLaunch(FTVMParallelLambda f, void* cdata, int num_task) {
  TVMParallelGroupEnv env = {0, 3};
  for (int task = 0; task < env.num_task; ++task) {
    int rc = f(task, &env, cdata);
    if (rc != 0) return rc;
  }
  return 0;
}
int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv* penv) { return 0; }
/* A library built by TVM calls the backend through these pointers, which the runtime fills in
   when it loads the library; the object only has weak empty definitions. */
int (*__TVMBackendParallelLaunch)(FTVMParallelLambda, void*, int) = TVMBackendParallelLaunch;
int (*__TVMBackendParallelBarrier)(int, TVMParallelGroupEnv*) = TVMBackendParallelBarrier;
void* (*__TVMBackendAllocWorkspace)(int, int, uint64_t, int, int) = TVMBackendAllocWorkspace;
int (*__TVMBackendFreeWorkspace)(int, int, void*) = TVMBackendFreeWorkspace;

int __tvm_ffi_@NAME@(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* result);

static void* load(const char* dir, int i, size_t nbytes) {
  char path[4096];
  snprintf(path, sizeof path, "%s/arg%d.bin", dir, i);
  void* data = aligned_alloc(64, (nbytes + 63) / 64 * 64);
  FILE* f = fopen(path, "rb");
  if (!f || fread(data, 1, nbytes, f) != nbytes) { fprintf(stderr, "cannot read %s\n", path); exit(3); }
  fclose(f);
  return data;
}

static void store(const char* dir, int i, const void* data, size_t nbytes) {
  char path[4096];
  snprintf(path, sizeof path, "%s/out%d.bin", dir, i);
  FILE* f = fopen(path, "wb");
  if (!f || fwrite(data, 1, nbytes, f) != nbytes) { fprintf(stderr, "cannot write %s\n", path); exit(4); }
  fclose(f);
}

int main(int argc, char** argv) {
  const char* dir = argc > 1 ? argv[1] : ".";
  enum { NARGS = @NARGS@ };
  static int64_t shapes[NARGS][8] = {@SHAPES@};
  static const int ndims[NARGS] = {@NDIMS@};
  static const uint8_t codes[NARGS] = {@CODES@};
  static const size_t nbytes[NARGS] = {@NBYTES@};
  DLTensor tensors[NARGS];
  TVMFFIAny args[NARGS];
  for (int i = 0; i < NARGS; ++i) {
    memset(&tensors[i], 0, sizeof(DLTensor));
    tensors[i].data = load(dir, i, nbytes[i]);
    tensors[i].device.device_type = kDLCPU;
    tensors[i].ndim = ndims[i];
    tensors[i].dtype.code = codes[i];
    tensors[i].dtype.bits = 32;
    tensors[i].dtype.lanes = 1;
    tensors[i].shape = shapes[i];
    memset(&args[i], 0, sizeof(TVMFFIAny));
    args[i].type_index = kTVMFFIDLTensorPtr;
    args[i].v_ptr = &tensors[i];
  }
  TVMFFIAny result;
  memset(&result, 0, sizeof result);
  result.type_index = kTVMFFINone;
  int rc = __tvm_ffi_@NAME@(NULL, args, NARGS, &result);
  if (rc != 0) { fprintf(stderr, "kernel returned %d\n", rc); return 5; }
  for (int i = 0; i < NARGS; ++i) store(dir, i, tensors[i].data, nbytes[i]);
  return 0;
}
"""


def driver_source(name: str, arrays: Sequence[np.ndarray]) -> str:
    """C source of a driver calling ``__tvm_ffi_<name>`` on tensors shaped like ``arrays``."""
    shapes, codes = [], []
    for array in arrays:
        if array.dtype not in _DTYPES or array.ndim > 8:
            raise ValueError(f"unsupported argument {array.dtype} with {array.ndim} dims")
        shapes.append("{" + ", ".join(str(d) for d in array.shape) + "}")
        codes.append(str(_DTYPES[array.dtype][0]))
    fill = {
        "@NAME@": name,
        "@NARGS@": str(len(arrays)),
        "@SHAPES@": ", ".join(shapes),
        "@NDIMS@": ", ".join(str(a.ndim) for a in arrays),
        "@CODES@": ", ".join(codes),
        "@NBYTES@": ", ".join(str(a.nbytes) for a in arrays),
    }
    source = _DRIVER
    for key, value in fill.items():
        source = source.replace(key, value)
    return source


def run_under_qemu(
    func: tirx.PrimFunc, arrays: Sequence[np.ndarray], work_dir: Path, name: str = "kernel"
) -> list[np.ndarray]:
    """Cross-build ``func`` for aarch64 (LLVM, NEON), call it under qemu on ``arrays``.

    Returns every argument after the call (outputs filled in, inputs unchanged).
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    lib = tvm.tirx.build(tvm.IRModule({name: func.with_attr("global_symbol", name)}), target=arm64_target())
    obj = work_dir / f"{name}.o"
    lib.write_to_file(str(obj))
    arrays = [np.ascontiguousarray(a) for a in arrays]
    source = work_dir / f"{name}_driver.c"
    source.write_text(driver_source(name, arrays))
    exe = work_dir / f"{name}_driver"
    includes = [f"-I{d}" for d in _include_dirs()]
    subprocess.run(
        [CROSS_GCC, "-O1", "-static", *includes, str(source), str(obj), "-lm", "-o", str(exe)],
        check=True,
        capture_output=True,
        text=True,
    )
    for i, array in enumerate(arrays):
        array.tofile(work_dir / f"arg{i}.bin")
    subprocess.run([QEMU, str(exe), str(work_dir)], check=True, capture_output=True, text=True, timeout=120)
    return [np.fromfile(work_dir / f"out{i}.bin", dtype=a.dtype).reshape(a.shape) for i, a in enumerate(arrays)]
