"""SharedRecords' renewal: a value's time is extended, the value itself never written back."""

from __future__ import annotations

import asyncio

from gateway.shared.records import SharedRecords
from gateway.shared.state import SharedState
from tests.unit.gateway.shared.test_gateway_shared import Clock


def test_renewal_keeps_whatever_value_is_there_now(redis_url: str, prefix: str) -> None:
    """The reset leader's renewal races its own marks: a renewal must never bring back a mark
    that was lifted or replaced meanwhile (read-then-write did: a reset endpoint stayed out of
    routing on the other replicas while the next one was put back in)."""

    async def scenario() -> list[str | None]:
        state = SharedState(redis_url, prefix=prefix, replica_id="a")
        other = SharedState(redis_url, prefix=prefix, replica_id="b")
        await state.start()
        await other.start()
        records, seen = SharedRecords(state), SharedRecords(other)
        try:
            found: list[str | None] = []
            await records.put("marks", "endpoint-0", ttl=1.0)
            await records.renew("marks", 5.0)
            await asyncio.sleep(1.2)  # past the first ttl: the renewal holds it
            found.append(await seen.get("marks"))
            await records.put("marks", "endpoint-1", ttl=5.0)  # moved on
            await records.renew("marks", 5.0)
            found.append(await seen.get("marks"))
            await records.put("marks", None, ttl=1)  # lifted
            await records.renew("marks", 5.0)
            found.append(await seen.get("marks"))
            return found
        finally:
            await state.aclose()
            await other.aclose()

    assert asyncio.run(scenario()) == ["endpoint-0", "endpoint-1", None]


def test_renewal_in_local_state_extends_and_never_revives() -> None:
    clock = Clock()

    async def scenario() -> list[str | None]:
        records = SharedRecords(SharedState(None, clock=clock))
        found: list[str | None] = []
        await records.put("marks", "tier", ttl=1.0)
        clock.now += 0.9
        await records.renew("marks", 1.0)
        clock.now += 0.9  # 1.8 s after the put: alive only through the renewal
        found.append(await records.get("marks"))
        clock.now += 0.2
        found.append(await records.get("marks"))  # expired
        await records.renew("marks", 10.0)  # an expired value stays gone
        found.append(await records.get("marks"))
        return found

    assert asyncio.run(scenario()) == ["tier", None, None]
