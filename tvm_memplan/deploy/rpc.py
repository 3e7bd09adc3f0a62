"""A local device farm: an RPC tracker and servers on 127.0.0.1, started and stopped as one unit.

Every process gets its own session (process group) so ``stop`` kills the server's forked session
workers too, a lifetime so nothing outlives a crashed test run, and our pid to watch for the same
reason. Ports are picked by the processes themselves (first free from 9190 / 9090), because other
people on the machine may hold the defaults.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from . import error_line

LOOPBACK = "127.0.0.1"
REMOTE_SCRIPT = Path(__file__).with_name("remote.py")


def parse_tracker(text: str) -> tuple[str, int]:
    """``HOST:PORT`` → (host, port), or a one-line UserError."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--rpc-tracker must be HOST:PORT, got {text!r}")
    return host, int(port)


def connect(tracker: str, key: str, timeout: float = 60.0, session_timeout: float = 600.0):
    """An RPC session to a device registered under ``key``, or a one-line UserError."""
    from tvm import rpc

    host, port = parse_tracker(tracker)
    try:  # TVM's own connect retries for 60 s before it gives up: probe first
        socket.create_connection((host, port), timeout=5).close()
        client = rpc.connect_tracker(host, port)
    except (RuntimeError, OSError) as exc:
        raise UserError(f"cannot reach the RPC tracker at {host}:{port}: {error_line(exc)}") from None
    summary = client.summary()
    if key not in summary.get("queue_info", {}):
        known = ", ".join(sorted(summary.get("queue_info", {}))) or "none"
        raise UserError(f"no device registered under key {key!r} at tracker {host}:{port} (keys: {known})")
    try:
        return client.request(key, priority=1, session_timeout=session_timeout, max_retry=max(1, int(timeout / 5)))
    except (RuntimeError, OSError) as exc:
        raise UserError(f"no free device with key {key!r} at {host}:{port}: {error_line(exc)}") from None


@dataclass
class LocalFarm:
    """A tracker and servers on loopback; use as a context manager or call :meth:`stop`."""

    tracker_port: int
    lifetime: float
    processes: dict[str, list[subprocess.Popen]] = field(default_factory=dict)

    @property
    def tracker(self) -> str:
        return f"{LOOPBACK}:{self.tracker_port}"

    def add_server(self, key: str = "local", wait: float = 90.0, command: list[str] | None = None) -> subprocess.Popen:
        """Start one server registered under ``key`` and wait until the tracker lists it free.

        ``command`` starts another kind of server (e.g. ``scripts/arm64_device.sh start``); it
        gets ``--tracker`` and ``--key`` appended and is stopped with the farm.
        """
        before = self.free(key)
        if command is None:
            command = _remote_command(["server", "--port", "9090"], self.lifetime)
        process = _spawn([*command, "--tracker", self.tracker, "--key", key])
        self.processes.setdefault(key, []).append(process)
        self.wait_for(key, before + 1, wait, process)
        return process

    def free(self, key: str) -> int:
        """How many servers under ``key`` the tracker has free right now."""
        from tvm import rpc

        summary = rpc.connect_tracker(LOOPBACK, self.tracker_port).summary()
        return int(summary.get("queue_info", {}).get(key, {}).get("free", 0))

    def wait_for(self, key: str, count: int, timeout: float, process: subprocess.Popen | None = None) -> None:
        """Block until ``count`` servers under ``key`` are free; UserError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while self.free(key) < count:
            if process is not None and process.poll() is not None:
                raise UserError(f"the RPC server for key {key!r} exited with code {process.returncode}")
            if time.monotonic() > deadline:
                raise UserError(f"no RPC server registered under key {key!r} within {timeout:.0f} s")
            time.sleep(0.3)

    def kill_servers(self, key: str) -> None:
        """Kill every server under ``key`` at once (tests use it to lose a device mid-run)."""
        for process in self.processes.pop(key, []):
            _kill(process)

    def stop(self) -> None:
        """Kill all servers, then the tracker; safe to call twice."""
        for key in reversed(list(self.processes)):  # the tracker was started first
            self.kill_servers(key)

    def __enter__(self) -> LocalFarm:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def start_farm(servers: dict[str, int] | None = None, lifetime: float = 900.0, port: int = 9190) -> LocalFarm:
    """Start a tracker on 127.0.0.1 (first free port from ``port``) and ``servers`` {key: count}
    (default one server under ``local``; ``{}`` for none)."""
    tracker = _spawn(_remote_command(["tracker", "--port", str(port)], lifetime))
    line = tracker.stdout.readline().strip() if tracker.stdout else ""
    if not line.startswith("tracker "):
        _kill(tracker)
        raise UserError(f"the RPC tracker did not start (exit code {tracker.poll()})")
    farm = LocalFarm(tracker_port=int(line.rsplit(":", 1)[1]), lifetime=lifetime, processes={"tracker": [tracker]})
    try:
        for key, count in ({"local": 1} if servers is None else servers).items():
            for _ in range(count):
                farm.add_server(key)
    except BaseException:
        farm.stop()
        raise
    return farm


def _remote_command(arguments: list[str], lifetime: float) -> list[str]:
    return [
        sys.executable,
        str(REMOTE_SCRIPT),
        *arguments,
        "--host",
        LOOPBACK,
        "--lifetime",
        str(lifetime),
        "--parent-pid",
        str(os.getpid()),
    ]


def _spawn(command: list[str]) -> subprocess.Popen:
    # TVM's thread pool runs one thread unless told: time with all cores.
    env = {**os.environ, "TVM_NUM_THREADS": os.environ.get("TVM_NUM_THREADS", str(os.cpu_count() or 1))}
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True, env=env
    )


def _kill(process: subprocess.Popen) -> None:
    """Kill the process and its whole session (TVM servers fork a worker per RPC session)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=10)
    if process.stdout:
        process.stdout.close()
