"""SharedRecords: whether a write reached the shared store (the reset leader repairs the ones
that did not, gateway/control/reset_marks.py), and values other replicas read."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from backends.process import free_port
from gateway.shared.records import SharedRecords
from gateway.shared.state import SharedState
from tests.redis_server import start_redis, stop
from tests.unit.gateway.shared.test_gateway_shared import Clock


def test_a_write_says_whether_redis_took_it(redis_url: str, prefix: str) -> None:
    async def scenario() -> list[object]:
        state = SharedState(redis_url, prefix=prefix, replica_id="a")
        other = SharedState(redis_url, prefix=prefix, replica_id="b")
        await state.start()
        await other.start()
        records, seen = SharedRecords(state), SharedRecords(other)
        try:
            found: list[object] = [await records.put("marks", "endpoint-0", ttl=5.0)]
            found.append(await seen.get("marks"))
            found.append(await records.put("marks", None, ttl=1))  # lifted
            found.append(await seen.get("marks"))
            return found
        finally:
            await state.aclose()
            await other.aclose()

    assert asyncio.run(scenario()) == [True, "endpoint-0", True, None]


def test_a_write_while_redis_is_unreachable_says_it_stayed_local() -> None:
    async def scenario() -> tuple[bool, str | None]:
        state = SharedState(f"redis://127.0.0.1:{free_port()}/0", op_timeout=0.2)
        await state.start()  # nothing listens: local state meanwhile
        try:
            records = SharedRecords(state)
            return await records.put("marks", "tier", ttl=5.0), await records.get("marks")
        finally:
            await state.aclose()

    assert asyncio.run(scenario()) == (False, "tier")  # this replica still sees its own


def test_without_redis_the_local_state_is_the_shared_store() -> None:
    async def scenario() -> tuple[bool, bool, str | None]:
        records = SharedRecords(SharedState(None))
        put = await records.put("marks", "tier", ttl=5.0)
        lifted = await records.put("marks", None, ttl=1)
        return put, lifted, await records.get("marks")

    assert asyncio.run(scenario()) == (True, True, None)


def test_a_value_another_replica_wrote_outlives_a_redis_outage_until_its_expiry(
    tmp_path: Path,
) -> None:
    """A reset mark read from Redis stays in force while Redis fails (this replica would send
    traffic to an endpoint being reset otherwise), and only as long as it would have lived."""
    port = free_port()
    proc = start_redis(port, tmp_path)
    clock = Clock(time.time())

    async def scenario() -> list[str | None]:
        url = f"redis://127.0.0.1:{port}/0"
        leader = SharedState(url, replica_id="leader")
        state = SharedState(url, replica_id="reader", clock=clock, op_timeout=0.2)
        await leader.start()
        await state.start()
        try:
            await SharedRecords(leader).put("marks", "endpoint-0", ttl=30.0)
            reader = SharedRecords(state)
            found = [await reader.get("marks")]
            stop(proc)  # Redis goes away
            found.append(await reader.get("marks"))  # fails over to the last value seen
            found.append(await reader.get("marks"))  # local now
            clock.now += 31  # past the mark's expiry
            found.append(await reader.get("marks"))
            return found
        finally:
            await state.aclose()
            await leader.aclose()

    try:
        assert asyncio.run(scenario()) == ["endpoint-0", "endpoint-0", "endpoint-0", None]
    finally:
        stop(proc)


def test_a_record_pushed_while_redis_failed_reaches_redis_when_it_is_back(
    redis_url: str, prefix: str
) -> None:
    """A reset record made during a short outage (a loaded machine stalled the process past
    op_timeout) is written to Redis once it is back, before the next push or read: the other
    replicas see it, and so does this one, reading Redis again."""

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        state = SharedState(redis_url, prefix=prefix, replica_id="a", retry_interval=0.05)
        other = SharedState(redis_url, prefix=prefix, replica_id="b")
        await state.start()
        await other.start()
        records, seen = SharedRecords(state), SharedRecords(other)
        try:
            await records.push("history", "first")
            state._fall_back(TimeoutError("stalled"))  # what a timed-out operation does
            await records.push("history", "during the outage")
            during = await seen.items("history")
            deadline = time.monotonic() + 5
            while not state.shared:
                assert time.monotonic() < deadline, "the shared state never came back"
                await asyncio.sleep(0.02)
            mine = await records.items("history")
            return during, mine, await seen.items("history")
        finally:
            await state.aclose()
            await other.aclose()

    during, mine, theirs = asyncio.run(scenario())
    assert during == ["first"]
    assert mine == theirs == ["during the outage", "first"]
