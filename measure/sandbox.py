"""Run a generated Python program (HumanEval's pass@1 in ``eval``) confined by the kernel.

What the program gets (Linux namespaces through util-linux's ``unshare`` and ``setpriv``,
both in Debian's essential util-linux package; no seccomp filter):

- its own network namespace: a loopback that is down and no other interface, so every
  connection fails (re-importing ``_socket``, a subprocess, ``ctypes``: there is no network to
  reach), and abstract Unix sockets of the machine are out of sight;
- its own PID namespace, the program its PID 1 (``--kill-child``, ``/proc`` remounted): when it
  exits or is killed the kernel kills everything left in the namespace, so a child that calls
  ``setsid`` or double-forks does not outlive it;
- run as root, the program drops to ``nobody`` (uid/gid 65534, no supplementary groups, no
  capabilities, ``no_new_privs``) and runs the first Python interpreter ``nobody`` can execute
  (this one, else ``/usr/bin/python3``); run as another user it stays that (unprivileged)
  user inside a user namespace, and can read and write what that user can;
- ``python -I`` in a fresh temporary folder removed afterwards, an environment holding only
  ``PATH``; limits set before it starts: CPU seconds, address space, file size, open files and,
  as ``nobody``, 64 processes;
- a wall-clock timeout, after which the whole namespace is killed.

Without ``unshare`` (or where the kernel refuses the namespaces) nothing runs: ``run_program``
raises ``SandboxUnavailable``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534
MEMORY_BYTES = 1 << 30
FILE_BYTES = 16 << 20
OPEN_FILES = 64
PROCESSES = 64  # as nobody only: the limit counts every process of the user on the machine
SYSTEM_PYTHON = "/usr/bin/python3"


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run here; ``str()`` is one line naming why."""


@dataclass(frozen=True)
class SandboxResult:
    passed: bool  # exit status 0 within the timeout
    timed_out: bool
    returncode: int | None  # None when timed out
    output: str  # the last lines of stdout + stderr


def sandbox_argv(program: Path, python: str, as_root: bool) -> list[str]:
    """The command that runs ``program`` confined (pure). As root: new network, PID and mount
    namespaces, then ``setpriv`` drops to nobody. Otherwise a user namespace makes the others
    possible without privileges."""
    namespaces = ["--net", "--pid", "--fork", "--kill-child", "--mount-proc"]
    run = [python, "-I", str(program)]
    if not as_root:
        return ["unshare", "--user", "--map-current-user", *namespaces, *run]
    drop = [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all",
        # Changing the uid clears the parent-death signal --kill-child set; keep it, so killing
        # unshare still kills the namespace's PID 1 (and with it the namespace).
        "--pdeathsig=keep",
    ]
    return ["unshare", *namespaces, *drop, *run]


def _reachable_by_others(path: str) -> bool:
    """Whether a user with no relation to the file's owners can execute ``path``."""
    target = Path(path)
    try:
        if not target.stat().st_mode & stat.S_IXOTH:
            return False
        return all(parent.stat().st_mode & stat.S_IXOTH for parent in target.parents)
    except OSError:
        return False


def _interpreter(as_root: bool) -> str:
    if not as_root:
        return sys.executable
    base = str(getattr(sys, "_base_executable", sys.executable))  # a venv's own interpreter
    candidates = [os.path.realpath(sys.executable), os.path.realpath(base)]
    for candidate in [*candidates, SYSTEM_PYTHON]:
        if _reachable_by_others(candidate):
            return candidate
    raise SandboxUnavailable(
        f"code sandbox unavailable: user nobody can execute neither {candidates[0]} nor "
        f"{SYSTEM_PYTHON}"
    )


@functools.cache
def check_sandbox() -> str:
    """The interpreter the sandbox runs, once it has run a program confined here; else
    ``SandboxUnavailable`` naming why."""
    as_root = os.geteuid() == 0
    tools = ["unshare", "setpriv"] if as_root else ["unshare"]
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        raise SandboxUnavailable(
            f"code sandbox unavailable: {' and '.join(missing)} not found (Debian package "
            "util-linux)"
        )
    python = _interpreter(as_root)
    with tempfile.TemporaryDirectory(prefix="mo-sandbox-") as folder:
        program = _prepare(Path(folder), "import socket\n", as_root)
        done = subprocess.run(
            sandbox_argv(program, python, as_root),
            cwd=folder,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
            check=False,
        )
    if done.returncode != 0:
        why = " ".join(done.stderr.decode("utf-8", "replace").split())[-200:]
        raise SandboxUnavailable(f"code sandbox unavailable: {why or f'exit {done.returncode}'}")
    return python


def _prepare(folder: Path, source: str, as_root: bool) -> Path:
    program = folder / "program.py"
    program.write_text(source, encoding="utf-8")
    if as_root:  # the program runs as nobody: its folder is nobody's, the file readable
        os.chown(folder, NOBODY, NOBODY)
        program.chmod(0o644)
    return program


def _limits(cpu_seconds: int, as_root: bool) -> None:
    """In the child, before exec: resource limits (inherited by the confined program)."""
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_BYTES, FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))
    if as_root:
        resource.setrlimit(resource.RLIMIT_NPROC, (PROCESSES, PROCESSES))


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.splitlines()[-lines:])


def run_program(source: str, timeout: float = 10.0) -> SandboxResult:
    """Run ``source`` confined (see the module docstring) and say whether it exited 0."""
    python = check_sandbox()
    as_root = os.geteuid() == 0
    with tempfile.TemporaryDirectory(prefix="mo-sandbox-") as folder:
        program = _prepare(Path(folder), source, as_root)
        cpu = int(timeout) + 1
        process = subprocess.Popen(
            sandbox_argv(program, python, as_root),
            cwd=folder,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: _limits(cpu, as_root),
        )
        try:
            out, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)  # unshare dies, its PID 1 with it, the namespace with that
            out, _ = process.communicate()
            return SandboxResult(False, True, None, _tail(out.decode("utf-8", "replace")))
        finally:
            _kill_group(process.pid)
        text = out.decode("utf-8", "replace")
        return SandboxResult(process.returncode == 0, False, process.returncode, _tail(text))


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
