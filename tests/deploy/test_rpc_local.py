"""``tvm-memplan rpc-local`` as a user runs it: start, serve, stop on SIGTERM with nothing left behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import psutil
from tvm import rpc


def _children_of(pid: int) -> list[psutil.Process]:
    """Farm processes started for ``pid`` (they carry ``--parent-pid PID``)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "--parent-pid" in cmdline and cmdline[cmdline.index("--parent-pid") + 1] == str(pid):
            found.append(process)
    return found


def test_rpc_local_serves_and_stops_cleanly():
    command = [sys.executable, "-m", "tvm_memplan.cli.main", "rpc-local", "--lifetime", "90", "--servers", "2"]
    cli = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        first = cli.stdout.readline()
        assert first.startswith("tracker 127.0.0.1:"), first
        host, port = first.split()[1].rstrip(";").split(":")
        summary = rpc.connect_tracker(host, int(port)).summary()
        assert summary["queue_info"]["local"]["free"] == 2
        assert all(server["addr"][0] == "127.0.0.1" for server in summary["server_info"])
        assert len(_children_of(cli.pid)) == 3

        cli.send_signal(signal.SIGTERM)
        rest, _ = cli.communicate(timeout=30)
        assert cli.returncode == 0 and "stopped tracker and servers" in rest
        deadline = time.monotonic() + 10
        while _children_of(cli.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _children_of(cli.pid)
        with socket.socket() as probe:
            assert probe.connect_ex((host, int(port))) != 0
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
            cli.wait()
