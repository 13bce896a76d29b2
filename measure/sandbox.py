"""Run a generated Python program in a subprocess: a timeout, no network, resource limits.

For model output in an evaluation (HumanEval's pass@1), not for hostile code: the program
runs as this user. What it gets:

- ``python -I`` (isolated: no PYTHONPATH, no user site-packages, no current folder on
  ``sys.path``) in a fresh temporary folder that is removed afterwards, with an empty
  environment apart from ``PATH``;
- a preamble that makes every socket constructor (``socket.socket``, ``socket.socketpair``,
  ``socket.create_connection``, ``_socket.socket``) raise ``OSError``, so network calls fail;
- limits set in the child before it starts: CPU seconds, address space, file size, open
  files;
- a wall-clock timeout; the whole process group is killed when it expires.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

PREAMBLE = """\
import _socket, socket
def _no_network(*args, **kwargs):
    raise OSError("network disabled in the sandbox")
class _NoSocket:
    def __new__(cls, *args, **kwargs):
        raise OSError("network disabled in the sandbox")
socket.socket = _socket.socket = socket.SocketType = _NoSocket
socket.socketpair = socket.create_connection = socket.create_server = _no_network
socket.fromfd = _no_network
del _socket, socket
"""
MEMORY_BYTES = 1 << 30
FILE_BYTES = 16 << 20
OPEN_FILES = 64


@dataclass(frozen=True)
class SandboxResult:
    passed: bool  # exit status 0 within the timeout
    timed_out: bool
    returncode: int | None  # None when timed out
    output: str  # the last lines of stdout + stderr


def _limits(cpu_seconds: int) -> None:
    """In the child, before exec: resource limits."""
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_BYTES, FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.splitlines()[-lines:])


def run_program(source: str, timeout: float = 10.0) -> SandboxResult:
    """Run ``source`` (after the network-disabling preamble) and say whether it exited 0."""
    with tempfile.TemporaryDirectory(prefix="mo-sandbox-") as folder:
        program = Path(folder) / "program.py"
        program.write_text(PREAMBLE + source, encoding="utf-8")
        cpu = int(timeout) + 1
        process = subprocess.Popen(
            [sys.executable, "-I", str(program)],
            cwd=folder,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: _limits(cpu),
        )
        try:
            out, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            out, _ = process.communicate()
            return SandboxResult(False, True, None, _tail(out.decode("utf-8", "replace")))
        finally:
            _kill_group(process.pid)  # anything it left behind in its group
        text = out.decode("utf-8", "replace")
        return SandboxResult(process.returncode == 0, False, process.returncode, _tail(text))


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
