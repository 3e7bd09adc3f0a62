"""One vocabulary on every command: ``--version``, ``--json``, ``--target`` names (TVM targets too),
``-o/--output``, ``--work-dir``; old spellings still work, with a note on stderr."""

from __future__ import annotations

import argparse
import json

import numpy as np
import onnx
import pytest

from tvm_memplan import __version__
from tvm_memplan.cli.main import build_parser, main

from ..lq.models import mlp
from .test_plan import run_cli

PARSER = build_parser()
SUBPARSERS = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction))
COMMANDS = sorted(SUBPARSERS.choices)
TARGETED = ["plan", "build", "measure", "compare-groups", "tune", "quantize"]


def _options(command: str) -> set[str]:
    return {option for action in SUBPARSERS.choices[command]._actions for option in action.option_strings}


def test_every_command_takes_json_and_version():
    assert {
        "plan",
        "solve",
        "build",
        "measure",
        "rpc-local",
        "tune",
        "quantize",
        "lq-bench",
        "setup-gpu",
        "compare-groups",
        "bench",
    } <= set(COMMANDS)
    for command in COMMANDS:
        assert {"--json", "--version"} <= _options(command), command


@pytest.mark.parametrize("argv", [["--version"], ["plan", "--version"], ["quantize", "--version"]])
def test_version_names_this_package_and_tvm(capsys, argv):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out = capsys.readouterr().out
    assert exited.value.code == 0 and out.startswith(f"tvm-memplan {__version__} (apache-tvm 0.27")


@pytest.mark.parametrize("command", TARGETED)
def test_one_target_vocabulary_on_every_command(command, capsys):
    assert "--target" in _options(command)
    for target in ("host", "x86-64", "llvm-aarch64", "llvm", '{"kind": "llvm", "mcpu": "skylake"}'):
        args = PARSER.parse_args([command, "MODEL", "--target", target, *_required(command)])
        assert args.target == target
    with pytest.raises(SystemExit) as exited:
        PARSER.parse_args([command, "MODEL", "--target", "cortex-m99", *_required(command)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "unknown target 'cortex-m99': not one of host, x86-64" in err


def _required(command: str) -> list[str]:
    return {"tune": ["--trials", "1", "--work-dir", "W"], "quantize": ["--calib", "C", "-o", "O"]}.get(command, [])


@pytest.mark.parametrize("old, new", [("native", "host"), ("aarch64", "llvm-aarch64")])
def test_quantize_target_names_of_before_still_work_with_a_note(capsys, old, new):
    args = PARSER.parse_args(["quantize", "m.onnx", "--calib", "c.npz", "-o", "q.so", "--target", old])
    assert args.target == new
    assert f"--target {old} is deprecated and will be removed; use --target {new}" in capsys.readouterr().err


def test_old_option_spellings_still_work_with_a_note(capsys):
    args = PARSER.parse_args(
        ["quantize", "m.onnx", "--calib", "c.npz", "-o", "q.so", "--tune-trials", "3", "--tune-dir", "db"]
    )
    assert args.trials == 3 and str(args.work_dir) == "db"
    err = capsys.readouterr().err
    assert "--tune-trials is deprecated" in err and "use --trials" in err and "use --work-dir" in err
    assert PARSER.parse_args(["solve", "p.csv", "--out", "o.csv"]).output == "o.csv"
    assert "--out is deprecated and will be removed; use -o/--output" in capsys.readouterr().err


def test_bench_is_now_compare_groups_and_says_so(capsys, small_onnx):
    code, out, err = run_cli(capsys, "bench", small_onnx, "--groups", "0")
    assert code == 2 and not out
    assert "tvm-memplan bench is deprecated and will be removed; use tvm-memplan compare-groups" in err


@pytest.mark.parametrize("command, target", [("tune", "cortex-m7"), ("quantize", "opencl")])
def test_a_target_a_command_cannot_build_for_is_one_line(capsys, tmp_path, command, target):
    argv = [command, "zoo:mlp", "--target", target, *_required(command)]
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and f"target {target}" in err


def test_tvm_targets_and_device_names_plan_alike(capsys, small_onnx):
    reports = [
        json.loads(run_cli(capsys, "plan", small_onnx, "--target", target, "--order", "program", "--json")[1])
        for target in ("llvm", "x86-64", "cortex-m7")
    ]
    assert [r["target"] for r in reports] == ["llvm", "llvm", "c"]
    assert len({r["arena_bytes"] for r in reports}) == 1


def test_the_quick_commands_print_one_json_object(capsys, tmp_path, small_onnx):
    """Each command run for real with --json (tune, compare-groups, lq-bench and setup-gpu have their own tests)."""
    problem = tmp_path / "p.csv"
    problem.write_text("id,lower,upper,size\n0,0,2,64\n1,1,3,128\n")
    model = tmp_path / "one.onnx"
    onnx.save(mlp((40, 6), batch="N"), str(model))
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).normal(size=(16, 40)).astype(np.float32))
    runs = {
        "plan": ["plan", small_onnx, "--order", "program"],
        "solve": ["solve", str(problem), "-o", str(tmp_path / "offsets.csv")],
        "build": ["build", "zoo:mlp?hidden=16", "-o", str(tmp_path / "mlp.so"), "--target", "llvm"],
        "measure": ["measure", str(tmp_path / "mlp.so"), "--repeat", "1", "--min-repeat-ms", "1"],
        "rpc-local": ["rpc-local", "--servers", "0", "--lifetime", "0.1", "--port", "9395"],
        "quantize": ["quantize", str(model), "--calib", str(tmp_path / "calib.npz"), "-o", str(tmp_path / "q.so")],
    }
    expected = {
        "plan": "arena_bytes",
        "solve": "arena_bytes",
        "build": "artifact",
        "measure": "memplan",
        "rpc-local": "tracker",
        "quantize": "layers",
    }
    for command, argv in runs.items():
        code, out, err = run_cli(capsys, *argv, "--json")
        assert code == 0, (command, err)
        assert expected[command] in json.loads(out), command
