"""``setup-gpu``'s pieces: missing Debian packages are one line, builds are skipped when up to date."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest

from tvm_memplan.backends import sidecars
from tvm_memplan.backends.sidecars import SIDECARS, check_toolchain, find_source, is_current
from tvm_memplan.cli.main import main
from tvm_memplan.errors import UserError

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


installed = pytest.mark.skipif(not all(sidecars.installed_path(s).exists() for s in SIDECARS.values()),
                               reason="sidecars not installed: CI runs tvm-memplan setup-gpu before pytest")


def _need_source() -> None:
    try:
        find_source(None)
    except UserError as exc:
        pytest.skip(str(exc))


@installed
def test_setup_gpu_again_rebuilds_nothing_and_lists_devices(capsys):
    _need_source()
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
@pytest.mark.parametrize("backend, variable, value, package", [
    ("opencl", "OCL_ICD_VENDORS", "", "pocl-opencl-icd"),  # an empty vendor directory: no platform
    ("vulkan", "VK_ICD_FILENAMES", "none.json", "mesa-vulkan-drivers"),  # no driver manifest
])
def test_no_driver_is_one_line_naming_the_debian_driver(capsys, tmp_path, monkeypatch, backend, variable, value, package):
    _need_source()
    monkeypatch.setenv(variable, str(tmp_path / value))  # the device probe's fresh interpreter inherits it
    assert main(["setup-gpu", "--backend", backend]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"apt-get install {package}" in err
