"""``setup-gpu``'s pieces: missing Debian packages are one line, builds are skipped when up to date, the
runtimes live in the user's data directory and load from there."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tvm

from tvm_memplan.backends import runtimes, sidecars
from tvm_memplan.backends.sidecars import SIDECARS, check_toolchain, is_current
from tvm_memplan.cli.main import main
from tvm_memplan.errors import UserError

from ..shared_inputs import REPO, tvm_source

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ missing (Debian: g++)")


@needs_gxx
def test_a_missing_header_names_its_debian_package():
    sidecar = dataclasses.replace(SIDECARS["opencl"], header="CL/no_such_header.h")
    with pytest.raises(UserError, match="apt-get install opencl-headers"):
        check_toolchain(sidecar)


@needs_gxx
def test_a_missing_library_names_its_debian_package():
    sidecar = dataclasses.replace(SIDECARS["vulkan"], header="stddef.h", library="libno_such_library.so")
    with pytest.raises(UserError, match="apt-get install libvulkan-dev"):
        check_toolchain(sidecar)


def test_a_tree_without_runtime_sources_is_one_line(capsys, tmp_path):
    assert main(["setup-gpu", "--tvm-src", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no src/backend/opencl/runtime/*.cc" in err


def test_without_a_source_tree_setup_gpu_says_how_to_get_one(capsys, monkeypatch):
    monkeypatch.delenv(sidecars.SOURCE_ENV, raising=False)
    assert main(["setup-gpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "git clone --depth 1 --branch v0.27.0 https://github.com/apache/tvm" in err and "--tvm-src" in err


def test_the_source_tree_comes_from_the_environment(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(sidecars.SOURCE_ENV, str(tmp_path))
    assert main(["setup-gpu"]) == 2
    assert f"{tmp_path} is not a TVM v0.27 source tree" in capsys.readouterr().err


def test_runtimes_go_to_the_user_data_directory_not_into_tvm(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    path = sidecars.installed_path(SIDECARS["opencl"])
    assert path == tmp_path / "tvm_memplan" / f"tvm-{tvm.__version__}" / "lib" / "libtvm_runtime_opencl.so"
    assert not path.is_relative_to(sidecars.wheel_dirs()[0])  # reinstalling apache-tvm leaves it alone


def test_a_build_reports_each_step_and_installs_into_the_data_directory(tmp_path, monkeypatch):
    """The compiler is replaced by one that writes empty outputs: the steps and the install, not g++."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    source = tmp_path / "tvm"
    for name in ("opencl_device_api.cc", "opencl_module.cc"):
        (source / "src" / "backend" / "opencl" / "runtime" / name).parent.mkdir(parents=True, exist_ok=True)
        (source / "src" / "backend" / "opencl" / "runtime" / name).write_text("")
    monkeypatch.setattr(sidecars, "check_toolchain", lambda sidecar: None)
    monkeypatch.setattr(sidecars, "_compile", lambda command: Path(command[command.index("-o") + 1]).touch())
    steps = []
    installed = sidecars.build_sidecar(source, SIDECARS["opencl"], 1, lambda *step: steps.append(step))
    assert steps == [(0, 3), (1, 3), (2, 3), (3, 3)]
    lib = tmp_path / "data" / "tvm_memplan" / f"tvm-{tvm.__version__}" / "lib"
    assert installed == lib / "libtvm_runtime_opencl.so"
    assert installed.is_file() and not list(installed.parent.glob(".*.partial"))


def test_a_runtime_that_does_not_load_is_skipped_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setattr(runtimes, "BACKENDS", ("no_such_backend",))
    broken = runtimes.runtime_file("no_such_backend")
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"not an ELF file")
    runtimes.load_installed()
    assert "no_such_backend" in runtimes.LOAD_ERRORS
    runtimes.LOAD_ERRORS.pop("no_such_backend")


def test_up_to_date_only_when_newer_than_every_source(tmp_path, monkeypatch):
    source = tmp_path / "tvm"
    cc = source / "src" / "backend" / "opencl" / "runtime" / "opencl_module.cc"
    cc.parent.mkdir(parents=True)
    cc.write_text("")
    installed = tmp_path / "lib" / "libtvm_runtime_opencl.so"
    monkeypatch.setattr(sidecars, "installed_path", lambda _: installed)
    assert not is_current(source, SIDECARS["opencl"])  # nothing installed yet
    installed.parent.mkdir()
    installed.write_bytes(b"")
    later = cc.stat().st_mtime + 10
    os.utime(installed, (later, later))
    assert is_current(source, SIDECARS["opencl"])
    os.utime(cc, (later + 10, later + 10))
    assert not is_current(source, SIDECARS["opencl"])


installed = pytest.mark.skipif(
    not all(sidecars.installed_path(s).exists() for s in SIDECARS.values()),
    reason="sidecars not installed: CI runs tvm-memplan setup-gpu before pytest",
)


@pytest.fixture
def source_env(monkeypatch):
    """setup-gpu's source tree from the environment, as a user who exported it."""
    source = tvm_source()
    if not source.is_dir():
        pytest.skip(f"no TVM source tree at {source}: set {sidecars.SOURCE_ENV}")
    monkeypatch.setenv(sidecars.SOURCE_ENV, str(source))


@installed
def test_setup_gpu_again_rebuilds_nothing_and_lists_devices(capsys, source_env):
    before = {name: sidecars.installed_path(s).stat().st_mtime_ns for name, s in SIDECARS.items()}
    code = main(["setup-gpu", "--json"])
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert set(report) == set(SIDECARS)
    for name, entry in report.items():
        assert entry["built"] is False and entry["runtime_loaded"]
        assert sidecars.installed_path(SIDECARS[name]).stat().st_mtime_ns == before[name]
        # a device or a one-line reason naming the driver package
        assert entry["devices"] or "apt-get install" in entry["problem"]
    assert code == (2 if any(e["problem"] for e in report.values()) else 0), err
    assert not list(sidecars.installed_path(SIDECARS["opencl"]).parent.glob(".*.partial"))


@installed
@pytest.mark.parametrize(
    "backend, variable, value, package",
    [
        ("opencl", "OCL_ICD_VENDORS", "", "pocl-opencl-icd"),  # an empty vendor directory: no platform
        ("vulkan", "VK_ICD_FILENAMES", "none.json", "mesa-vulkan-drivers"),  # no driver manifest
    ],
)
def test_no_driver_is_one_line_naming_the_debian_driver(
    capsys, tmp_path, monkeypatch, backend, variable, value, package, source_env
):
    monkeypatch.setenv(variable, str(tmp_path / value))  # the device probe's fresh interpreter inherits it
    assert main(["setup-gpu", "--backend", backend]) == 2
    # (a machine with an older setup-gpu's copy in TVM's package also gets a note naming it)
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("tvm-memplan: note:")]
    assert len(errors) == 1 and f"apt-get install {package}" in errors[0]


ENTRY_POINT = (
    "from importlib.metadata import EntryPoint; import tomllib; "
    "project = tomllib.load(open('pyproject.toml', 'rb'))['project']; "
    "value = project['entry-points']['tvm.backends']['tvm_memplan']; "
    "EntryPoint('tvm_memplan', value, 'tvm.backends').load()()"
)


@installed
@pytest.mark.parametrize(
    "loads",
    [
        "import tvm, tvm_memplan",  # tvm first: import tvm_memplan loads them
        f"import tvm_memplan, tvm; {ENTRY_POINT}",  # tvm_memplan first: the entry point import tvm calls loads them
    ],
)
def test_a_fresh_import_loads_the_runtimes_from_the_data_directory(loads):
    """With TVM's own loading switched off, so that no copy in TVM's package can stand in for them."""
    if sys.version_info < (3, 11):
        pytest.skip("reads pyproject.toml with tomllib")
    probe = (
        f"{loads}; import tvm.base; "
        "print(';'.join(tvm.base._LOADED_LIBS[f'tvm_runtime_{b}']._name for b in ('opencl', 'vulkan')))"
    )
    env = {**os.environ, "TVM_DEVICE_BACKEND_AUTOLOAD": "0", "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr
    loaded = result.stdout.strip().splitlines()[-1].split(";")
    assert loaded == [str(sidecars.installed_path(SIDECARS[b])) for b in ("opencl", "vulkan")]
