"""The Redis client helper both shared/state.py and shared/leader.py open their clients with."""

from __future__ import annotations

import anyio
from redis.asyncio import BlockingConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.shared.connection import close_quietly, failure, open_client, where


def test_where_names_the_server_without_credentials() -> None:
    assert where("redis://user:secret@cache.internal:6379/0") == "cache.internal"
    assert where("unix:///run/redis.sock") == "/run/redis.sock"
    assert where(None) == ""


def test_every_step_is_bounded_by_op_timeout_and_never_retried() -> None:
    client = open_client("redis://127.0.0.1:1/0", 0.25)
    pool = client.connection_pool
    assert isinstance(pool, BlockingConnectionPool)
    assert pool.timeout == 0.25  # waiting for a free pooled connection
    options = pool.connection_kwargs
    assert options["socket_timeout"] == options["socket_connect_timeout"] == 0.25
    assert options["decode_responses"] is True
    assert options["retry"].get_retries() == 0
    assert pool.max_connections == 50  # redis-py's default unless asked
    assert open_client("redis://127.0.0.1:1/0", 0.25, 64).connection_pool.max_connections == 64


def test_closing_a_client_whose_redis_is_gone_is_quiet() -> None:
    async def main() -> None:
        client = open_client("redis://127.0.0.1:1/0", 0.25)  # nothing listens on port 1
        try:
            await client.ping()
        except RedisConnectionError as exc:
            assert failure(exc) and "\n" not in failure(exc)
        await close_quietly(client)

    anyio.run(main)
    assert failure(TimeoutError()) == "TimeoutError"
