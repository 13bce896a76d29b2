"""The leader's marks publisher (order, repair of writes Redis missed) and the scrape-time
apply that never undoes a newer mark."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import redis

from backends.process import free_port
from backends.tier_state import TierState
from gateway.config import TierEndpoint
from gateway.control.reset_marks import MARKS, MarksPublisher, apply_shared_marks
from gateway.control.tier_status import TierBoard
from gateway.shared.records import SharedRecords
from gateway.shared.state import SharedState
from tests.redis_server import start_redis, stop

POOL = ["http://a:8000", "http://b:8000"]
A_OUT = json.dumps({"endpoints": {"int4": {POOL[0]: "resetting"}}, "token": 1})
B_OUT = json.dumps({"endpoints": {"int4": {POOL[1]: "draining"}}, "token": 1})


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

    async def get(self, name: str) -> str | None:
        return self.redis.get(name)


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
        await apply_shared_marks(board, store)
        return [board.endpoint_state("int4", url) for url in POOL]

    assert anyio.run(scenario) == [TierState.READY, TierState.DRAINING]


class Overtaken(Store):
    """A read that returns the value from before a mark the leader set on its own board while
    the read was on its way (the leader's scrape loop and its reset run side by side)."""

    def __init__(self, board: TierBoard) -> None:
        super().__init__()
        self.board = board

    async def get(self, name: str) -> str | None:
        old = self.redis.get(name)
        self.board.set_endpoint_state("int4", POOL[0], None)  # the leader moves on meanwhile
        self.board.set_endpoint_state("int4", POOL[1], TierState.DRAINING)
        self.redis[name] = B_OUT
        return old


def test_a_read_overtaken_by_a_direct_mark_is_dropped() -> None:
    """Applied, the older read would put the first endpoint back out and the second in, until
    the next scrape."""

    async def scenario() -> list[list[TierState]]:
        board = _board()
        board.set_endpoint_state("int4", POOL[0], TierState.RESETTING)
        store = Overtaken(board)
        store.redis[MARKS] = A_OUT
        await apply_shared_marks(board, store)
        after_race = [board.endpoint_state("int4", url) for url in POOL]
        later = Store()
        later.redis[MARKS] = B_OUT
        await apply_shared_marks(board, later)  # the next scrape reads the new value
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
