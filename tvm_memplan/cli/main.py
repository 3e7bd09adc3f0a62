"""Entry point of ``tvm-memplan``: each command module registers its own subcommands."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from ..errors import UserError

# Each module defines ``register(subparsers)``; a subcommand sets ``func(args) -> int``.
COMMAND_MODULES = [
    "tvm_memplan.cli.plan",
    "tvm_memplan.cli.deploy",
    "tvm_memplan.cli.lq",
    "tvm_memplan.cli.gpu",
    "tvm_memplan.cli.groups",
]


def version_text() -> str:
    """This package's version and the TVM it runs on (from the installed metadata: no ``import tvm``)."""
    from importlib.metadata import PackageNotFoundError, version

    from .. import __version__

    try:
        tvm_version = version("apache-tvm")
    except PackageNotFoundError:
        tvm_version = "not installed from PyPI"
    return f"tvm-memplan {__version__} (apache-tvm {tvm_version}, Python {sys.version.split()[0]})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tvm-memplan",
        description="Memory planning for Apache TVM Relax models: reports, plans, builds and benchmarks.",
    )
    version = version_text()
    parser.add_argument("--version", action="version", version=version)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    for command in {id(p): p for p in subparsers.choices.values()}.values():  # aliases share a parser
        command.add_argument("--version", action="version", version=version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"tvm-memplan: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tvm-memplan: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - a failure inside TVM or a bug: one line, the traceback on request
        if os.environ.get("TVM_MEMPLAN_TRACEBACK"):
            raise
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        print(
            f"tvm-memplan: internal error ({type(exc).__name__}): {lines[-1] if lines else 'no message'} "
            "(set TVM_MEMPLAN_TRACEBACK=1 for the traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
