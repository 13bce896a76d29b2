"""FencedValue on the real Redis: only the newest leader's token writes; every replica reads."""

from __future__ import annotations

import asyncio

from backends.process import free_port
from gateway.shared.fenced import FencedValue
from gateway.shared.state import SharedState


def test_a_stale_leader_cannot_replace_what_its_successor_wrote(
    redis_url: str, prefix: str
) -> None:
    async def scenario() -> list[object]:
        a = SharedState(redis_url, prefix=prefix, replica_id="a")
        b = SharedState(redis_url, prefix=prefix, replica_id="b")
        await a.start()
        await b.start()
        try:
            old, new = FencedValue(a, "figures"), FencedValue(b, "figures")
            found: list[object] = [await old.write("from token 4", 4)]
            found.append(await new.write("from token 5", 5))
            found.append(await old.write("late, from token 4", 4))  # the old leader woke up
            found.append(await FencedValue(a, "figures").read())
            found.append(await new.write("again, token 5", 5))  # the same leader, once more
            found.append(await old.read())
            return found
        finally:
            await a.aclose()
            await b.aclose()

    assert asyncio.run(scenario()) == [
        True,
        True,
        False,
        "from token 5",
        True,
        "again, token 5",
    ]


def test_without_redis_each_replica_keeps_its_own_value() -> None:
    async def scenario() -> tuple[bool, bool, str | None, str | None]:
        mine = FencedValue(SharedState(None), "figures")
        written = await mine.write("mine", 2)
        stale = await mine.write("older", 1)
        other = FencedValue(SharedState(None), "figures")
        return written, stale, await mine.read(), await other.read()

    assert asyncio.run(scenario()) == (True, False, "mine", None)


def test_while_redis_is_unreachable_a_write_stays_local_and_says_so() -> None:
    async def scenario() -> tuple[bool, str | None]:
        state = SharedState(f"redis://127.0.0.1:{free_port()}/0", op_timeout=0.2)
        await state.start()
        try:
            value = FencedValue(state, "figures")
            return await value.write("local", 1), await value.read()
        finally:
            await state.aclose()

    assert asyncio.run(scenario()) == (False, "local")
