"""The leader's marks publisher (order, repair of writes Redis missed), the scrape-time
apply that never undoes a newer mark, and the marks a follower refuses."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis

from backends.process import free_port
from backends.tier_state import TierState
from gateway.app import create_app, scrape_all
from gateway.config import GatewayConfig, TierEndpoint
from gateway.control.reset_marks import MARKS, MarksPublisher, apply_shared_marks, marks_refusal
from gateway.control.tier_status import Scrape, TierBoard
from gateway.runtime import Runtime, default_policy
from gateway.shared.records import SharedRecords
from gateway.shared.state import SharedState
from tests.redis_server import start_redis, stop

POOL = ["http://a:8000", "http://b:8000"]
A_OUT = json.dumps({"endpoints": {"int4": {POOL[0]: "resetting"}}, "token": 1})
B_OUT = json.dumps({"endpoints": {"int4": {POOL[1]: "draining"}}, "token": 1})
POLICY = default_policy(["int4"])


class Store(SharedRecords):
    """Shared records over a dict: Redis as the other replicas see it. ``missed`` writes are
    dropped (put returns False, as a Redis timeout leaves a write local); ``slow`` delays
    every write (a write on its way while the reset moves on)."""

    def __init__(self, missed: int = 0, slow: float = 0.0) -> None:
        super().__init__(SharedState(None))
        self.redis: dict[str, str | None] = {}
        self.missed, self.slow, self.writes = missed, slow, 0

    async def put(self, name: str, value: str | None, ttl: float) -> bool:
        self.writes += 1
        await anyio.sleep(self.slow)
        if self.missed:
            self.missed -= 1
            return False
        self.redis[name] = value
        return True

    async def get_leased(self, name: str) -> tuple[str | None, float | None]:
        value = self.redis.get(name)
        return value, (30.0 if value is not None else None)  # as a leader writes: 30 s leases


def test_a_mark_redis_missed_is_written_again_at_the_next_renewal() -> None:
    async def scenario() -> list[str | None]:
        store = Store()
        marks = MarksPublisher(store)
        await marks.publish(A_OUT, ttl=30)
        store.missed = 2  # the lift and the next endpoint's mark stay local
        await marks.publish(None, ttl=30)
        await marks.publish(B_OUT, ttl=30)
        seen = [store.redis[MARKS]]  # what the other replicas see: the old endpoint still out
        await marks.renew(ttl=30)
        return [*seen, store.redis[MARKS]]

    assert anyio.run(scenario) == [A_OUT, B_OUT]


def test_a_renewal_never_writes_a_value_that_was_overtaken() -> None:
    """A renewal asked for while a slow write is on its way and the reset moves on writes the
    newest value (read under the lock), never the one it saw when it was asked for."""

    async def scenario() -> str | None:
        store = Store(slow=0.05)
        marks = MarksPublisher(store)
        async with anyio.create_task_group() as group:
            group.start_soon(marks.publish, A_OUT, 30.0)
            await anyio.sleep(0.01)  # A's write is on its way
            group.start_soon(marks.publish, B_OUT, 30.0)
            await anyio.sleep(0.01)
            group.start_soon(marks.renew, 30.0)
        return store.redis[MARKS]

    assert anyio.run(scenario) == B_OUT


def test_repair_writes_only_after_a_missed_write() -> None:
    async def scenario() -> tuple[int, int, str | None]:
        store = Store()
        marks = MarksPublisher(store)
        await marks.publish(A_OUT, ttl=30)
        await marks.repair(ttl=30)  # the last write landed: nothing to do
        clean = store.writes
        store.missed = 1
        await marks.publish(None, ttl=30)  # the final lift stays local
        await marks.repair(ttl=30)
        await marks.repair(ttl=30)  # landed now: no more writes
        return clean, store.writes, store.redis[MARKS]

    assert anyio.run(scenario) == (1, 3, None)


def _board() -> TierBoard:
    return TierBoard([TierEndpoint(name="int4", endpoints=POOL)])


def test_the_scrape_applies_the_shared_marks() -> None:
    async def scenario() -> list[TierState]:
        store, board = Store(), _board()
        store.redis[MARKS] = B_OUT
        await apply_shared_marks(board, store, POLICY)
        return [board.endpoint_state("int4", url) for url in POOL]

    assert anyio.run(scenario) == [TierState.READY, TierState.DRAINING]


class Overtaken(Store):
    """A read that returns the value from before a mark the leader set on its own board while
    the read was on its way (the leader's scrape loop and its reset run side by side)."""

    def __init__(self, board: TierBoard) -> None:
        super().__init__()
        self.board = board

    async def get_leased(self, name: str) -> tuple[str | None, float | None]:
        old = self.redis.get(name)
        self.board.set_endpoint_state("int4", POOL[0], None)  # the leader moves on meanwhile
        self.board.set_endpoint_state("int4", POOL[1], TierState.DRAINING)
        self.redis[name] = B_OUT
        return old, 30.0


def test_a_read_overtaken_by_a_direct_mark_is_dropped() -> None:
    """Applied, the older read would put the first endpoint back out and the second in, until
    the next scrape."""

    async def scenario() -> list[list[TierState]]:
        board = _board()
        board.set_endpoint_state("int4", POOL[0], TierState.RESETTING)
        store = Overtaken(board)
        store.redis[MARKS] = A_OUT
        await apply_shared_marks(board, store, POLICY)
        after_race = [board.endpoint_state("int4", url) for url in POOL]
        later = Store()
        later.redis[MARKS] = B_OUT
        await apply_shared_marks(board, later, POLICY)  # the next scrape reads the new value
        return [after_race, [board.endpoint_state("int4", url) for url in POOL]]

    assert anyio.run(scenario) == [[TierState.READY, TierState.DRAINING]] * 2


def test_marks_redis_missed_while_a_write_stalled_are_repaired_at_the_renewal(
    tmp_path: Path,
) -> None:
    """The failure seen in CI, on a real Redis: a write stalled past the shared state's timeout
    (here: Redis pauses writes) is lost, and the leader's next writes stay local until its
    shared state is back, so every other replica reads an endpoint's mark from before (this
    endpoint draining while the leader has moved on to the next). Extending the expiry kept
    that old mark alive as long as the reset lasted; the renewal writes the leader's latest."""
    port = free_port()
    proc = start_redis(port, tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    a_draining = A_OUT.replace("resetting", "draining")

    async def scenario() -> tuple[str | None, str | None, str | None]:
        leader = SharedState(url, replica_id="leader", op_timeout=0.2, retry_interval=0.3)
        follower = SharedState(url, replica_id="follower")
        await leader.start()
        await follower.start()
        seen = SharedRecords(follower)
        marks = MarksPublisher(SharedRecords(leader))
        try:
            await marks.publish(a_draining, ttl=30)
            first = await seen.get(MARKS)
            admin = redis.Redis.from_url(url)
            admin.client_pause(700, all=False)  # writes wait 0.7 s
            admin.close()
            await marks.publish(A_OUT, ttl=30)  # times out: the shared state goes local
            await marks.publish(None, ttl=30)  # the leader moves on, locally for now
            await marks.publish(B_OUT, ttl=30)
            await anyio.sleep(1.5)  # the pause is over, the leader's shared state is back
            stale = await seen.get(MARKS)
            await marks.renew(ttl=30)
            return first, stale, await seen.get(MARKS)
        finally:
            await follower.aclose()
            await leader.aclose()

    try:
        first, stale, renewed = anyio.run(scenario)
    finally:
        stop(proc)
    assert first == a_draining
    assert stale != B_OUT  # what the other replicas saw until the renewal
    assert renewed == B_OUT


# --------------------------------------------------------------------------- what a follower takes

TIERS = ("fp16", "int8", "int4")
ALL_DOWN = json.dumps({"fp16": "down", "int8": "down", "int4": "down", "token": 9})
INT4_DRAINING = json.dumps({"int4": "draining", "token": 9})


def test_a_follower_refuses_marks_no_leader_could_have_written(
    make_stub: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The review's case: one SET of the marks key without an expiry (any local user under
    ``up``, any container on compose's backend network) took every tier out of every replica,
    503s until someone deleted the key. Marks without an expiry, with one far beyond the
    lease, or that leave a class with no ready tier are refused; a leader's are followed."""
    urls = [make_stub().url for _ in TIERS]
    port = free_port()
    proc = start_redis(port, tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    config = GatewayConfig(
        model_name="stub-model",
        tiers=[TierEndpoint(name=n, base_url=u) for n, u in zip(TIERS, urls, strict=True)],
        redis_url=url,
        metrics_interval=600,  # the test's scrapes only
    )
    all_endpoints_down = json.dumps(
        {"endpoints": {n: {u: "down"} for n, u in zip(TIERS, urls, strict=True)}, "token": 9}
    )
    app = create_app(config)
    caplog.set_level(logging.WARNING, logger="gateway.control.reset_marks")

    async def scenario() -> list[list[str]]:
        seen: list[list[str]] = []
        async with app.router.lifespan_context(app):
            runtime: Runtime = app.state.runtime
            key = runtime.shared._key("value", MARKS)
            admin = redis.Redis.from_url(url)
            try:
                for value, expiry in [
                    (ALL_DOWN, None),  # no expiry: refused
                    (ALL_DOWN, None),  # the same value again: no second warning
                    (ALL_DOWN, 30),  # expires, but leaves every class without a ready tier
                    (all_endpoints_down, 30),  # the same through every endpoint
                    (INT4_DRAINING, None),  # a leader's mark but without an expiry
                    (INT4_DRAINING, 3600),  # expiry far beyond 2 x lock_ttl_seconds (30 s)
                    (INT4_DRAINING, 30),  # what a leader writes: followed
                ]:
                    admin.set(key, value, ex=expiry)
                    await scrape_all(runtime)
                    seen.append([runtime.board.state(n).value for n in TIERS])
            finally:
                admin.close()
        return seen

    try:
        seen = anyio.run(scenario)
    finally:
        stop(proc)
    assert seen == [["ready"] * 3] * 6 + [["ready", "ready", "draining"]]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split("refused (")[1].split("): routing")[0] for w in warnings] == [
        "it has no expiry; a leader's marks expire after resets.lock_ttl_seconds",
        "it leaves class tolerant no ready tier",
        "it leaves class tolerant no ready tier",
        "it has no expiry; a leader's marks expire after resets.lock_ttl_seconds",
        "it expires in more than 2 x resets.lock_ttl_seconds (60 s)",
    ]


def test_marks_that_leave_a_class_its_admitted_tier_are_followed_else_refused() -> None:
    """Pure: a class keeps a ready tier that admits it (the admission check's classes count),
    and a class with no ready tier before the marks is not the marks' doing."""
    tiers = [
        TierEndpoint(name="fp16", base_url="http://f:1"),
        TierEndpoint(name="int4", base_url="http://i:1", classes=["tolerant"]),
    ]
    board = TierBoard(tiers)
    policy = default_policy(["fp16", "int4"])
    fp16_out = json.dumps({"fp16": "draining"})
    # int4 is ready but serves only tolerant: code, math and long would have nowhere to go.
    assert marks_refusal(board, fp16_out, 30.0, policy) == "it leaves class code no ready tier"
    assert marks_refusal(board, json.dumps({"int4": "draining"}), 30.0, policy) is None
    board.record("fp16", Scrape(healthy=False, metrics=None, at=0.0))
    board.record("int4", Scrape(healthy=False, metrics=None, at=0.0))
    assert marks_refusal(board, fp16_out, 30.0, policy) is None  # nothing was ready anyway
    assert marks_refusal(board, "not marks", None, policy) is None  # nothing to refuse
