"""pyproject.toml declares every third-party module the package imports, and nothing only the tests use."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions

import pytest

from .shared_inputs import REPO

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
XGBOOST = {"xgboost", "xgboost-cpu"}  # one module, two wheels (the CPU build on Linux)


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s\[<>=!;~]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def _imported_modules() -> set[str]:
    modules = set()
    for path in (REPO / "tvm_memplan").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - {"tvm_memplan"}


def test_every_imported_module_is_a_declared_dependency():
    declared = _names(PYPROJECT["project"]["dependencies"])
    distributions = packages_distributions()
    for module in sorted(_imported_modules()):
        providers = {d.lower().replace("_", "-") for d in distributions.get(module, [])}
        assert providers, f"{module} is imported by tvm_memplan but not installed"
        declared_here = providers & declared or (providers & XGBOOST and XGBOOST & declared)
        assert declared_here, f"{module} (from {', '.join(sorted(providers))}) is not declared"


def test_what_only_the_tests_use_is_in_the_test_extra():
    assert "ortools" not in _imported_modules()
    assert "ortools" not in _names(PYPROJECT["project"]["dependencies"])
    assert "ortools" in _names(PYPROJECT["project"]["optional-dependencies"]["test"])


def test_licence_and_typing_markers_ship():
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert "Apache License" in (REPO / "LICENSE").read_text()
    assert (REPO / "tvm_memplan" / "py.typed").exists()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["tvm_memplan"]
