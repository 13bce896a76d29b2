"""KV-pool resets in quiet windows, led by one gateway replica at a time.

Every replica runs ``ResetCoordinator.run``; each tick it tracks how long traffic across all
replicas (gateway/shared/state.py's per-second counts) has stayed under the policy's
``quiet.max_rps``. Only the holder of the Redis leader lock (gateway/shared/leader.py, with a
fencing token) acts:

1. it picks at most one tier (gateway/control/reset_schedule.py: window, quiet, interval, triggers,
   never a tier whose class would be left with no ready tier, never two at once), or the tier
   an operator asked for (``POST /admin/resets/{tier}``, queued for whichever replica leads;
   one the safety rules refuse is asked again each tick, since what refuses it usually passes:
   another reset under way, a tier restarting; after ``FORCED_PATIENCE`` seconds it is
   recorded as ``refused`` with the reason, so the operator is never left without an answer);
2. marks it ``draining`` in shared state (a tier that is a pool of several endpoints stays in
   routing instead: its endpoints are drained and reset one at a time, never the last ready
   one, gateway/control/pool_resets.py): every replica's router sends its traffic down the
   chain to sibling tiers (the marks expire after ``lock_ttl_seconds`` unless renewed, so a
   leader that dies cannot keep a tier out);
3. waits for the tier's in-flight requests (all replicas) to finish, at most
   ``drain_timeout_seconds``; past that it gives up and puts the tier back;
4. marks it ``resetting``, calls the backends' reset primitive (backends/client.py:
   sleep/wake where supported, else dropping the prefix cache, verified by a probe), warms it
   up, and puts it back in routing;
5. records the outcome (history in shared state, ``gateway_kv_resets_total``, a span).

While it works the lock and the marks are renewed; a leader that loses the lock stops. A new
leader that finds an unfinished reset of an older token records it as ``abandoned`` (its marks
have expired by then, so the tier is back in routing).

Every value read back from shared state (shared with other replicas and operators) is
validated: what is not a mark or a reset record is dropped (logged), never an exception.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial

import anyio
from pydantic import ValidationError

from backends.client import TierClient, TierClientError
from backends.tier_state import TierState
from gateway.control.phase_clock import PhaseClock
from gateway.control.pool_resets import RollSettings, roll_pool
from gateway.control.reset_marks import (
    MARKS,
    MarksPublisher,
    endpoint_marks_value,
    json_object,
)
from gateway.control.reset_records import RECORD, Forced, ForcedQueue, ResetRecord, int_or, number
from gateway.control.reset_schedule import ResetDecision, TierResetState, choose_reset
from gateway.control.tier_signals import still_running
from gateway.control.ttft_drift import TtftDrift
from gateway.runtime import Runtime
from gateway.shared.leader import LeaderLock
from gateway.shared.records import SharedRecords

logger = logging.getLogger(__name__)

CURRENT, HISTORY = "reset:current", "reset:history"
RATE_WINDOW = 10.0  # seconds of traffic behind each quiet check
FORCED_PATIENCE = 120.0  # seconds an operator's refused "reset now" is asked again


class ResetCoordinator:
    """See the module docstring. ``clock`` gives epoch seconds (tests inject it)."""

    def __init__(
        self,
        runtime: Runtime,
        lock: LeaderLock,
        *,
        clock: Callable[[], float] = time.time,
        tick: float = 1.0,
        tier_client: Callable[[str], TierClient] | None = None,
        endpoint_client: Callable[[str, str], TierClient] | None = None,
    ) -> None:
        self.runtime = runtime
        self.lock = lock
        self.records = SharedRecords(runtime.shared)
        self.marks = MarksPublisher(self.records)
        self.queue = ForcedQueue(self.records)
        self._current_unsent: tuple[str, float] | None = None  # CURRENT, if Redis missed it
        self.clock = clock
        self.tick_seconds = tick
        self._tier_client = tier_client or self._default_client
        self._endpoint_client = endpoint_client or self._default_client
        self.quiet_since: float | None = None
        self.last_decision: ResetDecision | None = None
        self.ttft = TtftDrift()
        # One client per tier for the coordinator's life: what it learns once (whether sleep
        # mode exists, from /server_info) is not asked again at every reset.
        self._clients: dict[str, TierClient] = {}

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Tick until cancelled; a failing tick is logged and the loop goes on."""
        while True:
            try:
                await self.tick()
            except Exception:  # one bad tick must not stop resets for good
                logger.exception("reset coordinator tick failed")
            await anyio.sleep(self.tick_seconds)

    async def tick(self) -> ResetDecision | None:
        """One look: track quiet, and if this replica leads, maybe reset one tier."""
        policy = self.runtime.policies.active.policy
        quiet_for = await self._track_quiet(
            policy.resets.quiet.max_rps if policy.resets.quiet else 0
        )
        if self.lock.token() is not None and not self.lock.cut_off:  # still leading through
            await self.marks.repair(policy.resets.lock_ttl_seconds)  # Redis: a missed lift
        queued = await self.queue.next(self.runtime.board.tiers, self.clock())
        unfinished = await self.records.get(CURRENT)  # a leader may have died mid-reset
        if not policy.resets.enabled and queued is None and unfinished is None:
            return None
        token = await self.lock.acquire()
        if token is None:
            if queued is not None:  # not ours to do: put it back for the leader, as it was
                await self.queue.put_back(queued)
            return None
        if not self.lock.cut_off:  # alone, it cannot tell a live leader from a dead one
            await self._close_abandoned(token)
        states = await self._tier_states()
        force = queued.tier if queued is not None else None
        decision = choose_reset(self.clock(), policy, states, quiet_for, force=force)
        if queued is not None and decision.tier is None:
            await self._refused(queued, decision.reason, token)
            # A refused "reset now" waiting its turn does not hold up the schedule.
            decision = choose_reset(self.clock(), policy, states, quiet_for)
        self.last_decision = decision
        if decision.tier is not None:
            await self.reset(decision.tier, decision.reason, token)
        return decision

    async def request(self, tier: str) -> None:
        """Queue an operator's "reset now" for whichever replica leads (once: asking again
        while one for the same tier waits adds nothing)."""
        await self.queue.ask(tier, self.clock())

    async def _refused(self, queued: Forced, reason: str, token: int) -> None:
        """Ask a refused "reset now" again next tick; ``FORCED_PATIENCE`` seconds after its
        first refusal, record why not."""
        now = self.clock()
        first = queued.refused_at if queued.refused_at is not None else now
        if now - first < FORCED_PATIENCE:
            await self.queue.put_back(dataclasses.replace(queued, refused_at=first, bare=False))
            return
        waited = f" (asked {now - queued.asked_at:.0f} s ago, refused for {now - first:.0f} s)"
        record = ResetRecord(queued.tier, now, 0.0, "refused", reason + waited,
                             "forced by an operator", self._holder(), token)  # fmt: skip
        await self.records.push(HISTORY, json.dumps(asdict(record)))
        self.runtime.metrics.reset_refused(queued.tier)
        logger.warning("reset of tier %s: %s%s", queued.tier, reason, waited)

    # ------------------------------------------------------------------ one reset

    async def reset(self, tier: str, reason: str, token: int) -> ResetRecord:
        """Drain, reset, verify and warm up ``tier``; always puts it back in routing."""
        runtime, started, t0 = self.runtime, self.clock(), time.monotonic()
        resets = runtime.policies.active.policy.resets
        span = runtime.tracer.start_span(
            "gateway.reset", attributes={"gateway.reset.tier": tier, "gateway.reset.token": token}
        )
        preemptions = self._preemptions(tier)
        current = {"tier": tier, "token": token, "started_at": started, "leader": self._holder()}
        value, ttl = json.dumps(current), 10 * resets.lock_ttl_seconds
        # Written again while leading if Redis missed it: the record a successor needs to tell
        # that this reset was abandoned, were this replica to die mid-reset.
        self._current_unsent = None if await self.records.put(CURRENT, value, ttl) else (value, ttl)
        outcome, detail = "lost_lock", "leadership lost during the reset"
        phases = PhaseClock()
        try:
            async with anyio.create_task_group() as group:

                async def work() -> None:
                    nonlocal outcome, detail
                    outcome, detail = await self._drain_and_reset(tier, token, phases)
                    group.cancel_scope.cancel()

                group.start_soon(self._keep_leading, tier, token, group.cancel_scope.cancel)
                group.start_soon(work)
        finally:
            with anyio.CancelScope(shield=True):
                self._current_unsent = None
                spent_in = phases.stop()
                await self._mark(tier, None, token)
                await self.records.put(CURRENT, None, ttl=1)
                seconds = time.monotonic() - t0
                record = ResetRecord(
                    tier,
                    started,
                    seconds,
                    outcome,
                    detail,
                    reason,
                    self._holder(),
                    token,
                    preemptions,
                    {name: round(value, 2) for name, value in spent_in.items()},
                )
                await self.records.push(HISTORY, json.dumps(asdict(record)))
                runtime.metrics.reset(tier, outcome, seconds)
                span.set_attributes(
                    {"gateway.reset.outcome": outcome, "gateway.reset.detail": detail}
                    | {f"gateway.reset.{name}_seconds": value for name, value in spent_in.items()}
                )
                span.end()
        log = logger.info if outcome == "ok" else logger.warning
        spent = ", ".join(f"{name} {value:.1f} s" for name, value in spent_in.items())
        log("reset of tier %s: %s in %.1f s (%s)%s", tier, outcome, seconds, detail,
            f" [{spent}]" if spent else "")  # fmt: skip
        return record

    async def _drain_and_reset(self, tier: str, token: int, phases: PhaseClock) -> tuple[str, str]:
        """The reset's work, each phase timed on ``phases``."""
        resets = self.runtime.policies.active.policy.resets
        if len(self.runtime.board.pool(tier)) > 1:  # a pool stays in routing (pool_resets.py)
            return await self._roll(tier, token)
        phases.begin("drain")
        await self._mark(tier, TierState.DRAINING, token)
        # Other replicas see the mark at their next scrape; the count below waits for the rest.
        await anyio.sleep(self.runtime.config.metrics_interval)
        deadline = time.monotonic() + resets.drain_timeout_seconds
        board, shared = self.runtime.board, self.runtime.shared
        while (busy := still_running(await shared.in_flight(), tier, board.metrics(tier))) > 0:
            if time.monotonic() > deadline:
                return "gave_up", f"{busy:g} request(s) still running after the drain timeout"
            await anyio.sleep(0.2)
        phases.begin("reset")
        await self._mark(tier, TierState.RESETTING, token)
        client = self._tier_client(tier)
        try:
            result = await client.reset_kv_pool(verify=True)
            phases.begin("warm_up")
            await client.warm_up(self.runtime.config.model_name, requests=1)
        except TierClientError as exc:
            return "failed", str(exc)
        outcome = "ok" if result.verified else "unverified"
        self.ttft.reset_done(tier, self.clock(), self._ttft_buckets(tier))
        return outcome, result.detail

    async def _roll(self, tier: str, token: int) -> tuple[str, str]:
        """Reset a pool's endpoints one at a time (gateway/control/pool_resets.py)."""
        runtime, resets = self.runtime, self.runtime.policies.active.policy.resets

        async def mark(url: str, state: TierState | None) -> None:
            value = endpoint_marks_value(tier, url, state, token)
            await self.marks.publish(value, ttl=resets.lock_ttl_seconds)
            runtime.board.set_endpoint_state(tier, url, state)

        config = runtime.config
        settings = RollSettings(config.metrics_interval, resets.drain_timeout_seconds,
                                config.model_name)  # fmt: skip
        client = partial(self._endpoint_client, tier)
        outcome, detail = await roll_pool(runtime.board, tier, mark, client, settings)
        if outcome == "ok":
            self.ttft.reset_done(tier, self.clock(), self._ttft_buckets(tier))
        return outcome, detail

    async def _keep_leading(self, tier: str, token: int, stop: Callable[[], None]) -> None:
        """Every scrape interval (a third of the lease at most) renew the lock and write this
        leader's latest marks again (reset_marks.py); stop the reset when leadership is lost."""
        ttl = self.runtime.policies.active.policy.resets.lock_ttl_seconds
        while True:
            await anyio.sleep(min(ttl / 3, self.runtime.config.metrics_interval))
            if not await self.lock.renew():
                stop()
                return
            await self.marks.renew(ttl)
            if self._current_unsent is not None:
                value, current_ttl = self._current_unsent
                if await self.records.put(CURRENT, value, current_ttl):
                    self._current_unsent = None

    async def _mark(self, tier: str, state: TierState | None, token: int) -> None:
        """Publish ``tier``'s state to every replica (``None``: back to normal)."""
        ttl = self.runtime.policies.active.policy.resets.lock_ttl_seconds
        value = None if state is None else json.dumps({tier: state, "token": token})
        await self.marks.publish(value, ttl=ttl)
        self.runtime.board.set_state(tier, state)

    async def _close_abandoned(self, token: int) -> None:
        raw = await self.records.get(CURRENT)
        if raw is None:
            return
        current = json_object(raw)
        if current is None:
            logger.warning("shared %s holds no reset record (%.60r); cleared", CURRENT, raw)
            await self.records.put(CURRENT, None, ttl=1)
            return
        if int_or(current.get("token"), token) >= token:
            return  # our own, or not older
        record = ResetRecord(
            str(current.get("tier")),
            number(current.get("started_at")),
            0.0,
            "abandoned",
            f"leader {current.get('leader')} (token {current.get('token')}) stopped mid-reset",
            "",
            self._holder(),
            int_or(current.get("token"), 0),
        )
        await self.records.push(HISTORY, json.dumps(asdict(record)))
        await self.records.put(CURRENT, None, ttl=1)
        await self.records.put(MARKS, None, ttl=1)
        self.runtime.metrics.reset(record.tier, "abandoned", 0.0)
        logger.warning("reset of tier %s was abandoned by its leader", record.tier)

    # ------------------------------------------------------------------ inputs

    async def _track_quiet(self, max_rps: float) -> float:
        now = self.clock()
        rps = await self.runtime.shared.request_rate(RATE_WINDOW)
        if rps < max_rps:
            self.quiet_since = now if self.quiet_since is None else self.quiet_since
        else:
            self.quiet_since = None
        return 0.0 if self.quiet_since is None else now - self.quiet_since

    async def _tier_states(self) -> list[TierResetState]:
        history = await self.history()
        out = []
        now = self.clock()
        for name, status in self.runtime.board.statuses().items():
            self.ttft.observe(name, now, self._ttft_buckets(name))
            last = next((r for r in history if r.tier == name and r.outcome == "ok"), None)
            out.append(
                TierResetState(
                    name=name,
                    state=status.state,
                    last_reset_at=last.started_at if last else None,
                    preemptions=self._preemptions(name),
                    preemptions_at_last_reset=last.preemptions if last else 0.0,
                    ttft_p90_ms=self.ttft.recent_p90_ms(name),
                    ttft_baseline_p90_ms=self.ttft.baseline_p90_ms(name),
                    classes=status.classes,
                )
            )
        return out

    async def describe(self) -> dict[str, object]:
        """For ``GET /admin/resets``: the schedule, the leader, the current reset, the history."""
        resets = self.runtime.policies.active.policy.resets
        holder, token = await self.lock.current()
        current = await self.records.get(CURRENT)
        since = self.quiet_since
        return {
            "schedule": resets.model_dump(mode="json"),
            "leader": {"holder": holder, "token": token, "this_replica": self.lock.holder},
            "quiet_for_seconds": None if since is None else self.clock() - since,
            "last_decision": self.last_decision.reason if self.last_decision else None,
            "current": json_object(current) if current else None,
            "history": [asdict(record) for record in await self.history()],
        }

    async def history(self, count: int = 50) -> list[ResetRecord]:
        """Newest first; entries that are not reset records are left out."""
        records = []
        for item in await self.records.items(HISTORY, count):
            try:
                records.append(RECORD.validate_json(item))
            except ValidationError:
                logger.debug("shared %s entry is not a reset record: %.60r", HISTORY, item)
        return records

    def _ttft_buckets(self, tier: str) -> tuple[tuple[float, float], ...]:
        metrics = self.runtime.board.metrics(tier)
        return metrics.ttft_buckets if metrics is not None else ()

    def _preemptions(self, tier: str) -> float:
        metrics = self.runtime.board.metrics(tier)
        return metrics.preemptions if metrics is not None else 0.0

    def _holder(self) -> str:
        return self.lock.holder

    def _default_client(self, tier: str, url: str | None = None) -> TierClient:
        """The client of ``tier`` (of its endpoint ``url`` in a pool), kept for reuse."""
        key = url or tier
        if key not in self._clients:
            endpoint = self.runtime.board.tiers[tier]
            model = self.runtime.config.model_name
            client = TierClient(
                url or endpoint.base_url,
                self.runtime.upstream.client,
                model=model,
                api_key=endpoint.api_key,
                engine=endpoint.engine,
            )
            self._clients[key] = client
        return self._clients[key]
