import socket
import sys
import time
from pathlib import Path

import pytest

from backends.commands import Programs
from backends.launch import TierLaunch
from backends.process import (
    LOWEST_PICKED,
    TierProcess,
    TierStartError,
    _group_alive,
    check_port_free,
    ephemeral_range,
    free_port,
    pick_order,
)


def test_port_in_use_is_named() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(TierStartError, match=f"port {port} is already in use on 127.0.0.1"):
            check_port_free("127.0.0.1", port)


def _fake_python(tmp_path: Path, body: str) -> Path:
    """A stand-in interpreter that ignores vLLM's argv and runs ``body``."""
    script = tmp_path / "python"
    script.write_text(f"#!{sys.executable}\n{body}\n")
    script.chmod(0o755)
    return script


def _tier(tmp_path: Path, python: Path) -> TierProcess:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    launch = TierLaunch(name="int4", model_dir=tmp_path, served_model_name="m", port=port)
    return TierProcess(launch, Programs(vllm_python=python), tmp_path / "tier.log")


def test_server_dying_during_start_reports_its_error(tmp_path: Path) -> None:
    python = _fake_python(
        tmp_path, "import sys\nprint('ValueError: unsupported architecture Nope')\nsys.exit(3)"
    )
    tier = _tier(tmp_path, python)
    tier.start()
    started = time.monotonic()
    with pytest.raises(TierStartError, match=r"tier int4 exited during start \(code 3\).*Nope"):
        tier.wait_ready(timeout=30)
    assert time.monotonic() - started < 10


def test_stop_kills_the_whole_process_group(tmp_path: Path) -> None:
    # The parent spawns a child that ignores SIGTERM, like a stuck worker.
    body = (
        "import signal, subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
        "time.sleep(60)"
    )
    tier = _tier(tmp_path, _fake_python(tmp_path, body))
    tier.start()
    time.sleep(0.5)
    assert tier.process is not None
    pgid = tier.process.pid
    assert _group_alive(pgid)
    tier.stop(grace=1.0)
    assert not _group_alive(pgid)


def test_a_restart_keeps_the_previous_logs(tmp_path: Path) -> None:
    """The crash log a restart would have truncated survives as tier.log.1 (then .2, .3)."""
    tier = _tier(tmp_path, _fake_python(tmp_path, "import os\nprint('run', os.getpid())"))
    pids = []
    for _ in range(5):
        tier.start()
        assert tier.process is not None
        tier.process.wait(timeout=30)
        pids.append(tier.process.pid)
    log = tmp_path / "tier.log"
    assert log.read_text().split() == ["run", str(pids[-1])]
    for back in (1, 2, 3):
        previous = log.with_name(f"tier.log.{back}")
        assert previous.read_text().split() == ["run", str(pids[-1 - back])]
    assert not log.with_name("tier.log.4").exists()


def test_free_port_is_below_the_ephemeral_range_where_there_is_room(tmp_path: Path) -> None:
    low = ephemeral_range()[0]
    port = free_port()
    if low - LOWEST_PICKED >= 64:
        assert LOWEST_PICKED <= port < low
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # and it is free
    wide = tmp_path / "range"
    wide.write_text("1024\t65535\n")
    assert ephemeral_range(wide) == (1024, 65535)
    assert pick_order(ephemeral_range(wide), seed=7) == []  # no room: port 0's choice instead
    bad = tmp_path / "bad"
    bad.write_text("garbage")
    assert ephemeral_range(bad) == (32768, 60999)


def test_pick_order_spreads_over_the_room_below_the_range() -> None:
    picks = pick_order((32768, 60999), seed=123456)
    assert len(picks) == len(set(picks)) == 64
    assert all(LOWEST_PICKED <= p < 32768 for p in picks)
    assert pick_order((32768, 60999), seed=1)[0] != pick_order((32768, 60999), seed=2)[0]
