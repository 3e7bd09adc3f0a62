"""Build TVM's OpenCL and Vulkan runtimes for the installed wheel, and find their devices.

The apache-tvm wheel is built with both runtimes off. Their sources compile against the wheel's own
headers (``tvm/include``, ``tvm/src/runtime``) and link against its ``libtvm_runtime`` and
``libtvm_ffi``; the few files the wheel does not ship come from a TVM v0.27 source tree (a checkout,
or a source kit holding just those files). The wheel's files are laid over the tree so the build matches
the wheel. The runtimes are installed in the user's data directory, not in TVM's package, and loaded
from there by :mod:`.runtimes`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import tvm
import tvm_ffi

from ..errors import UserError
from . import runtimes

SOURCE_ENV = "TVM_MEMPLAN_TVM_SRC"
"""Environment variable naming the source tree when ``--tvm-src`` is not given."""
HOW_TO_GET_SOURCE = (
    f"git clone --depth 1 --branch v0.27.0 https://github.com/apache/tvm, then pass --tvm-src DIR or set {SOURCE_ENV}"
)
CXXFLAGS = ["-O2", "-fPIC", "-std=c++20", "-fvisibility=hidden", "-D_GLIBCXX_USE_CXX11_ABI=1"]
CXX = "g++"


@dataclass(frozen=True)
class Sidecar:
    """One TVM runtime that the wheel lacks, and what building and running it needs from Debian."""

    name: str
    title: str
    header: str
    """A system header the sources include; missing means the development package is missing."""
    header_package: str
    library: str
    """The system library linked against (its unversioned .so comes with the development package)."""
    library_package: str
    driver_package: str
    """A Debian driver that gives this machine a device of this kind without a GPU."""
    driver_what: str

    @property
    def file_name(self) -> str:
        return f"libtvm_runtime_{self.name}.so"

    @property
    def link_flag(self) -> str:
        return "-l" + self.library.removeprefix("lib").removesuffix(".so")


SIDECARS: dict[str, Sidecar] = {
    s.name: s
    for s in (
        Sidecar(
            "opencl",
            "OpenCL",
            "CL/cl.h",
            "opencl-headers",
            "libOpenCL.so",
            "ocl-icd-opencl-dev",
            "pocl-opencl-icd",
            "PoCL, OpenCL on the CPU",
        ),
        Sidecar(
            "vulkan",
            "Vulkan",
            "vulkan/vulkan.h",
            "libvulkan-dev",
            "libvulkan.so",
            "libvulkan-dev",
            "mesa-vulkan-drivers",
            "lavapipe, Vulkan on the CPU",
        ),
    )
}


@dataclass
class SidecarReport:
    """What ``setup-gpu`` did for one runtime and which devices TVM then sees."""

    backend: str
    path: str
    built: bool
    """False when the installed file was already newer than every source it is built from."""
    build_seconds: float | None
    runtime_loaded: bool = False
    """Whether ``import tvm`` loaded the sidecar (TVM ignores a sidecar that fails to load)."""
    devices: list[dict[str, object]] = field(default_factory=list)
    problem: str | None = None
    loaded_from: str | None = None
    """The file TVM's runtime came from: ``path``, or another copy that shadows it (an older setup-gpu's
    in TVM's package, or a TVM built with the runtime)."""


def wheel_dirs() -> tuple[Path, Path]:
    """The installed ``tvm`` and ``tvm_ffi`` package directories."""
    return Path(tvm.__file__).resolve().parent, Path(tvm_ffi.__file__).resolve().parent


def find_source(tvm_src: str | Path | None) -> Path:
    """The TVM source tree: ``tvm_src``, else ``$TVM_MEMPLAN_TVM_SRC``; a one-line UserError without one."""
    given = tvm_src or os.environ.get(SOURCE_ENV)
    if not given:
        raise UserError(f"setup-gpu compiles TVM's runtimes from TVM v0.27's source: {HOW_TO_GET_SOURCE}")
    source = Path(given).expanduser()
    if not source.is_dir():
        raise UserError(f"no TVM source tree at {source}: {HOW_TO_GET_SOURCE}")
    for sidecar in SIDECARS.values():
        if not any(runtime_dir(source, sidecar).glob("*.cc")):
            raise UserError(f"{source} is not a TVM v0.27 source tree: no src/backend/{sidecar.name}/runtime/*.cc")
    return source.resolve()


def runtime_dir(source: Path, sidecar: Sidecar) -> Path:
    return source / "src" / "backend" / sidecar.name / "runtime"


def installed_path(sidecar: Sidecar) -> Path:
    """Where the runtime goes: the user's data directory, one folder per TVM version."""
    return runtimes.runtime_file(sidecar.name)


def _inputs(source: Path, sidecar: Sidecar) -> list[Path]:
    """Every file the build reads: the sources, the wheel's headers and the libraries linked against."""
    tvm_dir, ffi_dir = wheel_dirs()
    trees = [
        runtime_dir(source, sidecar),
        source / "src" / "support",
        source / "include" / "tvm" / "support",
        tvm_dir / "include",
        tvm_dir / "src" / "runtime",
        ffi_dir / "include",
    ]
    files = [p for tree in trees if tree.is_dir() for p in tree.rglob("*") if p.is_file()]
    return files + [tvm_dir / "lib" / "libtvm_runtime.so", *ffi_dir.glob("lib/libtvm_ffi.so")]


def is_current(source: Path, sidecar: Sidecar) -> bool:
    """True when the installed sidecar is newer than everything it is built from."""
    target = installed_path(sidecar)
    if not target.exists():
        return False
    newest = max(p.stat().st_mtime for p in _inputs(source, sidecar))
    return target.stat().st_mtime > newest


def check_toolchain(sidecar: Sidecar) -> None:
    """Raise a one-line UserError naming the Debian package that the build is missing."""
    if shutil.which(CXX) is None:
        raise UserError(f"building the {sidecar.title} runtime needs {CXX} (Debian: apt-get install g++)")
    probe = subprocess.run(
        [CXX, "-E", "-x", "c++", "-", "-o", os.devnull],
        input=f"#include <{sidecar.header}>\n",
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        raise UserError(
            f"building the {sidecar.title} runtime needs <{sidecar.header}> "
            f"(Debian: apt-get install {sidecar.header_package})"
        )
    found = subprocess.run([CXX, f"-print-file-name={sidecar.library}"], capture_output=True, text=True).stdout.strip()
    if "/" not in found:  # g++ echoes the bare name when no library directory holds it
        raise UserError(
            f"building the {sidecar.title} runtime needs {sidecar.library} "
            f"(Debian: apt-get install {sidecar.library_package})"
        )


def _build_tree(source: Path, sidecar: Sidecar, tree: Path) -> None:
    """The source files the build needs, with the wheel's headers and runtime sources laid over them."""
    tvm_dir, _ = wheel_dirs()
    for part in ("include", "src/support", "src/runtime", f"src/backend/{sidecar.name}/runtime"):
        if (source / part).is_dir():
            shutil.copytree(source / part, tree / part, dirs_exist_ok=True)
    shutil.copytree(tvm_dir / "include", tree / "include", dirs_exist_ok=True)
    shutil.copytree(tvm_dir / "src" / "runtime", tree / "src" / "runtime", dirs_exist_ok=True)
    for path in tree.rglob("*"):  # a read-only source kit stays read-only in the copy
        path.chmod(path.stat().st_mode | 0o200)


def _compile(command: list[str]) -> str | None:
    """Run one compiler command; the first error line on failure, None on success."""
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode == 0:
        return None
    lines = result.stderr.splitlines()
    return next((line for line in lines if "error" in line), lines[-1] if lines else f"exit {result.returncode}")


def build_sidecar(
    source: Path, sidecar: Sidecar, jobs: int, progress: Callable[[int, int], None] | None = None
) -> Path:
    """Compile the runtime and install it atomically (linked to a temporary name, then renamed);
    ``progress(steps done, steps)`` after each source file and the link."""
    check_toolchain(sidecar)
    tvm_dir, ffi_dir = wheel_dirs()
    target = installed_path(sidecar)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {target.parent}: {exc.strerror}") from None
    with tempfile.TemporaryDirectory(prefix=f"tvm-memplan-{sidecar.name}-") as scratch:
        tree = Path(scratch) / "tree"
        _build_tree(source, sidecar, tree)
        # -ffile-prefix-map: TVM's log lines name source files, as in TVM's own build, not the scratch tree
        flags = [
            *CXXFLAGS,
            f"-ffile-prefix-map={tree}/=",
            f"-I{tree / 'include'}",
            f"-I{tree / 'src'}",
            f"-I{ffi_dir / 'include'}",
        ]
        sources = sorted(runtime_dir(tree, sidecar).glob("*.cc"))
        objects = [Path(scratch) / f"{cc.stem}.o" for cc in sources]
        commands = [[CXX, *flags, "-c", str(cc), "-o", str(obj)] for cc, obj in zip(sources, objects, strict=True)]
        step = progress or (lambda done, total: None)
        step(0, len(sources) + 1)
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for done, (cc, error) in enumerate(zip(sources, pool.map(_compile, commands), strict=True), 1):
                if error is not None:
                    raise UserError(f"compiling {cc.name} for the {sidecar.title} runtime failed: {error}")
                step(done, len(sources) + 1)
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        link = [
            CXX,
            "-shared",
            "-o",
            str(partial),
            *map(str, objects),
            f"-L{tvm_dir / 'lib'}",
            f"-L{ffi_dir / 'lib'}",
            "-ltvm_runtime",
            "-ltvm_ffi",
            sidecar.link_flag,
            f"-Wl,-rpath,{tvm_dir / 'lib'}",
            f"-Wl,-rpath,{ffi_dir / 'lib'}",
        ]
        try:
            error = _compile(link)
            if error is not None:
                raise UserError(f"linking the {sidecar.title} runtime failed: {error}")
            partial.replace(target)
            step(len(sources) + 1, len(sources) + 1)
        except PermissionError as exc:
            raise UserError(f"cannot install into {target.parent}: {exc.strerror}") from None
        finally:
            partial.unlink(missing_ok=True)
    return target


# Run in a fresh interpreter: this process imported tvm before the sidecars existed, and a fresh
# ``import tvm`` (whose entry point loads the runtimes) is exactly what users get.
_PROBE = r"""
import ctypes, json, sys
import tvm
from tvm_memplan.backends import runtimes
runtimes.load_installed()
report = {}
for name, path in zip(sys.argv[1::2], sys.argv[2::2]):
    loaded = tvm.get_global_func(f"device_api.{name}", allow_missing=True) is not None
    library = tvm.base._LOADED_LIBS.get(f"tvm_runtime_{name}")
    info = {"runtime_loaded": loaded, "devices": [], "loaded_from": getattr(library, "_name", None)}
    if not loaded:
        try:
            ctypes.CDLL(path)
        except OSError as exc:
            info["load_error"] = str(exc)
    else:
        for index in range(16):
            dev = tvm.device(name, index)
            try:
                if not dev.exist:
                    break
            except RuntimeError as exc:  # Vulkan without any driver fails to create its instance
                info["device_error"] = str(exc).strip().splitlines()[-1]
                break
            info["devices"].append({"index": index, "name": dev.device_name,
                                    "max_threads_per_block": dev.max_threads_per_block})
    report[name] = info
print(json.dumps(report))
"""


def probe_devices(names: list[str]) -> dict[str, dict]:
    """For each backend: whether a fresh ``import tvm`` loads its sidecar, and the devices TVM finds."""
    args = [arg for name in names for arg in (name, str(installed_path(SIDECARS[name])))]
    result = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        raise UserError(
            f"probing GPU devices crashed a fresh 'import tvm': {lines[-1] if lines else result.returncode}"
        )
    return json.loads(result.stdout.strip().splitlines()[-1])


def setup_gpu(
    backends: list[str] | None = None,
    tvm_src: str | Path | None = None,
    jobs: int | None = None,
    force: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[SidecarReport]:
    """Build (when out of date) and install each backend's sidecar, then report the devices found;
    ``progress(backend, steps done, steps)`` follows each build."""
    names = backends or list(SIDECARS)
    source = find_source(tvm_src)
    reports = []
    for name in names:
        sidecar = SIDECARS[name]
        if not force and is_current(source, sidecar):
            reports.append(SidecarReport(name, str(installed_path(sidecar)), False, None))
            continue
        start = time.perf_counter()
        step = (lambda done, total, name=name: progress(name, done, total)) if progress is not None else None
        path = build_sidecar(source, sidecar, jobs or os.cpu_count() or 1, step)
        reports.append(SidecarReport(name, str(path), True, round(time.perf_counter() - start, 1)))
    found = probe_devices(names)
    for report in reports:
        sidecar, info = SIDECARS[report.backend], found[report.backend]
        report.runtime_loaded, report.devices = info["runtime_loaded"], info["devices"]
        report.loaded_from = info.get("loaded_from")
        if not report.runtime_loaded:
            report.problem = f"import tvm did not load {report.path}: {info.get('load_error', 'unknown reason')}"
        elif not report.devices:
            why = f" ({info['device_error']})" if "device_error" in info else ""
            report.problem = (
                f"no {sidecar.title} device{why}: apt-get install {sidecar.driver_package} "
                f"({sidecar.driver_what}) or a GPU's driver"
            )
    return reports


def runtime_loaded(device: str) -> bool:
    """Whether this process's TVM has a runtime for ``device`` (built in, or a loaded sidecar)."""
    runtimes.load_installed()
    return runtimes.has_runtime(device)


def device_exists(device: str) -> bool:
    """Whether ``device`` 0 is there; False, not an error, when its runtime finds no driver at all."""
    runtimes.load_installed()
    try:
        return bool(tvm.device(device, 0).exist)
    except RuntimeError:
        return False
