"""Which endpoints the gateway measures now, and how the runs are made of them (pure).

The leading replica (gateway/control/measurement.py) measures every endpoint of every tier's
pool: the in-engine admission check (measure/admission_run.py) and the speed calibration
(measure/speed.py). An endpoint is due:

- ``new``: never measured (the gateway's start, a new pod in a ``dns`` pool);
- ``restarted``: its ``generation`` moved (it left ready and came back: a supervisor restart,
  a crashed server) since it was measured;
- ``new variant``: the variant digest it serves changed;
- ``schedule``: measured ``interval`` seconds ago or more, and the traffic is quiet.
  A record whose time lies ahead of ``now`` by more than ``CLOCK_SLACK`` (the clock went back)
  is treated as old: it is re-measured at the next quiet window, never trusted for ever.

The first three do not wait for quiet (routes on figures of a pod that is gone are worse than
figures taken under some load); the schedule does. An endpoint that is not ready is never due;
one whose run failed waits ``retry`` seconds before it is due again (``failed_at``).

``plan_runs`` groups the due endpoints into runs: one endpoint per tier and always one ready
endpoint of the reference tier (the check judges against it, the calibration pairs prompts
across the tiers of one run), at most ``max_runs`` per pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

CLOCK_SLACK = 60.0  # seconds a record may lie in the future before the clock is doubted


@dataclass(frozen=True)
class Endpoint:
    """One endpoint of a tier's pool as the gateway sees it now."""

    tier: str
    url: str
    ready: bool = True
    generation: int = 0  # times it came back to ready after being away
    digest: str = ""  # the variant it serves ("" unknown)


@dataclass(frozen=True)
class Measured:
    """When an endpoint was last measured, and what it was then."""

    tier: str
    url: str
    at: float  # epoch seconds
    generation: int = 0
    digest: str = ""


@dataclass(frozen=True)
class Schedule:
    interval: float  # seconds between scheduled measurements of one endpoint
    retry: float  # seconds after a failed run before its endpoints are due again
    max_runs: int  # runs per pass


@dataclass(frozen=True)
class Due:
    tier: str
    url: str
    reason: str


Key = tuple[str, str]  # (tier, url)


def due(
    endpoints: Sequence[Endpoint],
    last: Mapping[Key, Measured],
    now: float,
    quiet: bool,
    schedule: Schedule,
    failed_at: Mapping[Key, float] | None = None,
) -> list[Due]:
    """The endpoints to measure now, in the order given (see the module docstring)."""
    failed = failed_at or {}
    out = []
    for e in endpoints:
        key = (e.tier, e.url)
        if not e.ready:
            continue
        failure = failed.get(key)
        if failure is not None and 0 <= now - failure < schedule.retry:
            continue
        reason = _reason(e, last.get(key), now, quiet, schedule.interval)
        if reason is not None:
            out.append(Due(e.tier, e.url, reason))
    return out


def _reason(
    e: Endpoint, record: Measured | None, now: float, quiet: bool, interval: float
) -> str | None:
    if record is None:
        return "new"
    if record.generation != e.generation:
        return "restarted"
    if e.digest and record.digest != e.digest:
        return "new variant"
    if not quiet:
        return None
    age = now - record.at
    if age < -CLOCK_SLACK:
        return "schedule (measured in the future: the clock went back)"
    if age >= interval:
        return "schedule"
    return None


def plan_runs(
    wanted: Sequence[Due],
    endpoints: Sequence[Endpoint],
    reference: str,
    max_runs: int,
) -> list[dict[str, str]]:
    """Runs (tier -> url), each with one ready reference endpoint and at most one endpoint of
    every other tier; the due endpoints of one tier go to successive runs. Nothing can be
    judged without a ready reference endpoint: then no run at all."""
    ready_refs = [e.url for e in endpoints if e.tier == reference and e.ready]
    if not ready_refs or max_runs <= 0:
        return []
    queues: dict[str, list[str]] = {}
    for d in wanted:
        queues.setdefault(d.tier, []).append(d.url)
    runs: list[dict[str, str]] = []
    while any(queues.values()) and len(runs) < max_runs:
        run: dict[str, str] = {}
        refs = queues.get(reference) or []
        run[reference] = refs.pop(0) if refs else ready_refs[len(runs) % len(ready_refs)]
        for tier, urls in queues.items():
            if tier != reference and urls:
                run[tier] = urls.pop(0)
        runs.append(run)
    return runs


class Generations:
    """Counts, per endpoint, the times it came back to ready after being seen away (pure
    state fed with what the board says at each look)."""

    def __init__(self) -> None:
        self._ready: dict[Key, bool] = {}
        self._generation: dict[Key, int] = {}

    def observe(self, tier: str, url: str, ready: bool) -> int:
        key = (tier, url)
        before = self._ready.get(key)
        if before is False and ready:
            self._generation[key] = self._generation.get(key, 0) + 1
        self._ready[key] = ready
        return self._generation.get(key, 0)

    def forget_except(self, keep: set[Key]) -> None:
        """Drop endpoints that left their pool (a pod that comes back later is new)."""
        for key in [k for k in self._ready if k not in keep]:
            self._ready.pop(key, None)
            self._generation.pop(key, None)
