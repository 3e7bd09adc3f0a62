"""The package's modules import each other without a cycle.

The graph is built from the sources with ast: an edge for each import that runs when a module is imported
(module level, class bodies, ``try`` and ``if`` blocks, but not function bodies or ``if TYPE_CHECKING``).
Importing ``a.b.c`` runs ``a/__init__``, ``a/b/__init__`` and ``a/b/c``, so the edge goes to each of them
(a package ``__init__`` that re-exports its submodules passes the import on); ``from . import x`` is an edge
to the submodule ``x``. A module's own packages are left out: they are already being imported.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from .shared_inputs import REPO


def _runs_on_import(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            test = node.test
            if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
            ):
                yield from _runs_on_import(node.orelse)
            else:
                yield from _runs_on_import(node.body)
                yield from _runs_on_import(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _runs_on_import(block)
        elif isinstance(node, ast.With | ast.ClassDef | ast.For | ast.While):
            yield from _runs_on_import(node.body)


def _prefixes(dotted: str) -> list[str]:
    parts = dotted.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Each module of the package under ``package_dir`` -> the package's modules importing it runs."""
    sources = {}
    for path in package_dir.rglob("*.py"):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        sources[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    graph = {}
    for name, (path, is_package) in sources.items():
        package = name if is_package else name.rpartition(".")[0]
        own = set(_prefixes(package))
        targets = set()
        for node in _runs_on_import(ast.parse(path.read_text()).body):
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = ".".join(package.split(".")[: package.count(".") + 2 - node.level] + [node.module or ""])
                    base = base.rstrip(".")
                else:
                    base = node.module
                imported = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            targets |= {m for dotted in imported for m in _prefixes(dotted) if m in sources and m not in own}
        graph[name] = targets - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` (each module imported by the one after it), else None."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return error.args[1]
    return None


def test_package_imports_have_no_cycle():
    graph = import_graph(REPO / "tvm_memplan")
    # the edges of the cycle a re-exporting tvm_memplan/relax/__init__ made: the pipeline lowers QDQ, whose
    # graph reader uses the Relax helpers
    assert "tvm_memplan.quant.lower" in graph["tvm_memplan.relax.pipeline"]
    assert {"tvm_memplan.relax", "tvm_memplan.relax.ir_utils"} <= graph["tvm_memplan.quant.qdq_graph"]
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " imports ".join(reversed(cycle))


def _package(root: Path, user_source: str) -> Path:
    """pkg/b/user.py holds ``user_source``; pkg/a/__init__ re-exports pkg.a.main, which imports pkg.b.user."""
    files = {
        "pkg/__init__.py": "",
        "pkg/a/__init__.py": "from .main import run\n",
        "pkg/a/main.py": "from ..b.user import use\n",
        "pkg/a/helpers.py": "def helper(): ...\n",
        "pkg/b/__init__.py": "",
        "pkg/b/user.py": user_source,
    }
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    return root / "pkg"


@pytest.mark.parametrize(
    "helper_import",
    ["from ..a.helpers import helper", "from ..a import helpers", "import pkg.a.helpers", "from pkg.a import helpers"],
)
def test_a_cycle_through_a_package_init_is_found(tmp_path, helper_import):
    # pkg.b.user imports a helper of pkg.a, which runs pkg/a/__init__, which imports pkg.a.main -> pkg.b.user
    cycle = _cycle(import_graph(_package(tmp_path, f"{helper_import}\n")))
    assert cycle is not None and {"pkg.a", "pkg.a.main", "pkg.b.user"} <= set(cycle)


def test_imports_that_do_not_run_on_import_make_no_cycle(tmp_path):
    user = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..a import helpers\n"
        "def use():\n    from ..a.helpers import helper\n"
    )
    assert _cycle(import_graph(_package(tmp_path, user))) is None
