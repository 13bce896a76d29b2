"""measure/sandbox.py: a real subprocess each; no network, a timeout, limits, a clean cwd."""

from __future__ import annotations

import time

from measure.sandbox import run_program

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


def test_network_attempts_fail() -> None:
    program = """
import socket, urllib.request
for attempt in (
    lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM),
    lambda: socket.create_connection(("127.0.0.1", 9)),
    lambda: __import__("_socket").socket(),
    lambda: urllib.request.urlopen("http://127.0.0.1:9", timeout=2),
):
    try:
        attempt()
    except OSError as exc:
        print("blocked:", exc)
    else:
        raise SystemExit("network reached")
"""
    result = run_program(program, timeout=10)
    assert result.passed, result.output
    assert result.output.count("blocked:") == 4
    assert "network disabled in the sandbox" in result.output


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
