"""Keep the tiers running: start them in turn, warm them up, restart a crashed one with backoff.

Decisions are pure (``restart_delay``, ``next_step``); ``Supervisor`` does the I/O. Each
tier's ``TierState`` (backends/tier_state.py) is published through a callback and ``states()``,
so the gateway routes only to ready tiers. ``stop_all`` stops the monitor first, then every
tier's whole process group: no orphans.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from backends.process import TierProcess, TierStartError
from backends.tier_state import TierState
from backends.vllm_args import TierLaunch

log = logging.getLogger("model_optimizer.supervisor")


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 5
    backoff_initial_s: float = 2.0
    backoff_max_s: float = 60.0


@dataclass
class TierRecord:
    """What the supervisor knows of one tier."""

    launch: TierLaunch
    process: TierProcess
    state: TierState = TierState.DOWN
    restarts: int = 0
    down_since: float | None = None
    last_error: str = ""
    history: list[str] = field(default_factory=list)


def restart_delay(restarts: int, policy: RestartPolicy) -> float:
    """Exponential backoff: initial × 2^restarts, capped."""
    return float(min(policy.backoff_max_s, policy.backoff_initial_s * (2**restarts)))


def next_step(
    record_state: TierState, alive: bool, restarts: int, down_for: float, policy: RestartPolicy
) -> str:
    """What to do with a tier now: ``nothing``, ``mark_down``, ``restart`` or ``give_up``."""
    if record_state in (TierState.READY, TierState.DRAINING, TierState.RESETTING) and not alive:
        return "mark_down"
    if record_state is TierState.DOWN and not alive:
        if restarts >= policy.max_restarts:
            return "give_up"
        if down_for >= restart_delay(restarts, policy):
            return "restart"
    return "nothing"


StateListener = Callable[[str, TierState], None]
WarmUp = Callable[[TierLaunch], None]


class Supervisor:
    """Owns the tier processes of one deployment."""

    def __init__(
        self,
        launches: list[TierLaunch],
        python: Path,
        log_dir: Path,
        policy: RestartPolicy | None = None,
        warm_up: WarmUp | None = None,
        on_state: StateListener | None = None,
        start_timeout: float = 300.0,
    ) -> None:
        self.policy = policy or RestartPolicy()
        self.records = {
            launch.name: TierRecord(
                launch, TierProcess(launch, python, log_dir / f"tier-{launch.name}.log")
            )
            for launch in launches
        }
        self._warm_up = warm_up
        self._on_state = on_state
        self._start_timeout = start_timeout
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._monitor: threading.Thread | None = None

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
        self._monitor = threading.Thread(target=self._watch, name="tier-supervisor", daemon=True)
        self._monitor.start()

    def _start_one(self, name: str, on_tick: Callable[[str, float], None] | None = None) -> None:
        record = self.records[name]
        if self._stop.is_set():
            return
        self.set_state(name, TierState.STARTING)
        tick = (lambda elapsed: on_tick(name, elapsed)) if on_tick else None
        try:
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
        ``start_all``). The restart count is kept."""
        with self._lock:
            record = self.records[name]
            record.process.stop()
            self.set_state(name, TierState.DOWN, "replaced")
            record.launch = launch
            record.process = TierProcess(launch, record.process.python, record.process.log_path)
        self._start_one(name)

    # -- supervision -------------------------------------------------------------------------
    def _watch(self, interval: float = 1.0) -> None:
        while not self._stop.wait(interval):
            for name in list(self.records):
                if self._stop.is_set():
                    return
                self._supervise(name)

    def _supervise(self, name: str) -> None:
        record = self.records[name]
        down_for = time.monotonic() - record.down_since if record.down_since else 0.0
        step = next_step(
            record.state, record.process.alive(), record.restarts, down_for, self.policy
        )
        if step == "mark_down":
            code = record.process.process.returncode if record.process.process else None
            record.process.stop(grace=5)  # reap its workers too
            self.set_state(name, TierState.DOWN, f"exited with {code}")
        elif step == "restart":
            record.restarts += 1
            log.warning("tier %s: restart %d/%d", name, record.restarts, self.policy.max_restarts)
            try:
                self._start_one(name)
            except (TierStartError, OSError, RuntimeError) as exc:
                log.error("tier %s: restart failed: %s", name, exc)
        elif step == "give_up" and "gave up" not in record.last_error:
            record.last_error = f"gave up after {record.restarts} restarts"
            log.error("tier %s: %s", name, record.last_error)

    # -- stop --------------------------------------------------------------------------------
    def stop_all(self) -> None:
        """Stop supervising, then stop every tier (process groups, SIGTERM then SIGKILL)."""
        self._stop.set()
        # Stop the processes first: a restart in progress then fails fast instead of waiting.
        for record in self.records.values():
            record.process.stop()
        if self._monitor and self._monitor is not threading.current_thread():
            self._monitor.join(timeout=60)
        for name, record in self.records.items():
            record.process.stop()  # anything the monitor started meanwhile
            self.set_state(name, TierState.DOWN, "stopped")
