"""``parity-tracker ui``: the ``mlflow server`` child, the addresses to open, and a clean stop.

The server runs in its own process group (``start_new_session``), so a signal reaches all of it
(``mlflow server`` starts uvicorn and huey job consumers): SIGTERM or SIGINT received by
``parity-tracker ui`` is passed on to the group as SIGTERM, and the command returns only when
the group's leader exited and the port accepts a new bind (SIGKILL to the group after
:data:`STOP_GRACE_S`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

#: Seconds the server group gets to exit after a forwarded signal before SIGKILL.
STOP_GRACE_S = 5.0
#: Seconds the group may linger once its port is free (shutdown chores) before SIGKILL.
LINGER_S = 1.0
#: Seconds ``serve`` waits for the port to be free once the group is gone.
PORT_FREE_WAIT_S = 8.0
#: The line printed with the URLs: how to leave MLflow 3's GenAI mode by hand.
MODE_HINT = (
    "If MLflow shows a GenAI overview (traces) instead of the runs table, pick "
    '"Model training" in the GenAI | Model training switch at the top of the side bar '
    "(parity experiments carry the tag mlflow.experimentKind=custom_model_development, "
    "which selects it)."
)


def ui_command(uri: str, host: str, port: int) -> list[str]:
    """The ``mlflow server`` command line serving the store at ``uri``."""
    return [
        sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
        "--host", host, "--port", str(port), "--workers", "1",
    ]  # fmt: skip


def port_free(host: str, port: int) -> bool:
    """True when a new server could bind ``(host, port)`` now (nothing listens on it).

    Binds with ``SO_REUSEADDR``, as servers do, so connections left in TIME_WAIT by the
    stopped server do not count as holding the port.
    """
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def wait_port_free(host: str, port: int, timeout_s: float = PORT_FREE_WAIT_S) -> bool:
    """Poll ``port_free`` every 0.1 s for up to ``timeout_s``; True once free."""
    deadline = time.monotonic() + timeout_s
    while not port_free(host, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def wait_healthy(base: str, proc: subprocess.Popen, timeout_s: float = 120.0) -> bool:
    """Poll ``<base>/health`` until it answers 200 (True) or ``proc`` exits / time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(0.3)
    return False


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


@dataclass
class _Forwarder:
    """Signal handlers that pass SIGTERM/SIGINT on to the server's process group."""

    pid: int
    received: list[int] = field(default_factory=list)

    def __call__(self, signum: int, frame: object) -> None:
        self.received.append(signum)
        # SIGTERM for both: on SIGINT the server's huey job consumers wait for their workers
        # (a graceful stop of many seconds); on SIGTERM every process of the group exits at once.
        _killpg(self.pid, signal.SIGTERM)


def _stop(proc: subprocess.Popen, host: str, port: int) -> None:
    """Wait for the group to exit and the port to be free; SIGKILL the group when it lingers.

    The group gets :data:`STOP_GRACE_S` to exit, or :data:`LINGER_S` once the port is free
    (its listening socket closed, only shutdown chores left); then SIGKILL.
    """
    deadline, freed = time.monotonic() + STOP_GRACE_S, None
    while proc.poll() is None and time.monotonic() < deadline:
        if port_free(host, port):
            freed = freed or time.monotonic()
            if time.monotonic() - freed > LINGER_S:
                break
        time.sleep(0.1)
    if proc.poll() is None:
        _killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if not wait_port_free(host, port, PORT_FREE_WAIT_S / 2):
        _killpg(proc.pid, signal.SIGKILL)  # a worker of the group still holds the port
        wait_port_free(host, port, PORT_FREE_WAIT_S / 2)


def _pump(stream: IO[bytes], keep: Callable[[str], bool], out: IO[str]) -> None:
    """Copy ``stream``'s lines that ``keep`` accepts to ``out``, until end of file."""
    with contextlib.suppress(OSError, ValueError):  # ``out`` closed: the CLI is ending
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace")
            if keep(line.rstrip("\r\n")):
                out.write(line)
                out.flush()
    stream.close()


def serve(
    command: list[str],
    *,
    host: str,
    port: int,
    env: dict[str, str] | None = None,
    on_ready: Callable[[], None] | None = None,
    keep_line: Callable[[str], bool] | None = None,
) -> int:
    """Run the server ``command`` until it exits or this process gets SIGTERM / SIGINT.

    Args:
        command: the server command line (``ui_command``).
        host: the address it binds (checked free after the stop).
        port: its port.
        env: its environment (default: this process's).
        on_ready: called once ``/health`` answers (e.g. to open a browser), in a thread.
        keep_line: when given, the server's stdout and stderr lines pass through it (a thread)
            and those it accepts go to this process's stderr (``quiet.server_line_shown``;
            stdout stays ours, e.g. for ``--json``); None: the server writes to ours directly.

    Returns:
        The exit code: the server's own when it stopped by itself, else 128 + the signal
        number (130 for SIGINT, 143 for SIGTERM), after the port is free again.
    """
    piped = {} if keep_line is None else {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
    proc = subprocess.Popen(command, env=env, start_new_session=True, **piped)
    pump = None
    if keep_line is not None:
        pump = threading.Thread(target=_pump, args=(proc.stdout, keep_line, sys.stderr),
                                daemon=True)  # fmt: skip
        pump.start()
    forward = _Forwarder(proc.pid)
    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        if on_ready is not None:
            base = f"http://{host}:{port}"
            threading.Thread(
                target=lambda: wait_healthy(base, proc) and on_ready(), daemon=True
            ).start()
        code = proc.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if proc.poll() is None:  # left by an exception of ours: stop the server too
            _killpg(proc.pid, signal.SIGTERM)
        if proc.poll() is None or forward.received:
            _stop(proc, host, port)
        if pump is not None:  # the server's last lines (its group is gone: end of file)
            pump.join(timeout=2.0)
    return 128 + forward.received[0] if forward.received else int(code)
