"""TierBoard: states from marks, supervisor and scrapes; scrape_tier against real servers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from backends.metrics import TierMetrics
from backends.tier_state import TierState
from gateway.config import TierEndpoint
from gateway.control.tier_status import Scrape, TierBoard, scrape_tier
from gateway.request.route.endpoint_choice import Saturation
from gateway.request.upstream.client import Upstream

DATA = Path(__file__).parents[2] / "backends" / "data"
TIERS = [
    TierEndpoint(name="fp16", base_url="http://127.0.0.1:1", max_model_len=2048),
    TierEndpoint(name="int4", base_url="http://127.0.0.1:2", max_model_len=1024),
]


def test_marks_win_then_supervisor_then_scrapes() -> None:
    states = {"fp16": TierState.READY, "int4": TierState.STARTING}
    board = TierBoard(TIERS, lambda: states)
    assert board.state("fp16") is TierState.READY  # never scraped: trusted
    assert board.state("int4") is TierState.STARTING
    board.record("fp16", Scrape(False, None, 0.0, "refused"))
    assert board.state("fp16") is TierState.DOWN
    board.record("fp16", Scrape(True, None, 1.0))
    board.set_state("fp16", TierState.DRAINING)
    assert board.state("fp16") is TierState.DRAINING
    board.set_state("fp16", None)
    assert board.state("fp16") is TierState.READY


def test_states_travel_as_their_plain_strings() -> None:
    board = TierBoard(TIERS, lambda: {"fp16": TierState.READY})  # int4: unknown, so down
    board.set_state("fp16", TierState.DRAINING)
    described = json.dumps({name: entry["state"] for name, entry in board.describe().items()})
    assert described == '{"fp16": "draining", "int4": "down"}'  # /admin/tiers, Redis health
    assert f"{board.state('fp16')} {board.state('int4')}" == "draining down"  # log lines


def test_statuses_carry_scraped_load_and_each_tiers_length() -> None:
    board = TierBoard(TIERS)
    metrics = TierMetrics(requests_waiting=3.0, kv_cache_usage=0.5)
    board.record("int4", Scrape(True, metrics, 0.0))
    statuses = board.statuses()
    assert list(statuses) == ["fp16", "int4"]
    assert (statuses["int4"].requests_waiting, statuses["int4"].kv_usage) == (3.0, 0.5)
    assert statuses["int4"].max_model_len == 1024
    assert (statuses["fp16"].requests_waiting, statuses["fp16"].kv_usage) == (0.0, 0.0)
    described = board.describe()
    assert described["int4"]["kv_cache_usage"] == 0.5
    assert described["fp16"]["scraped_seconds_ago"] is None


def _scrape(start_server: Any, routes: list[Route] | None, model: str = "m") -> Scrape:
    url = start_server(Starlette(routes=routes or []))
    tier = TierEndpoint(name="t", base_url=url)

    async def run() -> Scrape:
        async with httpx.AsyncClient(trust_env=False) as client:
            return await scrape_tier(Upstream(client), tier, model, 2.0, 7.0)

    return asyncio.run(run())


def test_scrape_reads_vllm_metrics(start_server: Any) -> None:
    sample = next(DATA.glob("*.txt")).read_text()

    async def metrics(request: Any) -> PlainTextResponse:
        return PlainTextResponse(sample)

    scrape = _scrape(start_server, [Route("/metrics", metrics)], model="SmolLM2-135M-Instruct")
    assert scrape.healthy and scrape.metrics is not None and scrape.at == 7.0


def test_scrape_falls_back_to_health_and_reports_down(start_server: Any, refused_url: str) -> None:
    async def health(request: Any) -> PlainTextResponse:
        return PlainTextResponse("")

    healthy = _scrape(start_server, [Route("/health", health)])
    assert healthy.healthy and healthy.metrics is None
    dead = _scrape(start_server, [])
    assert not dead.healthy and "404" in (dead.error or "")

    async def refused() -> Scrape:
        async with httpx.AsyncClient(trust_env=False) as client:
            tier = TierEndpoint(name="t", base_url=refused_url)
            return await scrape_tier(Upstream(client), tier, "m", 2.0, 0.0)

    gone = asyncio.run(refused())
    assert not gone.healthy and "unreachable" in (gone.error or "")


POOL = TierEndpoint.model_validate(
    {"name": "int8", "endpoints": ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]}
)
A, B = POOL.pool()


def test_a_pool_is_ready_while_any_endpoint_is() -> None:
    board = TierBoard([POOL])
    board.record("int8", Scrape(False, None, 0.0, "refused"), A)
    assert board.state("int8") is TierState.READY  # B never scraped: trusted
    board.set_endpoint_state("int8", B, TierState.DRAINING)
    assert board.state("int8") is TierState.DOWN  # none ready: the first endpoint's state
    assert [e.state for e in board.endpoint_statuses("int8")] == [
        TierState.DOWN,
        TierState.DRAINING,
    ]
    board.set_endpoint_state("int8", B, None)
    board.set_state("int8", TierState.RESETTING)  # a tier mark covers every endpoint
    assert {e.state for e in board.endpoint_statuses("int8")} == {TierState.RESETTING}
    board.record("int8", Scrape(True, None, 0.0), "http://elsewhere:1")  # not in the pool
    assert len(board.describe()["int8"]["endpoints"]) == 2  # type: ignore[arg-type]


def test_a_pool_is_saturated_only_when_every_endpoint_is() -> None:
    board = TierBoard([POOL])
    board.record("int8", Scrape(True, TierMetrics(requests_waiting=0.0, kv_cache_usage=0.95), 0), A)
    board.record("int8", Scrape(True, TierMetrics(requests_waiting=1.0, kv_cache_usage=0.1), 0), B)
    limits = Saturation(max_requests_waiting=4, max_kv_usage=0.9)
    status = board.statuses(limits)["int8"]
    assert (status.requests_waiting, status.kv_usage) == (1.0, 0.1)  # B's: A is saturated
    assert board.statuses()["int8"].kv_usage == 0.95  # without limits: the least loaded, A
    chain = board.endpoint_chain("int8", None, limits)
    assert [(e.name, e.base_url) for e in chain] == [("int8", B)]
    described = board.describe()["int8"]
    endpoints = described["endpoints"]
    assert isinstance(endpoints, list)
    assert [(e["url"], e["kv_cache_usage"]) for e in endpoints] == [(A, 0.95), (B, 0.1)]
    assert described["kv_cache_usage"] == 0.95  # the tier's own figures: its first endpoint's


def test_an_endpoint_is_made_once_and_forgotten_when_it_leaves_the_pool() -> None:
    board = TierBoard([POOL])
    first = board.endpoint("int8", A)
    assert (first.name, first.base_url) == ("int8", A)
    assert board.endpoint("int8", A) is first  # shared by every request to A
    assert board.endpoint("int8", B).base_url == B
    board.set_pool("int8", [B])
    board.set_pool("int8", [A, B])  # A left and came back: made again
    assert board.endpoint("int8", A) is not first
    assert board.endpoint("int8", A) == first


def test_an_endpoint_outside_the_pool_is_not_remembered() -> None:
    """A scrape still running for an endpoint its pool just dropped asks for it once more."""
    board = TierBoard([POOL])
    board.set_pool("int8", [A])
    gone = board.endpoint("int8", B)
    assert gone.base_url == B and board.endpoint("int8", B) is not gone
