"""Options every command spells the same way: ``--target``, ``--json``, ``--work-dir``, the RPC device,
timing repeats, the cross compiler, and old spellings that keep working for one release with a note on
stderr."""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable
from typing import Any

EMULATED_DEVICES = ["qemu-cortex-m7", "qemu-cortex-m4", "qemu-cortex-m55"]
"""The emulated microcontrollers of ``measure DIR --device`` and ``--split acg --device`` (qemu-system-arm)."""

OLD_TARGET_NAMES = {"native": "host", "aarch64": "llvm-aarch64"}
"""quantize's former target names and the device names that replace them."""


def add_command(
    subparsers: argparse._SubParsersAction, name: str, run: Callable[[argparse.Namespace], Any], **texts: Any
) -> argparse.ArgumentParser:
    """The subcommand ``name``, which runs ``run(args)``. As click does, ``run``'s docstring is its text: the
    first paragraph the help line, the rest the description; ``texts`` (aliases, a computed description)
    go to ``add_parser`` as they are."""
    summary, _, rest = (inspect.getdoc(run) or "").partition("\n\n")
    texts.setdefault("help", " ".join(summary.split()))
    texts.setdefault("description", rest or None)
    parser = subparsers.add_parser(name, **texts)
    parser.set_defaults(func=run)
    return parser


def deprecation_note(old: str, new: str) -> None:
    print(f"tvm-memplan: note: {old} is deprecated and will be removed; use {new}", file=sys.stderr)


def parse_target(text: str) -> str:
    """A device name (``host``, ``cortex-m7``, ``opencl``, ...) or a TVM target (``llvm``, a JSON dict);
    an old name is translated with a note. Unknown names fail at parse time, in one line."""
    from ..deploy.targets import get_target
    from ..errors import UserError

    text = text.strip()
    if text in OLD_TARGET_NAMES:
        deprecation_note(f"--target {text}", f"--target {OLD_TARGET_NAMES[text]}")
        text = OLD_TARGET_NAMES[text]
    try:
        get_target(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def target_help() -> str:
    from ..deploy.targets import TARGETS

    return (
        f"a device name: {', '.join(TARGETS)} (default host; 'tvm-memplan build --help' says what each is), "
        "or a TVM target: a kind (llvm, c, cuda, vulkan, opencl) or a JSON dict such as "
        '{"kind": "llvm", "mcpu": "skylake"}'
    )


def add_target(parser: argparse.ArgumentParser, note: str = "") -> None:
    """``--target``, with the same names and TVM targets on every command."""
    parser.add_argument(
        "--target",
        default="host",
        type=parse_target,
        metavar="TARGET",
        help=target_help() + (f"; {note}" if note else ""),
    )


def add_json(parser: argparse.ArgumentParser, what: str = "print one JSON object instead of the report") -> None:
    parser.add_argument("--json", action="store_true", help=what)


def add_rpc_device(parser: argparse.ArgumentParser | argparse._ArgumentGroup, purpose: str = "") -> None:
    """``--rpc-tracker``/``--rpc-key``: run on a device from an RPC tracker instead of this machine."""
    note = f" ({purpose})" if purpose else ""
    parser.add_argument("--rpc-tracker", metavar="HOST:PORT", help=f"RPC tracker to get the device from{note}")
    parser.add_argument("--rpc-key", metavar="KEY", help="device key at the tracker")


def rpc_device(args: argparse.Namespace) -> dict[str, str | None]:
    """What :func:`add_rpc_device` parsed, as the ``tracker`` and ``key`` keywords of ``Device``, measure and tune."""
    return {"tracker": args.rpc_tracker, "key": args.rpc_key}


def add_repeats(parser: argparse.ArgumentParser, per: str = "") -> None:
    """``--repeat`` and ``--min-repeat-ms``: how a latency is timed (TVM's ``time_evaluator``)."""
    parser.add_argument("--repeat", type=int, default=10, metavar="N", help=f"timed repeats{per} (default 10)")
    parser.add_argument(
        "--min-repeat-ms", type=int, default=50, metavar="MS", help="each repeat lasts at least MS (default 50)"
    )


def add_work_dir(parser: argparse.ArgumentParser, tuning: bool = False) -> None:
    """``--work-dir``: where ``tune`` keeps its MetaSchedule database, which build and measure apply."""
    if tuning:
        parser.add_argument("--work-dir", required=True, metavar="DIR", help="the MetaSchedule database and logs")
    else:
        parser.add_argument("--work-dir", metavar="DIR", help="apply the kernels tuned by 'tvm-memplan tune' in DIR")


def add_switch(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: str, default: bool | None, help: str
) -> None:
    """``flag`` and its ``--no-`` form (argparse's ``BooleanOptionalAction``); None: the caller's default."""
    parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help)


def add_cross_compiler(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cross-compiler",
        metavar="CXX",
        help="link the library with CXX instead of the target's compiler (e.g. an NDK clang++)",
    )


class _Deprecated(argparse.Action):
    """An old option spelling: stores into the new option's ``dest`` and says which spelling to use."""

    def __init__(
        self,
        option_strings: list[str],
        dest: str,
        new: str = "",
        convert: Callable[[str], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new, self.convert = new, convert

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        deprecation_note(option_string or self.option_strings[0], self.new)
        setattr(namespace, self.dest, self.convert(values) if self.convert else values)


def add_deprecated_alias(
    parser: argparse.ArgumentParser, old: str, new: str, dest: str, convert: Callable[[str], Any] | None = None
) -> None:
    """Accept ``old`` for ``new`` (hidden from --help), with a note on stderr when used."""
    parser.add_argument(old, dest=dest, action=_Deprecated, new=new, convert=convert, help=argparse.SUPPRESS)


def _input_shapes(text: str) -> str:
    from ..errors import UserError
    from ..frontend import format_input_shapes, parse_input_shapes

    try:
        return format_input_shapes(parse_input_shapes(text))
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_model_inputs(parser: argparse.ArgumentParser, inputs: bool = True) -> None:
    """``--input-shapes`` (dynamic dimensions bound at compile time) and ``--inputs`` (the user's data)."""
    parser.add_argument(
        "--input-shapes",
        type=_input_shapes,
        metavar="NAME:1x3x224x224[,...]",
        help="static shapes for the model's inputs: binds dynamic dimensions (batch, sequence) at compile time",
    )
    if inputs:
        parser.add_argument(
            "--inputs",
            metavar="FILE.npz",
            help="run on these arrays (one per model input, by name) "
            "instead of random data; their shapes bind dynamic dimensions unless --input-shapes does",
        )


def model_spec_and_inputs(model: str, input_shapes: str | None, inputs_file: str | None):
    """The model spec with its input shapes bound, and the user's inputs checked against that model
    (None without ``--inputs``). Unless ``--input-shapes`` or the spec bind them, the arrays' shapes do."""
    from ..frontend import (
        bound_input_shapes,
        check_inputs,
        format_input_shapes,
        load_model,
        read_inputs,
        with_input_shapes,
    )

    given = read_inputs(inputs_file) if inputs_file else None
    if input_shapes is None and given is not None and bound_input_shapes(model) is None:
        input_shapes = format_input_shapes({name: tuple(array.shape) for name, array in given.items()})
    spec = with_input_shapes(model, input_shapes)
    return spec, (check_inputs(load_model(spec), given) if given is not None else None)
