"""Fixtures of the shared-state tests: a real Redis on 127.0.0.1 and a key prefix per test."""

from __future__ import annotations

from collections.abc import Iterator
from uuid import uuid4

import pytest
import redis

from backends.process import free_port
from tests.redis_server import ping, start_redis, stop


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Redis on 6379, or a throwaway one when it is not running."""
    if ping(6379):
        yield "redis://127.0.0.1:6379/0"
        return
    port = free_port()
    proc = start_redis(port, tmp_path_factory.mktemp("redis"))
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop(proc)


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A unique key prefix; its keys are deleted afterwards."""
    value = f"mo:test:{uuid4().hex}"
    yield value
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{value}:*"))
    if keys:
        client.delete(*keys)
    client.close()
