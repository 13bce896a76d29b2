"""measure/sandbox.py: a real subprocess each, in its own network and PID namespaces, as an
unprivileged user; a timeout, limits, a clean cwd."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from measure import sandbox
from measure.sandbox import NOBODY, SandboxUnavailable, check_sandbox, run_program, sandbox_argv

CORRECT = """
def add(a, b):
    return a + b

assert add(2, 3) == 5
"""


def test_a_correct_solution_passes() -> None:
    result = run_program(CORRECT, timeout=10)
    assert result.passed and not result.timed_out and result.returncode == 0


def test_a_failing_assertion_fails() -> None:
    result = run_program("assert 1 + 1 == 3\n", timeout=10)
    assert not result.passed and not result.timed_out
    assert result.returncode == 1 and "AssertionError" in result.output


def test_an_infinite_loop_times_out_and_is_killed() -> None:
    started = time.monotonic()
    result = run_program("while True:\n    pass\n", timeout=1.5)
    assert result.timed_out and not result.passed and result.returncode is None
    assert time.monotonic() - started < 10


@pytest.fixture
def listener() -> Iterator[int]:
    """A port on this machine's loopback that accepts connections (outside the sandbox)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_network_attempts_fail(listener: int) -> None:
    """Every way to a socket, the re-imported _socket and a subprocess included, finds no
    network: the program has its own network namespace (a loopback that is down)."""
    program = f"""
import importlib, socket, subprocess, sys, urllib.request
raw = importlib.import_module("_socket")
attempts = (
    lambda: socket.create_connection(("127.0.0.1", {listener}), timeout=2),
    lambda: raw.socket(raw.AF_INET, raw.SOCK_STREAM).connect(("127.0.0.1", {listener})),
    lambda: urllib.request.urlopen("http://127.0.0.1:{listener}", timeout=2),
)
for attempt in attempts:
    try:
        attempt()
    except OSError as exc:
        print("blocked:", exc)
    else:
        raise SystemExit("network reached")
child = "import socket; socket.create_connection(('127.0.0.1', {listener}), timeout=2)"
done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
assert done.returncode != 0, "a subprocess reached the network"
print("blocked: subprocess", done.stderr.strip().splitlines()[-1])
"""
    result = run_program(program, timeout=10)
    assert result.passed, result.output
    assert result.output.count("blocked:") == 4, result.output


def _running(token: str) -> list[int]:
    """Processes on this machine whose command line holds ``token``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("finish", ["exits", "times out"])
def test_a_setsid_child_does_not_outlive_the_program(finish: str) -> None:
    """A child in a new session (out of the process group) still dies with the program: the
    program is PID 1 of its own PID namespace, and the kernel kills the rest with it."""
    token = f"mo-sandbox-escape-{uuid.uuid4().hex}"
    program = f"""
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "{token}"],
                 start_new_session=True)
time.sleep(0.5)
{"time.sleep(60)" if finish == "times out" else ""}
"""
    result = run_program(program, timeout=3)
    assert result.timed_out is (finish == "times out"), result.output
    deadline = time.monotonic() + 5
    while _running(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _running(token) == []


def test_the_program_runs_unprivileged() -> None:
    program = "import os\nprint('uid', os.getuid(), os.geteuid())\nassert os.geteuid() != 0\n"
    result = run_program(program, timeout=10)
    assert result.passed, result.output
    if os.geteuid() == 0:
        assert f"uid {NOBODY} {NOBODY}" in result.output


def test_as_root_it_drops_to_nobody_in_new_namespaces() -> None:
    argv = sandbox_argv(Path("/tmp/p/program.py"), "/usr/bin/python3", as_root=True)
    assert argv[0] == "unshare" and {"--net", "--pid", "--kill-child"} <= set(argv)
    assert "--user" not in argv and "--map-root-user" not in argv
    setpriv = argv[argv.index("setpriv") :]
    assert f"--reuid={NOBODY}" in setpriv and f"--regid={NOBODY}" in setpriv
    assert "--no-new-privs" in setpriv and "--pdeathsig=keep" in setpriv
    assert argv[-3:] == ["/usr/bin/python3", "-I", "/tmp/p/program.py"]


def test_as_another_user_it_adds_a_user_namespace() -> None:
    argv = sandbox_argv(Path("/tmp/p/program.py"), "/usr/bin/python3", as_root=False)
    assert {"--user", "--net", "--pid", "--kill-child"} <= set(argv)
    assert "setpriv" not in argv


def test_no_sandbox_no_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without unshare the sandbox refuses to run anything (one line), never runs unconfined."""
    check_sandbox.cache_clear()
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    try:
        with pytest.raises(SandboxUnavailable, match=r"^code sandbox unavailable: .*unshare"):
            run_program("print(1)\n", timeout=5)
    finally:
        check_sandbox.cache_clear()


def test_runs_isolated_in_an_empty_temporary_folder() -> None:
    program = """
import os, sys
assert os.listdir(".") == ["program.py"], os.listdir(".")
assert sys.flags.isolated == 1
assert "PYTHONPATH" not in os.environ
print(os.getcwd())
"""
    result = run_program(program, timeout=10)
    assert result.passed, result.output
    assert "mo-sandbox-" in result.output


def test_memory_is_limited() -> None:
    result = run_program("x = bytearray(4 << 30)\n", timeout=10)
    assert not result.passed and "MemoryError" in result.output
