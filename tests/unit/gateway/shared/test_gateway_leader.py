"""LeaderLock against the real Redis on 127.0.0.1:6379 (and a throwaway one for a comeback)."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar
from uuid import uuid4

import pytest
import redis

from backends.process import free_port
from gateway.shared.leader import LeaderLock
from tests.redis_server import ping, redis_command, start_redis

T = TypeVar("T")
LOGGER = "gateway.shared.leader"
URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="module")
def redis_url() -> str:
    if not ping(6379):
        pytest.skip("no Redis on 127.0.0.1:6379")
    return URL


@pytest.fixture
def key(redis_url: str) -> Iterator[str]:
    """A unique lock key; it and its fence are deleted afterwards."""
    prefix = f"mo:test:{uuid4().hex}"
    yield f"{prefix}:leader"
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await scenario()

    return asyncio.run(main())


def stored(key: str) -> str | None:
    client = redis.Redis.from_url(URL, decode_responses=True)
    try:
        value = client.get(key)
        return None if value is None else str(value)
    finally:
        client.close()


def records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == level]


def test_of_two_locks_on_one_key_only_one_acquires(redis_url: str, key: str) -> None:
    async def scenario() -> None:
        a = LeaderLock(redis_url, key, ttl=5, holder="a")
        b = LeaderLock(redis_url, key, ttl=5, holder="b")
        await a.start()
        await b.start()
        try:
            token = await a.acquire()
            assert token is not None and token >= 1
            assert await b.acquire() is None
            assert a.token() == token and b.token() is None
            assert await a.acquire() == token  # the holder again: same token, expiry refreshed
            assert stored(key) == f"a|{token}"
            assert await a.current() == ("a", token)
            assert await b.current() == ("a", token)
        finally:
            await a.aclose()
            await b.aclose()

    run(scenario)


def test_after_release_the_other_acquires_with_a_larger_token(redis_url: str, key: str) -> None:
    async def scenario() -> None:
        a = LeaderLock(redis_url, key, ttl=5, holder="a")
        b = LeaderLock(redis_url, key, ttl=5, holder="b")
        await a.start()
        await b.start()
        try:
            first = await a.acquire()
            assert first is not None
            await a.release()
            assert a.token() is None
            assert await a.current() == (None, None)
            second = await b.acquire()
            assert second is not None and second > first
            assert await a.acquire() is None
            await b.release()
            third = await a.acquire()
            assert third is not None and third > second
        finally:
            await a.aclose()
            await b.aclose()

    run(scenario)


def test_a_lock_that_is_not_renewed_expires_within_its_ttl(redis_url: str, key: str) -> None:
    async def scenario() -> None:
        a = LeaderLock(redis_url, key, ttl=0.5, holder="a")
        b = LeaderLock(redis_url, key, ttl=0.5, holder="b")
        await a.start()
        await b.start()
        try:
            first = await a.acquire()
            assert first is not None
            assert await b.acquire() is None
            await asyncio.sleep(0.3)
            assert await a.renew()  # renewing keeps it past the first ttl
            await asyncio.sleep(0.3)
            assert await b.acquire() is None
            assert a.token() == first
            await asyncio.sleep(0.55)  # a stops renewing
            assert a.token() is None  # it stops believing it leads, without asking Redis
            second = await b.acquire()
            assert second is not None and second > first
            assert not await a.renew()  # the lock is b's now
            assert await a.acquire() is None
            assert await a.current() == ("b", second)
        finally:
            await a.aclose()
            await b.aclose()

    run(scenario)


def test_renew_and_release_by_a_non_holder_do_nothing(redis_url: str, key: str) -> None:
    async def scenario() -> None:
        a = LeaderLock(redis_url, key, ttl=5, holder="a")
        b = LeaderLock(redis_url, key, ttl=5, holder="b")
        await a.start()
        await b.start()
        try:
            token = await a.acquire()
            assert not await b.renew()
            await b.release()
            assert stored(key) == f"a|{token}"
            assert await a.renew()
        finally:
            await a.aclose()
            await b.aclose()

    run(scenario)


def test_a_holder_whose_lock_was_taken_over_cannot_renew_or_release(
    redis_url: str, key: str
) -> None:
    async def scenario() -> None:
        a = LeaderLock(redis_url, key, ttl=5, holder="a")
        await a.start()
        try:
            token = await a.acquire()
            assert token is not None
            # the lock expired and a successor got it (simulated directly in Redis)
            redis.Redis.from_url(redis_url).set(key, f"b|{token + 1}", px=5000)
            assert not await a.renew()
            assert a.token() is None
            await a.release()
            assert stored(key) == f"b|{token + 1}"
        finally:
            await a.aclose()

    run(scenario)


def test_aclose_releases_and_a_closed_or_unstarted_lock_never_leads(
    redis_url: str, key: str
) -> None:
    async def scenario() -> None:
        a = LeaderLock(redis_url, key, ttl=5, holder="a")
        assert await a.acquire() is None  # not started
        await a.start()
        assert await a.acquire() is not None
        await a.aclose()
        assert stored(key) is None
        assert await a.acquire() is None
        assert not await a.renew()

    run(scenario)


def test_the_default_holder_names_host_and_process() -> None:
    lock = LeaderLock(None, "k", ttl=1)
    assert lock.holder.startswith(f"{socket.gethostname()}:")
    assert lock.holder != LeaderLock(None, "k", ttl=1).holder


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        LeaderLock(None, "k", ttl=0)
    with pytest.raises(ValueError, match="must be > 0"):
        LeaderLock(None, "k", ttl=1, op_timeout=-1)


def test_without_redis_a_lone_replica_leads_itself() -> None:
    async def scenario() -> None:
        lock = LeaderLock(None, "k", ttl=5, holder="solo")
        await lock.start()
        assert await lock.current() == (None, None)
        assert await lock.acquire() == 1
        assert await lock.acquire() == 1
        assert await lock.renew()
        assert lock.token() == 1
        assert await lock.current() == ("solo", 1)
        await lock.release()
        assert lock.token() is None and not await lock.renew()
        assert await lock.current() == (None, None)
        assert await lock.acquire() == 2  # tokens keep growing
        await lock.aclose()

    run(scenario)


def test_a_local_lead_lapses_without_renewal() -> None:
    async def scenario() -> None:
        lock = LeaderLock(None, "k", ttl=0.1)
        assert await lock.acquire() == 1
        await asyncio.sleep(0.15)
        assert lock.token() is None
        assert await lock.renew()  # nobody else could have taken it
        assert lock.token() == 1

    run(scenario)


def test_unreachable_redis_leads_locally_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    with socket.socket() as sock:  # bound, not listening: connections are refused
        sock.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{sock.getsockname()[1]}/0"

        async def scenario() -> None:
            lock = LeaderLock(url, "k", ttl=5, holder="alone", op_timeout=0.2, retry_interval=0.05)
            await lock.start()
            started = time.monotonic()
            try:
                assert await lock.acquire() == 1
                await asyncio.sleep(0.06)  # past retry_interval: Redis is tried (and fails) again
                assert await lock.renew()
                assert await lock.acquire() == 1
                assert await lock.current() == ("alone", 1)
            finally:
                await lock.aclose()
            assert time.monotonic() - started < 2

        run(scenario)
    warnings = records(caplog, logging.WARNING)
    assert len(warnings) == 1
    assert "leading alone" in warnings[0].getMessage()
    assert "127.0.0.1" in warnings[0].getMessage()


def test_when_redis_comes_back_the_local_lead_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    procs: list[subprocess.Popen[bytes]] = []

    async def scenario() -> None:
        lock = LeaderLock(url, "leader", ttl=5, holder="a", op_timeout=0.2, retry_interval=0.05)
        other = LeaderLock(url, "leader", ttl=5, holder="b", op_timeout=0.2)
        await lock.start()  # nothing listens yet
        try:
            assert await lock.acquire() == 1
            assert await lock.acquire() == 1
            procs.append(subprocess.Popen(redis_command(port, tmp_path), stdout=subprocess.DEVNULL))
            deadline = time.monotonic() + 5
            while not ping(port):
                assert time.monotonic() < deadline, "redis-server did not start"
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.06)
            assert not await lock.renew()  # Redis is back: the local lead ends
            await other.start()
            token = await lock.acquire()
            assert token is not None and token > 1  # above the local token it used
            assert await other.acquire() is None
            assert await other.current() == ("a", token)
        finally:
            await lock.aclose()
            await other.aclose()

    try:
        run(scenario)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=5)
    assert len(records(caplog, logging.WARNING)) == 1
    assert [r.getMessage() for r in records(caplog, logging.INFO)] == [
        "leader lock: Redis at 127.0.0.1 is back"
    ]


def test_redis_failing_under_a_leader_ends_its_redis_lead(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    port = free_port()
    proc = start_redis(port, tmp_path)
    try:

        async def scenario() -> None:
            url = f"redis://127.0.0.1:{port}/0"
            lock = LeaderLock(url, "leader", ttl=5, holder="a", op_timeout=0.2, retry_interval=5)
            await lock.start()
            try:
                token = await lock.acquire()
                assert token == 1
                proc.kill()
                proc.wait(timeout=5)
                assert not await lock.renew()  # cannot be confirmed: no longer leading
                assert lock.token() is None
                local = await lock.acquire()  # Redis is down: this replica leads alone
                assert local == 2
                assert await lock.renew()
            finally:
                await lock.aclose()

        run(scenario)
    finally:
        proc.kill()
        proc.wait(timeout=5)
    assert len(records(caplog, logging.WARNING)) == 1
