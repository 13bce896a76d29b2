"""Start, watch and stop one tier's server process (the I/O side of ``backends/commands.py``)."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from backends.commands import EngineMissing, Programs, command
from backends.launch import TierLaunch


class TierStartError(RuntimeError):
    """A tier that could not start; the message is one line naming the tier and the cause."""


def check_port_free(host: str, port: int) -> None:
    """Raise ``TierStartError`` when something already listens on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As servers bind (uvicorn and vLLM set SO_REUSEADDR): closed connections in TIME_WAIT
        # from a previous run do not count as "in use".
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise TierStartError(f"port {port} is already in use on {host}") from exc
            raise TierStartError(f"cannot bind {host}:{port}: {exc.strerror}") from exc


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (not yet listening), held so that nothing else, vLLM's
    own random ports included, takes the port before the server that will use it starts
    (``TierStartError`` when it is in use). The caller hands it to the server or closes it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise TierStartError(f"port {port} is already in use on {host}") from exc
        raise TierStartError(f"cannot bind {host}:{port}: {exc.strerror}") from exc
    return sock


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PICKED = 10000  # below: ports services are configured on (5432, 6379, 8000, 9090 ...)


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for tests and ad-hoc runs), picked below the kernel's
    ephemeral range where there is room: a port from that range (what binding port 0 gives)
    can be taken by any outgoing connection's local end while a tier loads for a minute, and on
    a busy machine one was (``up``: "port 49682 is already in use")."""
    picks = pick_order(ephemeral_range(), os.getpid() ^ time.monotonic_ns())
    for port in picks:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def ephemeral_range(path: Path = EPHEMERAL_RANGE) -> tuple[int, int]:
    """The kernel's range for the local ends of outgoing connections (Linux's default when the
    file cannot be read)."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def pick_order(ephemeral: tuple[int, int], seed: int, tries: int = 64) -> list[int]:
    """Up to ``tries`` ports to try, spread over [LOWEST_PICKED, ephemeral low) by ``seed``
    (none when that span is empty: the caller falls back to port 0)."""
    span = ephemeral[0] - LOWEST_PICKED
    if span < tries:
        return []
    start = seed % span
    step = span // tries
    return [LOWEST_PICKED + (start + i * step) % span for i in range(tries)]


LOGS_KEPT = 3  # previous logs of a tier kept beside the current one: tier-x.log.1 (newest) ...


def rotate_log(log: Path, keep: int = LOGS_KEPT) -> None:
    """Move ``log`` to ``log.1`` (``.1`` to ``.2`` ..., the oldest beyond ``keep`` dropped), so
    a restart does not truncate the log of the crash that caused it."""
    if not log.exists():
        return
    for back in range(keep, 0, -1):
        older = log.with_name(f"{log.name}.{back - 1}") if back > 1 else log
        if older.exists():
            older.replace(log.with_name(f"{log.name}.{back}"))


def _last_error_line(log: Path) -> str:
    """The most telling line of a dead server's log: its last error, else its last line."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    except OSError:
        return "no log"
    lines = [line for line in lines if line]
    for line in reversed(lines):
        if "Error" in line or "error:" in line:
            return line[-300:]
    return lines[-1][-300:] if lines else "empty log"


@dataclass
class TierProcess:
    """One running tier server (vLLM or llama-server). ``start`` → ``wait_ready`` → ``stop``."""

    launch: TierLaunch
    programs: Programs
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.launch.host}:{self.launch.port}"

    def start(self) -> None:
        """Spawn the server in its own process group (so ``stop`` reaches its workers); the
        previous log is kept (``rotate_log``)."""
        check_port_free(self.launch.host, self.launch.port)
        try:
            argv, env = command(self.launch, self.programs, os.environ)
        except EngineMissing as exc:
            raise TierStartError(str(exc)) from None
        if self.launch.slot_dir is not None:
            self.launch.slot_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        rotate_log(self.log_path)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                argv,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_ready(
        self, timeout: float = 300.0, on_tick: Callable[[float], None] | None = None
    ) -> None:
        """Poll ``/health`` until 200; fail fast with the log's last error if the server dies."""
        deadline = time.monotonic() + timeout
        started = time.monotonic()
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                if not self.alive():
                    code = self.process.returncode if self.process else None
                    raise TierStartError(
                        f"tier {self.launch.name} exited during start (code {code}): "
                        f"{_last_error_line(self.log_path)} (log: {self.log_path})"
                    )
                try:
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if on_tick:
                    on_tick(time.monotonic() - started)
                time.sleep(1.0)
        self.stop()
        raise TierStartError(
            f"tier {self.launch.name} not healthy after {timeout:.0f}s (log: {self.log_path})"
        )

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left after ``grace``."""
        if self.process is None:
            return
        pgid = self.process.pid
        _signal_group(pgid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal_group(pgid, signal.SIGKILL)
            self.process.wait(timeout=10)
        # Workers may outlive the API server for a moment; make sure none stays behind.
        deadline = time.monotonic() + grace
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _group_alive(pgid):
            _signal_group(pgid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while _group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.1)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
