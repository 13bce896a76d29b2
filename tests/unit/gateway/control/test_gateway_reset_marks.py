"""The leader's marks publisher (order, repair of writes Redis missed) and the scrape-time
apply that never undoes a newer mark."""

from __future__ import annotations

import json

import anyio

from backends.tier_state import TierState
from gateway.config import TierEndpoint
from gateway.control.reset_marks import MARKS, MarksPublisher, apply_shared_marks
from gateway.control.tier_status import TierBoard
from gateway.shared.records import SharedRecords
from gateway.shared.state import SharedState

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
