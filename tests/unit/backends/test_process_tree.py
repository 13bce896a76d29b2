"""process_tree: the RSS of a process tree and the process listening on a port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from backends.process import free_port
from backends.process_tree import listening_pid, tree_pids, tree_rss_bytes


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A child process holding ~40 MB resident, so the tree's RSS grows measurably."""
    code = "import sys, time\nheld = b'x' * (40 * 2**20)\nprint('ok', flush=True)\ntime.sleep(60)\n"
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"ok\n"
    yield process
    process.kill()
    process.wait(timeout=10)


def test_tree_rss_counts_the_descendants(child: subprocess.Popen[bytes]) -> None:
    own = psutil.Process().memory_info().rss
    child_rss = psutil.Process(child.pid).memory_info().rss
    total = tree_rss_bytes(os.getpid())
    assert total is not None
    assert total >= own + child_rss - 8 * 2**20  # RSS moves a little between reads
    assert child_rss > 40 * 2**20
    alone = tree_rss_bytes(child.pid)
    assert alone is not None and 0 < alone <= total
    assert child.pid in tree_pids(os.getpid()) and tree_pids(child.pid) == [child.pid]


def test_a_process_that_is_gone_has_no_figure() -> None:
    dead = psutil.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    assert tree_rss_bytes(dead.pid) is None
    assert tree_pids(dead.pid) == []


def test_listening_pid_finds_this_process() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert listening_pid(sock.getsockname()[1]) == os.getpid()
    assert listening_pid(free_port()) is None
