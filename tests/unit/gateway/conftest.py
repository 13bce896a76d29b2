"""Fixtures for gateway tests: a vLLM look-alike stub tier (tests/stub_tier.py), real
uvicorn servers on 127.0.0.1, and a real Redis with a key prefix per test."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any
from uuid import uuid4

import httpx
import openai
import pytest
import redis

from backends.process import free_port
from gateway.app import create_app
from gateway.config import GatewayConfig, TierEndpoint
from gateway.server import server_options
from tests.redis_server import ping, start_redis, stop
from tests.servers import ServerThread
from tests.stub_tier import MODEL, WAIT, StubTier


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


@pytest.fixture
def start_server() -> Iterator[Callable[..., str]]:
    """Start an ASGI app on 127.0.0.1 (keywords: more uvicorn settings); returns its base URL.
    Stopped after the test."""
    servers: list[ServerThread] = []

    def start(app: Any, **options: Any) -> str:
        server = ServerThread(app, **options)
        server.start()
        servers.append(server)
        return server.url

    yield start
    for server in reversed(servers):
        server.stop()


@pytest.fixture
def make_stub(start_server: Callable[..., str]) -> Callable[[], StubTier]:
    """Start another stub tier."""

    def make() -> StubTier:
        stub = StubTier()
        stub.url = start_server(stub.app)
        return stub

    return make


@pytest.fixture
def stub(make_stub: Callable[[], StubTier]) -> StubTier:
    return make_stub()


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A 127.0.0.1 URL whose port is bound but not listening: connections are refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


@pytest.fixture
def start_gateway(start_server: Callable[..., str]) -> Callable[..., str]:
    """Start the real gateway over the given tier URLs (named t0, t1, ...), served with the
    gateway's own uvicorn settings (gateway/server.py); returns its URL."""

    def start(*tier_urls: str, **overrides: Any) -> str:
        tiers = [TierEndpoint(name=f"t{i}", base_url=url) for i, url in enumerate(tier_urls)]
        config = GatewayConfig(model_name=MODEL, tiers=tiers, **overrides)
        return start_server(create_app(config), **server_options(config))

    return start


def official_client(gateway: str) -> openai.OpenAI:
    """The official ``openai`` client on a gateway's URL: no retries, bounded timeout, no
    env proxies."""
    return openai.OpenAI(
        base_url=f"{gateway}/v1",
        api_key="x",
        max_retries=0,
        timeout=10,
        http_client=openai.DefaultHttpxClient(trust_env=False),
    )


@pytest.fixture
def two_tier_policy(tmp_path: Any) -> Callable[..., str]:
    """Write a routing policy over tiers t0 and t1 (every class routed t0, then t1) with the
    given sections (name=flow-style YAML); returns its path."""

    def write(**sections: str) -> str:
        route = "[t0, t1]"
        text = (
            f"tiers: [t0, t1]\nroutes: {{tolerant: {route}, code: {route}, math: {route}, "
            f"long: {route}}}\n"
        )
        text += "".join(f"{name}: {value}\n" for name, value in sections.items())
        path = tmp_path / f"routing-{uuid4().hex[:8]}.yaml"
        path.write_text(text)
        return str(path)

    return write


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    """A plain HTTP client (no env proxies) with bounded timeouts."""
    with httpx.Client(trust_env=False, timeout=WAIT) as http:
        yield http
