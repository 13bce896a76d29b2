"""model_optimizer/soak.py against a real gateway over stub tiers (127.0.0.1): streamed and
whole requests, kills on a schedule, broken streams counted as lost."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.app import create_app
from gateway.config import GatewayConfig, TierEndpoint
from gateway.server import server_options
from model_optimizer.soak import STREAM_BROKEN, render, soak
from tests.servers import ServerThread
from tests.stub_tier import MODEL, StubTier


@pytest.fixture
def servers() -> Iterator[list[ServerThread]]:
    started: list[ServerThread] = []
    yield started
    for server in reversed(started):
        server.stop()


def _start(servers: list[ServerThread], app: object, **options: object) -> str:
    server = ServerThread(app, **options)
    server.start()
    servers.append(server)
    return server.url


def _gateway(servers: list[ServerThread], *stubs: StubTier) -> str:
    for stub in stubs:
        stub.url = _start(servers, stub.app)
    tiers = [TierEndpoint(name=f"t{i}", base_url=s.url) for i, s in enumerate(stubs)]
    config = GatewayConfig(model_name=MODEL, tiers=tiers)
    return _start(servers, create_app(config), **server_options(config))


def test_kills_land_on_schedule_and_continued_streams_lose_nothing(
    servers: list[ServerThread],
) -> None:
    first, second = StubTier(), StubTier()
    gateway = _gateway(servers, first, second)

    def kill() -> str:  # the first tier now drops every stream after two chunks
        first.mode = "die"
        return "t0"

    result = soak(gateway, MODEL, clients=2, seconds=2.0, kill_every=0.5, kill=kill)
    assert result.kills[:1] == ("t0",) and 2 <= len(result.kills) <= 4
    assert result.sent >= 8 and result.lost == 0, result.statuses
    assert any(r["body"].get("continue_final_message") for r in second.requests)
    assert "| t0, t0" in render(result)


def test_a_stream_ending_in_an_error_event_counts_as_lost(servers: list[ServerThread]) -> None:
    only = StubTier()
    only.mode = "die"  # no tier to continue on: the stream ends with the error event
    gateway = _gateway(servers, only)
    result = soak(gateway, MODEL, clients=1, seconds=0.5)
    assert result.statuses.get(STREAM_BROKEN, 0) >= 1, result.statuses
    assert result.lost == result.statuses[STREAM_BROKEN]  # whole answers still come (no stream)
