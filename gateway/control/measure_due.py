"""Which endpoints the gateway measures now, and how the runs are made of them (pure).

The leading replica (gateway/control/measurement.py) measures every endpoint of every tier's
pool: the in-engine admission check (measure/admission_run.py) and the speed calibration
(measure/speed.py). An endpoint is due:

- ``new``: never measured (the gateway's start, a new pod in a ``dns`` pool);
- ``restarted``: it came back to ready after being away (a supervisor restart, a crashed
  server) since it was measured (``back_at``, seen by every replica's own scrapes: a leader
  that takes over sees no return it did not watch, so it does not measure everything again);
- ``new variant``: the variant digest it serves changed;
- ``withheld``: the live guard (gateway/control/live_guard.py) withheld its tier from a class
  since it was measured (its shadow agreement or its escalations fell below a floor), or its
  last check did not put it back and ``retry`` seconds have passed: a fresh check, which puts
  the tier back where it passes (gateway/control/measurement.py);
- ``schedule``: measured ``interval`` seconds ago or more, and the traffic is quiet.
  A record whose time lies ahead of ``now`` by more than ``CLOCK_SLACK`` (the clock went back)
  is treated as old: it is re-measured at the next quiet window, never trusted for ever.

The first four do not wait for quiet (routes on figures of a pod that is gone are worse than
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
    back_at: float | None = None  # when it last came back to ready after being away
    digest: str = ""  # the variant it serves ("" unknown)
    withheld_at: float | None = None  # when the live guard withheld its tier from a class


@dataclass(frozen=True)
class Measured:
    """When an endpoint was last measured, and what it was then."""

    tier: str
    url: str
    at: float  # epoch seconds
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
        reason = _reason(e, last.get(key), now, quiet, schedule)
        if reason is not None:
            out.append(Due(e.tier, e.url, reason))
    return out


def _reason(
    e: Endpoint, record: Measured | None, now: float, quiet: bool, schedule: Schedule
) -> str | None:
    if record is None:
        return "new"
    if e.back_at is not None and e.back_at > record.at:
        return "restarted"
    if e.digest and record.digest != e.digest:
        return "new variant"
    if e.withheld_at is not None and (
        e.withheld_at > record.at or now - record.at >= schedule.retry
    ):
        return "withheld"
    if not quiet:
        return None
    age = now - record.at
    if age < -CLOCK_SLACK:
        return "schedule (measured in the future: the clock went back)"
    if age >= schedule.interval:
        return "schedule"
    return None


def plan_runs(
    wanted: Sequence[Due],
    endpoints: Sequence[Endpoint],
    reference: str,
    max_runs: int,
) -> list[dict[str, str]]:
    """Runs (tier -> url) of one ready endpoint of every tier, the due ones first (a pool's due
    endpoints go to successive runs, the other tiers lending a ready endpoint each): every
    run measures all tiers together, so the figures a route is derived from are always paired
    by prompt under one load (gateway/policy/confidence.py). Nothing can be judged without a
    ready reference endpoint: then no run at all."""
    ready: dict[str, list[str]] = {}
    for e in endpoints:
        if e.ready:
            ready.setdefault(e.tier, []).append(e.url)
    if reference not in ready or max_runs <= 0:
        return []
    queues: dict[str, list[str]] = {}
    for d in wanted:
        if d.url in ready.get(d.tier, []):
            queues.setdefault(d.tier, []).append(d.url)
    runs: list[dict[str, str]] = []
    while any(queues.values()) and len(runs) < max_runs:
        run = {}
        for tier, urls in ready.items():
            queue = queues.get(tier) or []
            run[tier] = queue.pop(0) if queue else urls[len(runs) % len(urls)]
        runs.append(run)
    return runs


class Returns:
    """When each endpoint last came back to ready after being seen away (down or starting: a
    restart; a reset's draining and resetting are not away, the server kept running), fed
    with what the board says at each look, on every replica."""

    def __init__(self) -> None:
        self._away: dict[Key, bool] = {}
        self._back_at: dict[Key, float] = {}

    def observe(
        self, tier: str, url: str, ready: bool, now: float, away: bool | None = None
    ) -> float | None:
        """``away`` (default: not ``ready``): the endpoint is down or starting."""
        key = (tier, url)
        if away if away is not None else not ready:
            self._away[key] = True
        elif ready:
            if self._away.get(key):
                self._back_at[key] = now
            self._away[key] = False
        return self._back_at.get(key)

    def forget_except(self, keep: set[Key]) -> None:
        """Drop endpoints that left their pool (one that comes back later is new)."""
        for key in [k for k in self._away if k not in keep]:
            self._away.pop(key, None)
            self._back_at.pop(key, None)
