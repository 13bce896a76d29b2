"""The gateway measures its tiers: one replica runs the checks, every replica routes on them.

Every replica runs ``Measurement.run`` (``measurement.enabled`` in the gateway config). Each
tick, every ``measurement.tick_s`` seconds:

1. the leader (the reset coordinator's lock, gateway/shared/leader.py, fencing token) looks
   for due endpoints (gateway/control/measure_due.py: new, restarted, a new variant digest, or
   the schedule in a quiet window: the cross-replica request rate below ``quiet_max_rps`` for
   ``quiet_for_s``), groups them into runs and measures them one run at a time
   (gateway/control/measurement_run.py: measure/'s admission check and speed calibration),
   renewing the lock meanwhile. A run that fails (a tier stops answering, the reference answers
   wrong, a calibration request fails), outlasts ``run_timeout_s`` or loses the lock writes
   nothing; its endpoints wait ``retry_s``. A good run is merged into the shared record
   (gateway/control/figures_record.py) and written with the run's token
   (gateway/shared/fenced.py): a stale leader's write is refused. A replica cut off from its
   Redis does not measure (its peers may lead meanwhile); without Redis each replica leads
   itself and measures for itself.
2. every replica reads the shared record; one that parses and differs from the figures it
   routes on is applied (``apply_record``): the admitted classes to the board, the figures to
   the policy store's ``remeasure`` (derive.py with the serving routes as ``previous``:
   hysteresis), so a route changes only on a significant difference, logged and counted as
   gateway/policy/route_changes.py does. A record that does not parse is logged once; the last
   good figures keep serving.

A tier the live guard withholds from a class (gateway/control/live_guard.py) is measured again
(``withheld``, measure_due.py) and put back in those classes on every replica whose record
shows a passing check of it taken after the withholding; one that fails stays withheld (and
its verdict limits its classes). A replica's guard is its own: the leader re-checks the tiers
its own guard withholds, the others are put back by the next record that covers them.

``up`` hands the figures it measured at start (``GatewayConfig.measured``, ``measured_at``):
they seed the record, so the endpoints they cover are not measured again at start; the leader
writes the seed to Redis once, as its own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio

from backends.tier_state import TierState
from gateway.config import GatewayConfig
from gateway.control.figures_record import EndpointRecord, FiguresRecord, RecordParser, merge
from gateway.control.measure_due import Endpoint, Returns, Schedule, due, plan_runs
from gateway.control.measurement_run import (
    RunFigures,
    RunTarget,
    check_probes,
    measure_run,
)
from gateway.measured import tier_figures
from gateway.policy.route_changes import iso
from gateway.policy.store import PolicyStore
from gateway.runtime import Runtime
from gateway.shared.fenced import FencedValue
from gateway.shared.leader import LeaderLock
from measure.admission import AdmissionProbe

logger = logging.getLogger(__name__)
RECORD_NAME = "measured-figures"  # + the deployment's identity (record_name)
RATE_WINDOW = 10.0  # seconds of traffic behind each quiet check
_AWAY = (TierState.DOWN, TierState.STARTING)  # a restart; not a reset's draining/resetting
Run = Callable[[RunTarget], Awaitable[RunFigures]]


class Measurement:
    """See the module docstring. ``clock`` gives epoch seconds; ``run`` replaces the real
    measurement (tests)."""

    def __init__(
        self,
        runtime: Runtime,
        lock: LeaderLock,
        *,
        clock: Callable[[], float] = time.time,
        run: Run | None = None,
    ) -> None:
        self.runtime, self.lock, self.clock = runtime, lock, clock
        self.settings = runtime.config.measurement
        self.value = FencedValue(runtime.shared, record_name(runtime.config))
        self.parser = RecordParser()
        self.applied: FiguresRecord | None = seed_record(runtime)
        self._seed_unsent = self.applied is not None
        self.returns = Returns()
        self.failed_at: dict[tuple[str, str], float] = {}
        self.quiet_since: float | None = None  # time.monotonic(): immune to clock jumps
        self._run = run or self._measure
        self._probes: list[AdmissionProbe] | None = None
        self.last: str | None = None  # what the last tick did, for /admin/routes
        self.withheld_since: dict[str, float] = {}  # tier -> when this replica's guard withheld it

    async def run(self) -> None:
        """Tick until cancelled; a failing tick is logged and the loop goes on."""
        while True:
            try:
                await self.tick()
            except Exception:
                logger.exception("measurement tick failed")
            await anyio.sleep(self.settings.tick_s)

    async def tick(self) -> list[dict[str, str]]:
        """Follow the shared record, and lead (maybe). Returns the runs measured."""
        done: list[dict[str, str]] = []
        quiet = await self._quiet()
        endpoints = self.endpoints()  # every replica watches returns: a new leader knows them
        token = await self.lock.acquire()
        leads = token is not None and not self.lock.cut_off
        if leads and token is not None and self._seed_unsent and self.applied is not None:
            seed = self.applied.model_copy(update={"token": token})
            self._seed_unsent = not await self.value.write(seed.model_dump_json(), token)
        await self.follow()  # a new leader goes on from what the last one measured
        if leads and token is not None:
            done = await self._lead(token, quiet, endpoints)
        return done

    async def follow(self) -> None:
        """Apply the shared record when it differs from the figures routed on now."""
        record = self.parser.parse(await self.value.read())
        if record is None:
            return
        same = record.same_figures(self.applied)
        self.applied = record
        if not same:
            await apply_record(self.runtime, record)
        self._restore_rechecked(record)

    def _restore_rechecked(self, record: FiguresRecord) -> None:
        """Put back in their classes the withheld tiers ``record`` checked afresh and passed."""
        for tier, since in list(self.withheld_since.items()):
            checked = [e for e in record.endpoints if e.tier == tier and e.at >= since]
            if not checked or not all(e.passed for e in checked):
                continue
            classes = self.runtime.board.guard.restore(tier)
            del self.withheld_since[tier]
            logger.warning(
                "live guard: tier %s back in %s: a fresh check passed (measured by %s at %s)",
                tier, ", ".join(classes) or "its classes", record.replica, iso(checked[-1].at),
            )  # fmt: skip

    # ------------------------------------------------------------------ the leader

    def endpoints(self) -> list[Endpoint]:
        board = self.runtime.board
        out, keep = [], set()
        for tier in board.tiers:
            if not board.guard.classes_withheld(tier):
                self.withheld_since.pop(tier, None)  # restored by hand, or never withheld
            elif tier not in self.withheld_since:
                self.withheld_since[tier] = self.clock()
            withheld_at = self.withheld_since.get(tier)
            for url in board.pool(tier):
                state = board.endpoint_state(tier, url)
                ready, away = state == TierState.READY, state in _AWAY
                back_at = self.returns.observe(tier, url, ready, self.clock(), away)
                digest = self.settings.digests.get(tier, "")
                out.append(Endpoint(tier, url, ready, back_at, digest, withheld_at))
                keep.add((tier, url))
        self.returns.forget_except(keep)
        return out

    async def _lead(
        self, token: int, quiet: bool, endpoints: list[Endpoint]
    ) -> list[dict[str, str]]:
        s = self.settings
        last = self.applied.last_measured() if self.applied is not None else {}
        schedule = Schedule(s.interval_s, s.retry_s, s.max_runs)
        wanted = due(endpoints, last, self.clock(), quiet, schedule, self.failed_at)
        runs = plan_runs(wanted, endpoints, s.reference, s.max_runs)
        reasons = {(d.tier, d.url): d.reason for d in wanted}
        done = []
        for tiers in runs:
            why = ", ".join(f"{t} {reasons.get((t, u), 'alongside')}" for t, u in tiers.items())
            outcome = await self._one_run(tiers, token, why)
            if outcome == "ok":
                done.append(tiers)
            elif outcome != "failed":  # lost_lock, refused: no longer the one to measure
                break
        return done

    async def _one_run(self, tiers: dict[str, str], token: int, why: str) -> str:
        """Measure one run and write it: ok, failed, lost_lock or refused."""
        started = self.clock()
        logger.info("measuring %s (%s)", ", ".join(f"{t} {u}" for t, u in tiers.items()), why)
        outcome, figures = await self._measured_or_failed(tiers)
        if figures is None:
            self._fail(tiers, outcome, started)
            return outcome
        now = self.clock()
        endpoints = [
            EndpointRecord(
                tier=t,
                url=u,
                at=now,
                digest=self.settings.digests.get(t, ""),
                passed=figures.verdicts.get(t, (True, ""))[0],
                verdict=figures.verdicts.get(t, (True, ""))[1],
            )
            for t, u in tiers.items()
        ]
        record = merge(self.applied, reference=self.settings.reference, tiers=figures.tiers,
                       classes=figures.classes, endpoints=endpoints, now=now,
                       replica=self.lock.holder, token=token)  # fmt: skip
        written = self.lock.token() == token and await self.value.write(
            record.model_dump_json(), token
        )
        if not written:
            self._fail(tiers, "refused", started)  # a newer leader wrote, or Redis failed
            return "refused"
        for key in endpoints:
            self.failed_at.pop((key.tier, key.url), None)
        self.applied = record  # this replica routes on it at once (follow() sees it as known)
        await apply_record(self.runtime, record)
        self._restore_rechecked(record)
        self.runtime.metrics.measurement_runs.labels("ok").inc()
        self.last = f"measured {', '.join(tiers)} at {iso(now)} ({why})"
        logger.info("measured %s in %.0f s", ", ".join(tiers), now - started)
        return "ok"

    async def _measured_or_failed(self, tiers: dict[str, str]) -> tuple[str, RunFigures | None]:
        """The run's figures, or why there are none: failed (with the reason logged),
        lost_lock; the lock is renewed while the run goes on."""
        figures: RunFigures | None = None
        outcome, failure = "lost_lock", ""
        target = self._target(tiers)
        try:
            with anyio.fail_after(self.settings.run_timeout_s):
                async with anyio.create_task_group() as group:

                    async def work() -> None:
                        nonlocal figures, outcome, failure
                        try:
                            figures, outcome = await self._run(target), "ok"
                        except Exception as exc:  # RunFailed, or anything a probe's I/O raised
                            outcome, failure = "failed", " ".join(str(exc).split())[:300]
                        group.cancel_scope.cancel()

                    group.start_soon(self._keep_leading, group.cancel_scope.cancel)
                    group.start_soon(work)
        except TimeoutError:
            outcome = "failed"
            failure = f"took over {self.settings.run_timeout_s:g} s: interrupted"
        if outcome != "ok":
            why = failure or "leadership lost during the run"
            logger.warning(
                "measurement of %s: %s; the last figures keep serving", ", ".join(tiers), why
            )
            return outcome, None
        return outcome, figures

    def _target(self, tiers: dict[str, str]) -> RunTarget:
        config = self.runtime.config
        board = self.runtime.board
        emulated = frozenset(t for t, m in config.measured.items() if m.emulated)
        key = next((board.tiers[t].api_key for t in tiers if board.tiers[t].api_key), None)
        engines = {t: board.tiers[t].engine for t in tiers}
        tokenizer = Path(config.tokenizer_dir) if config.tokenizer_dir is not None else None
        return RunTarget(tiers, engines, emulated, key, tokenizer)

    async def _measure(self, target: RunTarget) -> RunFigures:
        probes = self._probes
        if probes is None:
            probes = await anyio.to_thread.run_sync(check_probes, self.settings.probes_path)
            self._probes = probes
        return await measure_run(target, self.settings, probes)

    async def _keep_leading(self, stop: Callable[[], None]) -> None:
        while True:
            await anyio.sleep(self.lock.ttl / 3)
            if not await self.lock.renew():
                stop()
                return

    def _fail(self, tiers: dict[str, str], outcome: str, at: float) -> None:
        for tier, url in tiers.items():
            self.failed_at[(tier, url)] = at
        self.runtime.metrics.measurement_runs.labels(outcome).inc()
        self.last = f"{outcome}: {', '.join(tiers)} at {iso(at)}"

    async def _quiet(self) -> bool:
        rps = await self.runtime.shared.request_rate(RATE_WINDOW)
        now = time.monotonic()
        if rps >= self.settings.quiet_max_rps:
            self.quiet_since = None
            return False
        self.quiet_since = now if self.quiet_since is None else self.quiet_since
        return now - self.quiet_since >= self.settings.quiet_for_s


def record_name(config: GatewayConfig) -> str:
    """The shared record's name: the same for every replica of one deployment (the served
    model and each tier's name and configured pool), another for another stack that shares
    the Redis (two ``up`` runs on other ports do not route on each other's figures)."""
    pools = [(t.name, t.dns or "", t.pool() if t.dns is None else []) for t in config.tiers]
    blob = json.dumps([config.model_name, pools], sort_keys=True).encode()
    return f"{RECORD_NAME}:{hashlib.sha256(blob).hexdigest()[:12]}"


def seed_record(runtime: Runtime) -> FiguresRecord | None:
    """``up``'s figures as the first record (None: nothing measured, or not said when)."""
    config = runtime.config
    if not config.measured or config.measured_at is None or config.reference_tier is None:
        return None
    at = config.measured_at
    digests = config.measurement.digests
    return FiguresRecord(
        written_at=at,
        replica="up",
        token=0,
        reference=config.reference_tier,
        tiers=dict(config.measured),
        classes={t.name: list(t.classes) for t in config.tiers if t.classes is not None},
        endpoints=[
            EndpointRecord(tier=t.name, url=url, at=at, digest=digests.get(t.name, ""))
            for t in config.tiers
            if t.name in config.measured
            for url in t.pool()
        ],
        source="up",
    )


async def apply_record(runtime: Runtime, record: FiguresRecord) -> bool:
    """Route on ``record``: its verdicts to the board, its figures re-derived into routes."""
    board = runtime.board
    for name in board.tiers:
        if name in record.tiers:
            admitted = record.classes.get(name)
            board.set_admitted(name, frozenset(admitted) if admitted is not None else None)
    figures = tier_figures(record.tiers, {t: record.classes.get(t) for t in record.tiers})
    policies = runtime.policies
    if not isinstance(policies, PolicyStore):
        return False
    why = f"figures measured by {record.replica} at {iso(record.written_at)}"
    return await policies.remeasure(figures, record.reference, why)


def describe(measurement: Measurement | None) -> dict[str, object] | None:
    """For ``GET /admin/routes``: when and by whom the figures served were measured."""
    if measurement is None:
        return None
    record = measurement.applied
    endpoints: Sequence[EndpointRecord] = record.endpoints if record is not None else ()
    return {
        "written_at": iso(record.written_at) if record is not None else None,
        "replica": record.replica if record is not None else None,
        "token": record.token if record is not None else None,
        "source": record.source if record is not None else None,
        "endpoints": [e.model_dump(mode="json") | {"at": iso(e.at)} for e in endpoints],
        "last": measurement.last,
    }
