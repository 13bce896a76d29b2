"""Keep the tiers running: start them in turn, warm them up, restart a crashed one with backoff.

Decisions are pure (``restart_delay``, ``recent_restarts``, ``next_step``); ``Supervisor`` does
the I/O, one watching thread per tier, so a tier's slow restart holds up no other tier (on a
GPU only the starts themselves take turns: vLLM's memory profiling breaks when two servers
start at once). Each tier's ``TierState`` (backends/tier_state.py) is published through a
callback and ``states()``, so the gateway routes only to ready tiers. ``stop_all`` stops the
watchers first, then every tier's whole process group: no orphans.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from backends.commands import Programs
from backends.launch import TierLaunch
from backends.process import TierProcess, TierStartError
from backends.tier_state import TierState

log = logging.getLogger("model_optimizer.supervisor")


@dataclass(frozen=True)
class RestartPolicy:
    """At most ``max_restarts`` restarts of a tier in any ``window_s`` seconds, each after an
    exponential backoff that counts only the restarts in that window. A serving tier whose
    process lives but whose ``/health`` misses ``health_misses`` probes in a row (one every
    ``health_interval_s``, each given ``health_timeout_s``) is hung: killed and restarted."""

    max_restarts: int = 5
    backoff_initial_s: float = 2.0
    backoff_max_s: float = 60.0
    window_s: float = 600.0
    health_interval_s: float = 5.0
    health_timeout_s: float = 5.0
    health_misses: int = 3


@dataclass
class TierRecord:
    """What the supervisor knows of one tier."""

    launch: TierLaunch
    process: TierProcess
    state: TierState = TierState.DOWN
    restarts: int = 0  # in its lifetime (reported); the cap counts restart_times in the window
    restart_times: list[float] = field(default_factory=list)  # time.monotonic() of each
    misses: int = 0  # /health probes missed in a row while serving
    next_probe: float = 0.0
    down_since: float | None = None
    last_error: str = ""
    history: list[str] = field(default_factory=list)
    # Held while the tier is being started, restarted or replaced: its watcher skips a turn.
    busy: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


def restart_delay(restarts: int, policy: RestartPolicy) -> float:
    """Exponential backoff: initial × 2^restarts (those in the window), capped."""
    return float(min(policy.backoff_max_s, policy.backoff_initial_s * (2**restarts)))


def recent_restarts(times: list[float], now: float, policy: RestartPolicy) -> int:
    """How many of the restarts at ``times`` fall in the last ``window_s`` seconds."""
    return sum(1 for t in times if now - t < policy.window_s)


SERVING = (TierState.READY, TierState.DRAINING, TierState.RESETTING)


def next_step(
    record_state: TierState,
    alive: bool,
    recent: int,
    down_for: float,
    policy: RestartPolicy,
    misses: int = 0,
) -> str:
    """What to do with a tier now: ``nothing``, ``mark_down`` (its process died), ``hung`` (it
    lives but missed ``misses`` health probes in a row), ``restart`` or ``capped`` (its
    ``recent`` restarts, those in the window, reached the cap: wait until one leaves it)."""
    if record_state in SERVING and not alive:
        return "mark_down"
    if record_state in SERVING and misses >= policy.health_misses:
        return "hung"
    if record_state is TierState.DOWN and not alive:
        if recent >= policy.max_restarts:
            return "capped"
        if down_for >= restart_delay(recent, policy):
            return "restart"
    return "nothing"


StateListener = Callable[[str, TierState], None]
WarmUp = Callable[[TierLaunch], None]
Probe = Callable[[TierLaunch, float], bool]


def probe_health(launch: TierLaunch, timeout: float) -> bool:
    """True when the tier's ``/health`` answers 200 within ``timeout`` seconds."""
    try:
        url = f"http://{launch.host}:{launch.port}/health"
        return httpx.get(url, timeout=timeout, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


class Supervisor:
    """Owns the tier processes of one deployment."""

    def __init__(
        self,
        launches: list[TierLaunch],
        programs: Programs,
        log_dir: Path,
        policy: RestartPolicy | None = None,
        warm_up: WarmUp | None = None,
        on_state: StateListener | None = None,
        start_timeout: float = 300.0,
        probe: Probe = probe_health,
        before_start: Callable[[TierLaunch], None] | None = None,
    ) -> None:
        self.policy = policy or RestartPolicy()
        # Called just before a tier's first start, e.g. to release the port held for it.
        self._before_start = before_start
        self._probe = probe
        self.records = {
            launch.name: TierRecord(
                launch, TierProcess(launch, programs, log_dir / f"tier-{launch.name}.log")
            )
            for launch in launches
        }
        self._warm_up = warm_up
        self._on_state = on_state
        self._start_timeout = start_timeout
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._start_turn = threading.Lock()  # GPU tiers start one at a time
        self._watchers: list[threading.Thread] = []

    # -- state -------------------------------------------------------------------------------
    def states(self) -> dict[str, TierState]:
        with self._lock:
            return {name: record.state for name, record in self.records.items()}

    def pids(self) -> dict[str, int]:
        """The root process of each tier that is running (its process group leader)."""
        with self._lock:
            return {
                name: record.process.process.pid
                for name, record in self.records.items()
                if record.process.process is not None and record.process.alive()
            }

    def set_state(self, name: str, state: TierState, note: str = "") -> None:
        with self._lock:
            record = self.records[name]
            if record.state is state:
                return
            record.state = state
            record.down_since = time.monotonic() if state is TierState.DOWN else None
            record.history.append(f"{time.strftime('%H:%M:%S')} {state.value} {note}".strip())
        log.info("tier %s: %s %s", name, state.value, note)
        if self._on_state:
            self._on_state(name, state)

    # -- start -------------------------------------------------------------------------------
    def start_all(self, on_tick: Callable[[str, float], None] | None = None) -> None:
        """Start every tier in turn, each healthy and warm before the next (GPU profiling)."""
        for name in self.records:
            self._start_one(name, on_tick)
        for name in self.records:
            watcher = threading.Thread(
                target=self._watch, args=(name,), name=f"tier-supervisor-{name}", daemon=True
            )
            self._watchers.append(watcher)
            watcher.start()

    def _start_one(self, name: str, on_tick: Callable[[str, float], None] | None = None) -> None:
        record = self.records[name]
        if self._stop.is_set():
            return
        self.set_state(name, TierState.STARTING)
        tick = (lambda elapsed: on_tick(name, elapsed)) if on_tick else None
        turn = self._start_turn if record.launch.device == "cuda" else contextlib.nullcontext()
        try:
            with turn:
                if self._before_start:
                    self._before_start(record.launch)
                record.process.start()
                record.process.wait_ready(self._start_timeout, on_tick=tick)
            if self._warm_up:
                self._warm_up(record.launch)
        except Exception as exc:
            record.process.stop()
            record.last_error = str(exc)
            self.set_state(name, TierState.DOWN, str(exc))
            raise
        self.set_state(name, TierState.READY)

    def replace(self, name: str, launch: TierLaunch) -> None:
        """Serve tier ``name`` from ``launch`` instead (e.g. an emulated copy the admission check
        asked for): stop its process, start the new one, healthy and warm (raises like
        ``start_all``). The restart count is kept; a restart in progress finishes first."""
        record = self.records[name]
        with record.busy:
            with self._lock:
                record.process.stop()
                self.set_state(name, TierState.DOWN, "replaced")
                record.launch = launch
                record.process = TierProcess(
                    launch, record.process.programs, record.process.log_path
                )
            self._start_one(name)

    # -- supervision -------------------------------------------------------------------------
    def _watch(self, name: str, interval: float = 1.0) -> None:
        """One tier's watcher: its restarts block only itself."""
        record = self.records[name]
        while not self._stop.wait(interval):
            if not record.busy.acquire(blocking=False):
                continue  # being replaced
            try:
                self._supervise(name)
            finally:
                record.busy.release()

    def _supervise(self, name: str) -> None:
        record = self.records[name]
        now = time.monotonic()
        alive = record.process.alive()
        if record.state not in SERVING or not alive:
            record.misses = 0
        elif now >= record.next_probe:
            healthy = self._probe(record.launch, self.policy.health_timeout_s)
            record.misses = 0 if healthy else record.misses + 1
            record.next_probe = time.monotonic() + self.policy.health_interval_s
        down_for = now - record.down_since if record.down_since else 0.0
        recent = recent_restarts(record.restart_times, now, self.policy)
        step = next_step(record.state, alive, recent, down_for, self.policy, record.misses)
        if step == "mark_down":
            code = record.process.process.returncode if record.process.process else None
            record.process.stop(grace=5)  # reap its workers too
            self.set_state(name, TierState.DOWN, f"exited with {code}")
        elif step == "hung":
            note = (
                f"hung: /health missed {record.misses} probes in a row "
                f"({self.policy.health_timeout_s:g}s each); killed"
            )
            record.misses = 0
            record.last_error = note
            record.process.stop(grace=5)  # SIGTERM, then SIGKILL to its whole group
            self.set_state(name, TierState.DOWN, note)
        elif step == "restart":
            record.restarts += 1
            record.restart_times = [
                t for t in record.restart_times if now - t < self.policy.window_s
            ]
            record.restart_times.append(now)
            log.warning(
                "tier %s: restart (%d in the last %gs, at most %d)",
                name,
                len(record.restart_times),
                self.policy.window_s,
                self.policy.max_restarts,
            )
            try:
                self._start_one(name)
            except (TierStartError, OSError, RuntimeError) as exc:
                log.error("tier %s: restart failed: %s", name, exc)
        elif step == "capped" and not record.last_error.startswith("restart cap"):
            record.last_error = (
                f"restart cap: {recent} restarts in the last {self.policy.window_s:g}s; the "
                "next waits until the oldest leaves that window"
            )
            log.error("tier %s: %s", name, record.last_error)

    # -- stop --------------------------------------------------------------------------------
    def stop_all(self) -> None:
        """Stop supervising, then stop every tier (process groups, SIGTERM then SIGKILL)."""
        self._stop.set()
        # Stop the processes first: a restart in progress then fails fast instead of waiting.
        for record in self.records.values():
            record.process.stop()
        deadline = time.monotonic() + 60
        for watcher in self._watchers:
            if watcher is not threading.current_thread():
                watcher.join(timeout=max(0.0, deadline - time.monotonic()))
        for name, record in self.records.items():
            record.process.stop()  # anything the monitor started meanwhile
            self.set_state(name, TierState.DOWN, "stopped")
