"""ResetCoordinator over a real gateway runtime (stub tiers, local state, injected time)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from backends.client import ResetResult, TierClientError
from backends.process import free_port
from backends.tier_state import TierState
from gateway.app import create_app
from gateway.config import GatewayConfig, TierEndpoint
from gateway.control.reset_marks import MARKS, MarksPublisher, apply_shared_marks, parse_marks
from gateway.control.reset_records import OLDER_REQUESTS, REQUESTS
from gateway.control.resets import CURRENT, FORCED_PATIENCE, HISTORY, ResetCoordinator
from gateway.runtime import Runtime
from gateway.shared.leader import LeaderLock
from gateway.shared.records import SharedRecords
from model_optimizer.envs import ROOT

NIGHT = datetime(2026, 12, 2, 3, 0, tzinfo=UTC).timestamp()  # inside 02:00-05:00 UTC
NOON = datetime(2026, 12, 2, 12, 0, tzinfo=UTC).timestamp()


class FakeTier:
    """Stands in for backends.client.TierClient: records calls, answers as told."""

    def __init__(self, log: list[str], fail: bool = False) -> None:
        self.log, self.fail = log, fail

    async def reset_kv_pool(self, verify: bool = True) -> ResetResult:
        self.log.append("reset")
        if self.fail:
            raise TierClientError("POST /reset_prefix_cache: 500")
        return ResetResult("reset_prefix_cache", True, 0.01, "probe: 0 hits after")

    async def warm_up(self, model: str | None = None, requests: int = 2) -> None:
        self.log.append("warm_up")


def _policy(tmp_path: Path, **resets: Any) -> Path:
    text = (ROOT / "policies" / "routing.yaml").read_text()
    path = tmp_path / "routing.yaml"
    path.write_text(text)
    if resets:
        import yaml

        data = yaml.safe_load(text)
        data["resets"].update(resets)
        path.write_text(yaml.safe_dump(data))
    return path


def _with_coordinator(
    stub_urls: list[str],
    policy: Path,
    scenario: Any,
    clock: list[float],
    fail: bool = False,
) -> tuple[Any, list[str]]:
    tiers = [
        TierEndpoint(name=name, base_url=url)
        for name, url in zip(("fp16", "int8", "int4"), stub_urls, strict=True)
    ]
    config = GatewayConfig(
        model_name="stub-model",
        tiers=tiers,
        policy_path=str(policy),
        watch_policy=False,
        metrics_interval=0.05,
    )
    app = create_app(config)
    calls: list[str] = []

    async def main() -> Any:
        async with app.router.lifespan_context(app):
            runtime: Runtime = app.state.runtime

            async def idle() -> None:
                return None

            # The app's own coordinator (real clock, its own local lock) would race this one
            # for the queue of "reset now" requests: it sits out the scenario.
            app.state.resets.tick = idle
            lock = LeaderLock(None, "test:leader", ttl=30.0)
            await lock.start()
            coordinator = ResetCoordinator(
                runtime,
                lock,
                clock=lambda: clock[0],
                tier_client=lambda name: FakeTier(calls, fail),  # type: ignore[arg-type,return-value]
            )
            return await scenario(coordinator, runtime)

    return asyncio.run(main()), calls


@pytest.fixture
def three_stubs(make_stub: Any) -> list[str]:
    return [make_stub().url for _ in range(3)]


def test_no_reset_outside_the_window(three_stubs: list[str], tmp_path: Path) -> None:
    async def scenario(coordinator: ResetCoordinator, runtime: Runtime) -> Any:
        return await coordinator.tick()

    decision, calls = _with_coordinator(three_stubs, _policy(tmp_path), scenario, [NOON])
    assert decision.tier is None
    assert "window" in decision.reason
    assert calls == []


def test_no_reset_while_traffic_is_above_the_quiet_threshold(
    three_stubs: list[str], tmp_path: Path
) -> None:
    async def scenario(coordinator: ResetCoordinator, runtime: Runtime) -> Any:
        for _ in range(50):  # 50 requests in the last seconds: 5 rps over the 10 s window
            await runtime.shared.begin("fp16")
            await runtime.shared.end("fp16")
        return await coordinator.tick()

    decision, calls = _with_coordinator(three_stubs, _policy(tmp_path), scenario, [NIGHT])
    assert decision.tier is None
    assert calls == []


def test_window_and_quiet_reset_the_oldest_tier_and_record_it(
    three_stubs: list[str], tmp_path: Path
) -> None:
    policy = _policy(tmp_path, quiet={"max_rps": 0.5, "for_seconds": 60})
    clock = [NIGHT]

    async def scenario(coordinator: ResetCoordinator, runtime: Runtime) -> Any:
        first = await coordinator.tick()  # quiet starts being tracked now
        clock[0] += 61
        second = await coordinator.tick()
        states = [s.state for s in runtime.board.statuses().values()]
        return first, second, await coordinator.history(), states

    (first, second, history, states), calls = _with_coordinator(
        three_stubs, policy, scenario, clock
    )
    assert first.tier is None and "rps" in first.reason
    assert second.tier == "fp16"  # never reset, first in the policy's tiers
    assert calls == ["reset", "warm_up"]
    assert [(r.tier, r.outcome) for r in history] == [("fp16", "ok")]
    # Where the time went: the drain waits at least one scrape interval (0.05 s here).
    assert list(history[0].phases) == ["drain", "reset", "warm_up"]
    assert history[0].phases["drain"] >= 0.05
    assert sum(history[0].phases.values()) <= history[0].seconds + 0.02
    assert states == ["ready", "ready", "ready"]  # back in routing afterwards


def test_reset_now_skips_the_window_and_marks_the_tier_meanwhile(
    three_stubs: list[str], tmp_path: Path
) -> None:
    seen: list[str] = []
    published: list[str | None] = []  # the marks, as other replicas read them from Redis

    async def scenario(coordinator: ResetCoordinator, runtime: Runtime) -> Any:
        # Every state the board is given for int8, recorded as it is set (a polling
        # watcher missed a short draining phase on a loaded machine).
        set_state, put = runtime.board.set_state, coordinator.records.put

        def recording(name: str, state: TierState | None) -> None:
            set_state(name, state)
            if name == "int8":
                seen.append(runtime.board.state("int8"))

        async def publishing(name: str, value: str | None, ttl: float) -> bool:
            if name == MARKS and (not published or published[-1] != value):
                published.append(value)  # a renewal writes the same value again
            return await put(name, value, ttl)

        runtime.board.set_state = recording  # type: ignore[method-assign]
        coordinator.records.put = publishing  # type: ignore[method-assign]
        await coordinator.request("int8")
        decision = await coordinator.tick()
        seen.append(runtime.board.state("int8"))
        return decision, await SharedRecords(runtime.shared).get(MARKS)

    (decision, marks), calls = _with_coordinator(three_stubs, _policy(tmp_path), scenario, [NOON])
    assert decision.tier == "int8"
    assert "draining" in seen and "resetting" in seen
    assert seen[-1] == "ready"
    assert marks is None
    token = json.loads(published[0] or "{}")["token"]
    assert published == [
        f'{{"int8": "draining", "token": {token}}}',
        f'{{"int8": "resetting", "token": {token}}}',
        None,
    ]
    assert calls == ["reset", "warm_up"]


def test_a_failing_reset_is_recorded_and_the_tier_comes_back(
    three_stubs: list[str], tmp_path: Path
) -> None:
    async def scenario(coordinator: ResetCoordinator, runtime: Runtime) -> Any:
        await coordinator.request("int4")
        await coordinator.tick()
        return await coordinator.history(), runtime.board.state("int4")

    (history, state), _ = _with_coordinator(
        three_stubs, _policy(tmp_path), scenario, [NOON], fail=True
    )
    assert (history[0].tier, history[0].outcome) == ("int4", "failed")
    assert "500" in history[0].detail
    assert list(history[0].phases) == ["drain", "reset"]  # it stopped in the reset phase
    assert state == "ready"


def test_an_unfinished_reset_of_an_older_leader_is_recorded_as_abandoned(
    three_stubs: list[str], tmp_path: Path
) -> None:
    async def scenario(coordinator: ResetCoordinator, runtime: Runtime) -> Any:
        records = SharedRecords(runtime.shared)
        dead = {"tier": "fp16", "token": 0, "started_at": NOON - 5, "leader": "gone"}
        await records.put("reset:current", json.dumps(dead), ttl=60)
        await records.put(MARKS, json.dumps({"fp16": "draining", "token": 0}), ttl=60)
        await coordinator.tick()
        await apply_shared_marks(runtime.board, records, runtime.policies.active.policy)
        return [json.loads(x) for x in await records.items(HISTORY)], runtime.board.state("fp16")

    (history, state), calls = _with_coordinator(three_stubs, _policy(tmp_path), scenario, [NOON])
    assert [(r["tier"], r["outcome"]) for r in history] == [("fp16", "abandoned")]
    assert state == "ready"
    assert calls == []


def test_marks_parse_leniently() -> None:
    marks = parse_marks(json.dumps({"int8": "draining", "token": 4}))
    assert marks == {"int8": TierState.DRAINING} and marks["int8"] is TierState.DRAINING
    assert parse_marks(json.dumps({"int8": "asleep", "fp16": ["draining"], "int4": "down"})) == {
        "int4": TierState.DOWN
    }  # values that are not tier states are dropped
    assert parse_marks(None) == {} and parse_marks("not json") == {}


@pytest.mark.parametrize("raw", ["5", '"draining"', '[["int8", "draining"]]', "null", "true"])
def test_marks_that_are_not_an_object_are_no_marks(raw: str) -> None:
    # Writing 5 to the marks key raised AttributeError in every replica's scrape loop.
    assert parse_marks(raw) == {}


def test_garbage_in_the_shared_reset_values_is_dropped_not_fatal(
    three_stubs: list[str], tmp_path: Path
) -> None:
    good = {
        "tier": "int8",
        "started_at": NOON - 60,
        "seconds": 1.0,
        "outcome": "ok",
        "detail": "",
        "reason": "",
        "leader": "x",
        "token": 1,
    }

    async def scenario(coordinator: ResetCoordinator, runtime: Runtime) -> Any:
        records = SharedRecords(runtime.shared)
        await records.put(MARKS, "5", ttl=60)
        await records.put(CURRENT, '["not", "a", "reset"]', ttl=60)
        await records.push(HISTORY, json.dumps(good))
        for bad in ("5", "not json", '{"tier": "fp16"}', json.dumps({**good, "started_at": "x"})):
            await records.push(HISTORY, bad)
        policy = runtime.policies.active.policy
        await apply_shared_marks(runtime.board, records, policy)  # the scrape loop's step
        decision = await coordinator.tick()
        described = await coordinator.describe()
        return decision, await coordinator.history(), described, await records.get(CURRENT)

    (decision, history, described, current), calls = _with_coordinator(
        three_stubs, _policy(tmp_path), scenario, [NOON]
    )
    assert decision is not None and decision.tier is None
    assert [(r.tier, r.outcome) for r in history] == [("int8", "ok")]
    assert [entry["tier"] for entry in described["history"]] == ["int8"]
    assert current is None  # the unreadable record of a reset under way is cleared
    assert calls == []


def test_admin_resets_queue_and_describe(
    three_stubs: list[str], tmp_path: Path, start_gateway: Any, client: httpx.Client
) -> None:
    from gateway.config import hash_key

    gateway = start_gateway(*three_stubs, admin_key_hashes=[hash_key("k")])
    auth = {"Authorization": "Bearer k"}
    described = client.get(f"{gateway}/admin/resets", headers=auth).json()
    assert described["history"] == [] and described["current"] is None
    assert "enabled" in described["schedule"]
    assert client.post(f"{gateway}/admin/resets/t9", headers=auth).status_code == 404


def test_the_coordinators_own_tier_client_sends_the_tiers_key(
    make_stub: Any, tmp_path: Path
) -> None:
    """Resets reach the tier guard's routes (backends/tier_guard.py) with the tier's key."""
    stubs = [make_stub() for _ in range(3)]
    tiers = [
        TierEndpoint(name=name, base_url=stub.url, api_key=f"key-{name}")
        for name, stub in zip(("fp16", "int8", "int4"), stubs, strict=True)
    ]
    config = GatewayConfig(
        model_name="stub-model", tiers=tiers, policy_path=str(_policy(tmp_path)), watch_policy=False
    )
    app = create_app(config)

    async def main() -> None:
        async with app.router.lifespan_context(app):
            runtime: Runtime = app.state.runtime
            coordinator = ResetCoordinator(runtime, LeaderLock(None, "test:leader", ttl=30.0))
            await coordinator._tier_client("int8").warm_up("stub-model", requests=1)

    asyncio.run(main())
    assert stubs[1].last_request["headers"]["authorization"] == "Bearer key-int8"


class MissingRecords(SharedRecords):
    """Shared records that miss the next ``missed`` writes of the marks (a Redis timeout on a
    loaded machine leaves them local)."""

    def __init__(self, inner: SharedRecords, missed: int) -> None:
        super().__init__(inner._state)
        self.missed = missed

    async def put(self, name: str, value: str | None, ttl: float) -> bool:
        if name == MARKS and self.missed:
            self.missed -= 1
            return False
        return await super().put(name, value, ttl)


def test_the_leaders_renewal_repairs_a_missed_mark_and_never_brings_back_an_old_one(
    three_stubs: list[str], tmp_path: Path
) -> None:
    """Seen on an AVX2 EPYC: the other gateway saw a pool's first endpoint out of routing again
    while the second was being reset. A renewal that read the marks and wrote them back put an
    old mark back; a renewal that only extended the expiry kept an old mark whose lift Redis had
    missed. The leader writes its own latest value again instead."""
    before = json.dumps({"endpoints": {"int4": {"http://a": "resetting"}}, "token": 1})
    after = json.dumps({"endpoints": {"int4": {"http://b": "draining"}}, "token": 1})

    async def scenario(coordinator: ResetCoordinator, runtime: Runtime) -> Any:
        records = MissingRecords(coordinator.records, missed=2)
        coordinator.marks = MarksPublisher(records)
        await records.put(MARKS, before, ttl=30)  # in Redis; the lift and the next mark missed
        await coordinator.marks.publish(None, ttl=30)
        await coordinator.marks.publish(after, ttl=30)
        await coordinator.lock.acquire()
        stopped: list[bool] = []
        with anyio.move_on_after(0.5):  # renewals every scrape interval (0.05 s here)
            await coordinator._keep_leading("int4", 1, lambda: stopped.append(True))
        return await records.get(MARKS), stopped

    policy = _policy(tmp_path, lock_ttl_seconds=0.3)
    (marks, stopped), _ = _with_coordinator(three_stubs, policy, scenario, [NOON])
    assert not stopped
    assert marks == after


def test_the_leaders_renewal_writes_a_missed_current_record_again(
    three_stubs: list[str], tmp_path: Path
) -> None:
    """Seen on an AMX Xeon: the record of a reset in progress stayed local (the process stalled
    past op_timeout), so when the leader died mid-reset its successor found nothing to call
    abandoned. The leader writes it again at its next renewal."""
    record = json.dumps({"tier": "int4", "token": 1, "started_at": 0.0, "leader": "a"})

    async def scenario(coordinator: ResetCoordinator, runtime: Runtime) -> Any:
        coordinator._current_unsent = (record, 30.0)  # what a put that stayed local leaves
        await coordinator.lock.acquire()
        with anyio.move_on_after(0.5):  # renewals every scrape interval (0.05 s here)
            await coordinator._keep_leading("int4", 1, lambda: None)
        return await coordinator.records.get(CURRENT), coordinator._current_unsent

    policy = _policy(tmp_path, lock_ttl_seconds=0.3)
    (current, unsent), _ = _with_coordinator(three_stubs, policy, scenario, [NOON])
    assert current == record
    assert unsent is None


def test_a_replica_cut_off_from_redis_never_repairs_its_marks_over_a_live_leaders(
    three_stubs: list[str], tmp_path: Path
) -> None:
    """Its last lift stayed local; while it leads alone (its local lease), the marks in Redis
    are another leader's: writing its own again would wipe them."""

    async def scenario(coordinator: ResetCoordinator, runtime: Runtime) -> Any:
        records = MissingRecords(coordinator.records, missed=1)
        coordinator.marks = MarksPublisher(records)
        await coordinator.marks.publish(None, ttl=30)  # missed: stale
        lock = LeaderLock(f"redis://127.0.0.1:{free_port()}/0", "test:leader", ttl=30.0,
                          op_timeout=0.2)  # fmt: skip
        await lock.start()
        await lock.acquire()  # leads alone
        coordinator.lock = lock
        live = json.dumps({"int4": "draining", "token": 7})
        await records.put(MARKS, live, ttl=30)  # the live leader's mark (as this replica sees it)
        await coordinator.tick()
        cut_off = lock.cut_off
        await lock.aclose()
        return cut_off, await records.get(MARKS), live

    (cut_off, marks, live), _ = _with_coordinator(three_stubs, _policy(tmp_path), scenario, [NOON])
    assert cut_off
    assert marks == live


def test_a_replica_cut_off_from_redis_never_calls_a_live_leaders_reset_abandoned(
    three_stubs: list[str], tmp_path: Path
) -> None:
    """Cut off from Redis, a replica leads alone (gateway/shared/leader.py) and still sees the
    reset under way as it last read it: it cannot tell a live leader from a dead one, so it
    leaves the record and the marks alone."""

    async def scenario(coordinator: ResetCoordinator, runtime: Runtime) -> Any:
        records = SharedRecords(runtime.shared)
        # Token 5: above the app's own coordinator's local lease (1), which ticks meanwhile.
        live = {"tier": "fp16", "token": 5, "started_at": NOON - 5, "leader": "other"}
        await records.put(CURRENT, json.dumps(live), ttl=60)
        await records.put(MARKS, json.dumps({"fp16": "draining", "token": 5}), ttl=60)
        lock = LeaderLock(f"redis://127.0.0.1:{free_port()}/0", "test:leader", ttl=30.0,
                          op_timeout=0.2)  # fmt: skip
        await lock.start()  # nothing listens
        lock._seen = 5  # it read the live leader's token before (GET /admin/resets does)
        coordinator.lock = lock
        await coordinator.tick()
        cut_off = lock.cut_off
        await lock.aclose()
        history = [json.loads(x) for x in await records.items(HISTORY)]
        return cut_off, history, await records.get(CURRENT), await records.get(MARKS)

    (cut_off, history, current, marks), _ = _with_coordinator(
        three_stubs, _policy(tmp_path), scenario, [NOON]
    )
    assert cut_off
    assert history == []
    assert current is not None and marks is not None


def test_a_refused_reset_now_is_asked_again_until_it_can_be_done(
    three_stubs: list[str], tmp_path: Path
) -> None:
    """An operator's "reset now" that finds another tier draining waits its turn (it used to
    be dropped without a record: the operator's poll of /admin/resets never saw an answer)."""

    async def scenario(coordinator: ResetCoordinator, runtime: Runtime) -> Any:
        runtime.board.set_state("fp16", TierState.DRAINING)
        await coordinator.request("int4")
        first = await coordinator.tick()
        history_while_refused = await coordinator.history()
        runtime.board.set_state("fp16", None)
        clock[0] += 30
        second = await coordinator.tick()
        return first, history_while_refused, second, await coordinator.history()

    clock = [NOON]
    (first, waiting, second, history), calls = _with_coordinator(
        three_stubs, _policy(tmp_path), scenario, clock
    )
    assert first.tier is None and "fp16 is draining" in first.reason
    assert waiting == []
    assert second.tier == "int4"
    assert [(r.tier, r.outcome) for r in history] == [("int4", "ok")]
    assert calls == ["reset", "warm_up"]


def test_a_reset_now_refused_for_too_long_is_recorded_with_the_reason(
    three_stubs: list[str], tmp_path: Path
) -> None:
    async def scenario(coordinator: ResetCoordinator, runtime: Runtime) -> Any:
        runtime.board.set_state("fp16", TierState.DRAINING)
        await coordinator.request("int4")
        await coordinator.tick()
        clock[0] += FORCED_PATIENCE + 1
        await coordinator.tick()
        clock[0] += 1
        after = await coordinator.tick()  # nothing left queued
        runtime.board.set_state("fp16", None)
        return after, await coordinator.history(), runtime.metrics

    clock = [NOON]
    (after, history, metrics), calls = _with_coordinator(
        three_stubs, _policy(tmp_path), scenario, clock
    )
    assert [(r.tier, r.outcome) for r in history] == [("int4", "refused")]
    assert "fp16 is draining" in history[0].detail and "asked 121 s ago" in history[0].detail
    assert history[0].started_at == NOON + FORCED_PATIENCE + 1
    assert after.tier is None and "forced" not in after.reason
    assert metrics.resets.labels(tier="int4", outcome="refused")._value.get() == 1
    assert calls == []


def test_a_queued_bare_tier_name_from_an_older_replica_is_still_reset(
    three_stubs: list[str], tmp_path: Path
) -> None:
    async def scenario(coordinator: ResetCoordinator, runtime: Runtime) -> Any:
        await SharedRecords(runtime.shared).push(OLDER_REQUESTS, "int8")
        await SharedRecords(runtime.shared).push(OLDER_REQUESTS, "t9")  # unknown: dropped
        return await coordinator.tick(), await coordinator.tick()

    (first, second), calls = _with_coordinator(three_stubs, _policy(tmp_path), scenario, [NOON])
    assert first.tier == "int8" and second.tier is None
    assert calls == ["reset", "warm_up"]


def test_a_refused_reset_now_does_not_hold_up_the_schedule(
    three_stubs: list[str], tmp_path: Path
) -> None:
    """int4 asked for while it is down: refused and waiting; the schedule (every tier due,
    quiet at any hour) resets another tier in the same tick."""

    async def scenario(coordinator: ResetCoordinator, runtime: Runtime) -> Any:
        runtime.board.set_state("int4", TierState.DOWN)
        await coordinator.tick()  # the quiet starts being tracked
        clock[0] += 1
        await coordinator.request("int4")
        decision = await coordinator.tick()
        queued = await coordinator.records.items(REQUESTS)
        runtime.board.set_state("int4", None)
        return decision, queued, await coordinator.history()

    clock = [NOON]
    policy = _policy(tmp_path, when="quiet", quiet={"max_rps": 100.0, "for_seconds": 0.5})
    (decision, queued, history), calls = _with_coordinator(three_stubs, policy, scenario, clock)
    assert decision.tier in ("fp16", "int8") and "forced" not in decision.reason
    assert [(r.tier, r.outcome) for r in history] == [(decision.tier, "ok")]
    assert [json.loads(raw)["tier"] for raw in queued] == ["int4"]  # still waiting its turn
    assert calls == ["reset", "warm_up"]


def test_asking_again_for_a_tier_already_queued_adds_nothing(
    three_stubs: list[str], tmp_path: Path
) -> None:
    async def scenario(coordinator: ResetCoordinator, runtime: Runtime) -> Any:
        for tier in ("int4", "int4", "int8", "int4"):
            await coordinator.request(tier)
        return await coordinator.records.items(REQUESTS)

    queued, _ = _with_coordinator(three_stubs, _policy(tmp_path), scenario, [NOON])
    assert sorted(json.loads(raw)["tier"] for raw in queued) == ["int4", "int8"]


class _Follower:
    """A leader lock this replica never gets."""

    holder = "follower"
    cut_off = False

    def token(self) -> None:
        return None

    async def acquire(self) -> None:
        return None


def test_a_replica_that_does_not_lead_puts_requests_back_as_they_were(
    three_stubs: list[str], tmp_path: Path
) -> None:
    """Older replicas read bare names under the older key and drop anything else there: a
    request is put back under the key, and in the form, it came in."""

    async def scenario(coordinator: ResetCoordinator, runtime: Runtime) -> Any:
        follower = ResetCoordinator(runtime, _Follower(), clock=lambda: NOON)  # type: ignore[arg-type]
        records = SharedRecords(runtime.shared)
        await records.push(OLDER_REQUESTS, "int8")
        await coordinator.request("int4")
        for _ in range(3):
            await follower.tick()
        return await records.items(OLDER_REQUESTS), await records.items(REQUESTS)

    (older, newer), calls = _with_coordinator(three_stubs, _policy(tmp_path), scenario, [NOON])
    assert older == ["int8"]
    assert [json.loads(raw)["tier"] for raw in newer] == ["int4"]
    assert calls == []


def test_the_patience_counts_from_the_first_refusal_not_the_asking(
    three_stubs: list[str], tmp_path: Path
) -> None:
    """A request that waited behind a long reset is not refused for good at its first look."""

    async def scenario(coordinator: ResetCoordinator, runtime: Runtime) -> Any:
        runtime.board.set_state("int4", TierState.DOWN)
        await coordinator.request("int4")
        clock[0] += 200  # the leader was busy with another tier's reset meanwhile
        await coordinator.tick()
        first = await coordinator.history()
        clock[0] += FORCED_PATIENCE + 1
        await coordinator.tick()
        runtime.board.set_state("int4", None)
        return first, await coordinator.history()

    clock = [NOON]
    (first, history), _ = _with_coordinator(three_stubs, _policy(tmp_path), scenario, clock)
    assert first == []
    assert [(r.tier, r.outcome) for r in history] == [("int4", "refused")]
    assert "asked 321 s ago, refused for 121 s" in history[0].detail
