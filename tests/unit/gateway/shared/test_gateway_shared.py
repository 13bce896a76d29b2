"""SharedState against a real Redis on 127.0.0.1 (and a throwaway redis-server for outages)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
import redis

from backends.process import free_port
from gateway.shared.lua import INFLIGHT
from gateway.shared.state import RateDecision, SharedState
from tests.redis_server import start_redis, stop

T = TypeVar("T")
LOGGER = "gateway.shared.state"


class Clock:
    """An injectable clock that only moves when told."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await scenario()

    return asyncio.run(main())


async def timed(call: Awaitable[T], limit: float) -> T:
    started = time.monotonic()
    result = await call
    elapsed = time.monotonic() - started
    assert elapsed < limit, f"took {elapsed:.3f}s"
    return result


def records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == level]


def test_two_replicas_share_in_flight_and_rate(redis_url: str, prefix: str) -> None:
    clock = Clock()

    async def scenario() -> None:
        a = SharedState(redis_url, prefix=prefix, replica_id="a", clock=clock)
        b = SharedState(redis_url, prefix=prefix, replica_id="b", clock=clock)
        await a.start()
        await b.start()
        try:
            assert a.shared and b.shared
            await a.begin("fp16")
            await a.begin("fp16")
            await b.begin("fp16")
            await b.begin("int4")
            assert await a.in_flight() == await b.in_flight() == {"fp16": 3, "int4": 1}
            assert await a.request_rate(1) == await b.request_rate(1) == 4.0
            await b.end("fp16")
            await b.end("fp16")  # one more end than begins on b: clamped, a's two remain
            await b.end("int8")  # never begun
            assert await a.in_flight() == {"fp16": 2, "int4": 1, "int8": 0}
            for _ in range(3):
                await a.end("fp16")
            await b.end("int4")
            assert await b.in_flight() == {"fp16": 0, "int4": 0, "int8": 0}
            assert await a.request_rate(1) == 4.0  # ends are not requests
        finally:
            await a.aclose()
            await b.aclose()

    run(scenario)


def test_coalesced_writes_carry_every_change_in_few_round_trips(
    redis_url: str, prefix: str
) -> None:
    """flush_delay > 0: begin/end make no round trip; one write within the delay carries every
    change since the last (counts and requests per second), the writer reads its own at once."""
    clock = Clock()

    async def scenario() -> None:
        a = SharedState(redis_url, prefix=prefix, replica_id="a", clock=clock, flush_delay=0.2)
        b = SharedState(redis_url, prefix=prefix, replica_id="b", clock=clock)
        await a.start()
        await b.start()
        client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
        try:
            seq_before = int(await client.hget(f"{prefix}:inflight:a", "__seq") or 0)
            for _ in range(50):
                await timed(a.begin("fp16"), 0.05)  # no round trip: far under op_timeout
            for _ in range(20):
                await a.end("fp16")
            await a.begin("int4")
            clock.now += 1.0  # the next second's bucket
            await a.begin("int4")
            assert "fp16" not in await b.in_flight()  # not written yet: b sees it late
            await asyncio.sleep(0.5)
            assert await b.in_flight() == {"fp16": 30, "int4": 2}
            assert await b.request_rate(2) == 52 / 2
            seq_after = int(await client.hget(f"{prefix}:inflight:a", "__seq") or 0)
            assert 1 <= seq_after - seq_before <= 2  # one write (a heartbeat may add one)
            await a.end("int4")
            assert await a.in_flight() == {"fp16": 30, "int4": 1}  # its own, at once
            assert await b.in_flight() == {"fp16": 30, "int4": 1}  # written by that read
        finally:
            await client.aclose()
            await a.aclose()
            await b.aclose()

    run(scenario)


def test_a_pending_write_is_dropped_with_the_replica_on_close(redis_url: str, prefix: str) -> None:
    async def scenario() -> None:
        a = SharedState(redis_url, prefix=prefix, replica_id="a", flush_delay=5.0)
        b = SharedState(redis_url, prefix=prefix, replica_id="b")
        await a.start()
        await b.start()
        try:
            await a.begin("fp16")
            await timed(a.aclose(), 1.0)  # the 5 s flush is cancelled, not awaited
            assert await b.in_flight() == {}
        finally:
            await a.aclose()
            await b.aclose()

    run(scenario)


def test_late_in_flight_write_cannot_roll_back(redis_url: str, prefix: str) -> None:
    """Snapshots carry a sequence number: an older one arriving late is ignored."""

    async def scenario() -> None:
        a = SharedState(redis_url, prefix=prefix, replica_id="a")
        await a.start()
        client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
        keys = (f"{prefix}:inflight:a", f"{prefix}:replicas")
        try:
            await a.begin("fp16")
            await a.begin("fp16")
            stale = (a._owner, 1, 15_000, "a", 310, 0, "fp16", 7)  # seq 1: the first begin's
            await client.eval(INFLIGHT, 2, *keys, *stale)
            assert await a.in_flight() == {"fp16": 2}
            restarted = ("another-process", 1, 15_000, "a", 310, 0, "fp16", 7)  # same replica id
            await client.eval(INFLIGHT, 2, *keys, *restarted)
            assert await a.in_flight() == {"fp16": 7}
        finally:
            await client.aclose()
            await a.aclose()

    run(scenario)


def test_replica_that_stops_heartbeating_drops_out(redis_url: str, prefix: str) -> None:
    async def scenario() -> None:
        a = SharedState(redis_url, prefix=prefix, replica_id="a")
        b = SharedState(redis_url, prefix=prefix, replica_id="b", replica_ttl=0.3)
        c = SharedState(redis_url, prefix=prefix, replica_id="c")
        for state in (a, b, c):
            await state.start()
        try:
            await a.begin("fp16")
            await b.begin("fp16")
            await b.begin("fp16")
            await c.begin("int8")
            await asyncio.sleep(0.45)  # longer than b's ttl: only its heartbeat keeps it
            assert await a.in_flight() == {"fp16": 3, "int8": 1}
            await c.aclose()  # graceful: gone at once
            assert await a.in_flight() == {"fp16": 3}
            await b.aclose(deregister=False)  # as if it crashed
            await asyncio.sleep(0.45)
            assert await a.in_flight() == {"fp16": 1}
            client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
            assert await client.smembers(f"{prefix}:replicas") == {"a"}
            await client.aclose()
        finally:
            await a.aclose()
            await b.aclose()

    run(scenario)


def test_rate_limit_is_a_shared_sliding_window(redis_url: str, prefix: str) -> None:
    clock = Clock(1000.0)

    async def scenario() -> None:
        a = SharedState(redis_url, prefix=prefix, replica_id="a", clock=clock)
        b = SharedState(redis_url, prefix=prefix, replica_id="b", clock=clock)
        await a.start()
        await b.start()
        try:
            assert await a.rate_limit("k1", 3, 10) == RateDecision(True, 0.0, 2)
            clock.now = 1004.0
            assert await b.rate_limit("k1", 3, 10) == RateDecision(True, 0.0, 1)
            clock.now = 1008.0
            assert await a.rate_limit("k1", 3, 10) == RateDecision(True, 0.0, 0)
            refused = await b.rate_limit("k1", 3, 10)
            assert not refused.allowed and refused.remaining == 0
            assert refused.retry_after == pytest.approx(2.0)  # the request at 1000 leaves at 1010
            assert (await a.rate_limit("k2", 3, 10)).allowed  # another key, its own window
            clock.now = 1009.5
            assert (await a.rate_limit("k1", 3, 10)).retry_after == pytest.approx(0.5)
            clock.now = 1010.0
            assert await b.rate_limit("k1", 3, 10) == RateDecision(True, 0.0, 0)
            refused = await a.rate_limit("k1", 3, 10)  # sliding: 1004 leaves at 1014
            assert not refused.allowed and refused.retry_after == pytest.approx(4.0)
            clock.now = 1030.0
            assert await a.rate_limit("k1", 3, 10) == RateDecision(True, 0.0, 2)
            with pytest.raises(ValueError):
                await a.rate_limit("k1", 0, 10)
        finally:
            await a.aclose()
            await b.aclose()

    run(scenario)


def test_request_rate_over_windows(redis_url: str, prefix: str) -> None:
    clock = Clock(1000.2)

    async def scenario() -> None:
        a = SharedState(redis_url, prefix=prefix, replica_id="a", clock=clock)
        b = SharedState(redis_url, prefix=prefix, replica_id="b", clock=clock)
        await a.start()
        await b.start()
        try:
            for state, when, count in (
                (a, 1000.2, 6),
                (b, 1000.9, 4),
                (b, 1001.7, 5),
                (a, 1003.1, 3),
            ):
                clock.now = when
                for _ in range(count):
                    await state.begin("fp16")
            clock.now = 1003.5
            assert await a.request_rate(1) == 3.0
            assert await b.request_rate(2) == 1.5  # seconds 1002 and 1003
            assert await a.request_rate(4) == 18 / 4
            assert await b.request_rate(0.5) == 6.0  # the current second, per 0.5 s
            clock.now = 1300.5
            assert await a.request_rate(300) == 8 / 300  # seconds 1001..1300
            clock.now = 1301.5
            assert await a.request_rate(300) == 3 / 300  # only second 1003 is still inside
            clock.now = 1303.0
            assert await a.request_rate(300) == 0.0
            for bad in (0, -1, 301):
                with pytest.raises(ValueError):
                    await a.request_rate(bad)
        finally:
            await a.aclose()
            await b.aclose()

    run(scenario)


def test_unreachable_redis_falls_back_to_local_state(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = Clock(1000.0)
    limit = 0.2 + 0.5  # op_timeout + slack for a loaded 2-core machine

    async def scenario() -> None:
        url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
        state = SharedState(url, clock=clock, op_timeout=0.2, retry_interval=0.05)
        await timed(state.start(), limit)
        try:
            assert not state.shared
            await timed(state.begin("fp16"), limit)
            await timed(state.begin("fp16"), limit)
            await timed(state.end("fp16"), limit)
            await timed(state.end("int4"), limit)
            assert await timed(state.in_flight(), limit) == {"fp16": 1, "int4": 0}
            assert await timed(state.request_rate(2), limit) == 1.0
            assert await timed(state.rate_limit("k", 2, 10), limit) == RateDecision(True, 0.0, 1)
            assert (await state.rate_limit("k", 2, 10)).allowed
            refused = await timed(state.rate_limit("k", 2, 10), limit)
            assert not refused.allowed and refused.retry_after == pytest.approx(10.0)
            await asyncio.sleep(0.2)  # several failed retries in the background: no new warning
            clock.now = 1010.0
            assert (await state.rate_limit("k", 2, 10)).allowed
            assert not state.shared
        finally:
            await state.aclose()
        warnings = records(caplog, logging.WARNING)
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert "127.0.0.1" in warnings[0].getMessage()

    run(scenario)


def test_no_redis_url_is_local_and_silent(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)

    async def scenario() -> None:
        state = SharedState(None)
        await state.start()
        await state.begin("fp16")
        assert await state.in_flight() == {"fp16": 1}
        assert not state.shared
        await state.aclose()

    run(scenario)
    assert records(caplog, logging.WARNING) == []


def test_reconnects_after_an_outage(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    proc = start_redis(port, tmp_path)

    async def scenario() -> None:
        nonlocal proc
        # retry_interval leaves room for starting redis-server on a loaded machine (the
        # "still local" check below must come before the first retry)
        state = SharedState(url, op_timeout=0.2, retry_interval=3.0)
        other = SharedState(url, replica_id="other")
        await state.start()
        try:
            assert state.shared
            await state.begin("fp16")
            assert await state.in_flight() == {"fp16": 1}
            # several pooled connections, idle when Redis goes: dead once it is back
            await asyncio.gather(*(state.rate_limit(f"k{i}", 100, 60.0) for i in range(8)))
            stop(proc)
            await timed(state.begin("fp16"), 0.3)  # fails over to local state
            assert not state.shared
            await timed(state.begin("int4"), 0.3)
            assert await timed(state.in_flight(), 0.3) == {"fp16": 2, "int4": 1}
            assert len(records(caplog, logging.WARNING)) == 1
            assert records(caplog, logging.INFO) == []
            proc = start_redis(port, tmp_path)
            # before retry_interval: still local, Redis (empty now) is not asked
            assert not state.shared
            assert await state.in_flight() == {"fp16": 2, "int4": 1}
            deadline = time.monotonic() + 6.0
            while not state.shared and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert state.shared
            assert len(records(caplog, logging.INFO)) == 1
            # the pool's connections from before the outage are not used again
            await asyncio.gather(*(state.rate_limit(f"k{i}", 100, 60.0) for i in range(8)))
            assert state.shared
            await other.start()  # counts of requests running through the outage were pushed
            assert await other.in_flight() == {"fp16": 2, "int4": 1}
            await state.end("fp16")
            await state.end("fp16")
            await state.end("fp16")
            assert await other.in_flight() == {"fp16": 0, "int4": 1}
            assert len(records(caplog, logging.WARNING)) == 1
        finally:
            await state.aclose()
            await other.aclose()

    try:
        run(scenario)
    finally:
        stop(proc)


def test_a_burst_larger_than_the_pool_stays_shared(redis_url: str, prefix: str) -> None:
    """300 concurrent requests (the pool holds 64 connections) queue for a connection instead
    of failing over to local state ("Too many connections" with redis-py's default pool)."""
    clock = Clock()

    async def scenario() -> None:
        state = SharedState(redis_url, prefix=prefix, replica_id="a", clock=clock, op_timeout=2.0)
        await state.start()
        try:
            await asyncio.gather(*(state.begin("fp16") for _ in range(300)))
            decisions = await asyncio.gather(
                *(state.rate_limit("key", 1000, 60.0) for _ in range(300))
            )
            assert state.shared
            assert await state.in_flight() == {"fp16": 300}
            assert all(decision.allowed for decision in decisions)
            assert await state.request_rate(1) == 300.0
        finally:
            await state.aclose()

    run(scenario)


@pytest.mark.parametrize("shared", [True, False], ids=["redis", "local"])
def test_a_request_may_cost_several_units_of_a_rate_limit(
    redis_url: str, prefix: str, shared: bool
) -> None:
    clock = Clock(1000.0)

    async def scenario() -> None:
        state = SharedState(redis_url if shared else None, prefix=prefix, clock=clock)
        await state.start()
        try:
            assert state.shared is shared
            assert await state.rate_limit("k", 5, 10, cost=3) == RateDecision(True, 0.0, 2)
            clock.now = 1002.0
            refused = await state.rate_limit("k", 5, 10, cost=3)  # 3 + 3 > 5
            assert not refused.allowed and refused.retry_after == pytest.approx(8.0)
            assert await state.rate_limit("k", 5, 10, cost=2) == RateDecision(True, 0.0, 0)
            clock.now = 1010.0  # the 3 units of 1000 leave; the 2 of 1002 stay
            assert await state.rate_limit("k", 5, 10, cost=3) == RateDecision(True, 0.0, 0)
            with pytest.raises(ValueError):
                await state.rate_limit("k", 5, 10, cost=6)  # could never be allowed
            with pytest.raises(ValueError):
                await state.rate_limit("k", 5, 10, cost=0)
        finally:
            await state.aclose()

    run(scenario)


def test_local_rate_windows_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without Redis every client address seen kept its window for ever.
    clock = Clock(1000.0)

    async def scenario() -> None:
        state = SharedState(None, clock=clock)
        for i in range(1000):
            assert (await state.rate_limit(f"addr:10.0.{i // 256}.{i % 256}", 5, 60)).allowed
        assert len(state._local.windows) == 1000
        clock.now = 1061.0  # every window has expired
        assert (await state.rate_limit("addr:new", 5, 60)).allowed
        assert len(state._local.windows) == 1
        monkeypatch.setattr("gateway.shared.local._MAX_LOCAL_WINDOWS", 100)
        for i in range(500):  # within one window: the least recently used are dropped
            await state.rate_limit(f"addr:{i}", 5, 60)
        assert len(state._local.windows) <= 100
        assert "addr:499" in state._local.windows

    run(scenario)
