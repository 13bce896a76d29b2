"""Gateways beside the stack's real tiers: spans per request, and two replicas sharing Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from backends.process import free_port
from gateway.app import create_app
from gateway.config import GatewayConfig, TierEndpoint, hash_key
from model_optimizer.envs import ROOT, cache_root
from tests.integration.conftest import Stack
from tests.servers import ServerThread

pytestmark = pytest.mark.integration
MODEL = "SmolLM2-135M-Instruct"
KEY = "replica-admin-key"
CHAT = [{"role": "user", "content": "Hi! How are you doing today?"}]


def _config(stack: Stack, **extra: Any) -> GatewayConfig:
    tiers = [
        TierEndpoint(name=name, base_url=url, max_model_len=2048)
        for name, url in stack.tier_urls.items()
    ]
    return GatewayConfig(
        model_name=MODEL,
        tiers=tiers,
        policy_path=str(ROOT / "policies" / "routing.yaml"),
        tokenizer_dir=str(cache_root() / "variants" / MODEL / "fp16"),
        **extra,
    )


def test_each_request_exports_a_span_tree(stack: Stack) -> None:
    exporter = InMemorySpanExporter()
    server = ServerThread(create_app(_config(stack), span_exporter=exporter))
    server.start()
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=120)
        for _ in range(2):
            client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)  # type: ignore[arg-type]
    finally:
        server.stop()
    spans = exporter.get_finished_spans()
    requests = [span for span in spans if span.name == "gateway.request"]
    assert len(requests) == 2
    for request in requests:
        attributes = dict(request.attributes or {})
        assert attributes["gateway.route.class"] == "tolerant"
        assert attributes["gateway.route.tier"] == "int4"
        assert attributes["gen_ai.usage.input_tokens"] > 0
        assert attributes["gen_ai.usage.output_tokens"] > 0
        assert "tolerant" in str(attributes["gateway.route.reason"])
        trace_id = request.context.trace_id
        children = {
            span.name: span
            for span in spans
            if span.parent is not None and span.parent.span_id == request.context.span_id
        }
        assert set(children) == {"classify", "route", "upstream"}
        assert all(child.context.trace_id == trace_id for child in children.values())
        # The request span hangs under the server span of the ASGI instrumentation.
        assert request.parent is not None
        server_spans = [s for s in spans if s.context.span_id == request.parent.span_id]
        assert server_spans and server_spans[0].name.startswith("POST")


@pytest.fixture
def two_replicas(stack: Stack, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Two ``python -m gateway`` processes over the stack's tiers, sharing one Redis prefix."""
    config = _config(
        stack,
        redis_url="redis://127.0.0.1:6379/0",
        redis_prefix=f"mo:test:{uuid.uuid4().hex[:8]}",
        admin_key_hashes=[hash_key(KEY)],
        metrics_interval=1.0,
    )
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    processes: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        for i in range(2):
            port = free_port()
            log = (tmp_path / f"gateway{i}.log").open("wb")
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "gateway", "--config", str(path), "--port", str(port)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=ROOT,
                    env={**os.environ, "PYTHONPATH": str(ROOT)},
                )
            )
            urls.append(f"http://127.0.0.1:{port}")
        for url, process in zip(urls, processes, strict=True):
            _wait_ready(url, process)
        yield urls[0], urls[1]
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def test_two_gateway_processes_see_the_same_in_flight_counts(
    two_replicas: tuple[str, str],
) -> None:
    first, second = two_replicas
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 200, "ignore_eos": True}
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(httpx.post, f"{first}/v1/chat/completions", json=body, timeout=120)
        # The second replica never sees this request, yet counts it (through Redis).
        _wait_until(lambda: _in_flight(second).get("int4") == 1 and not answer.done())
        assert _in_flight(first)["int4"] == 1
        response = answer.result(timeout=120)
    assert response.status_code == 200, response.text
    assert response.headers["x-route-tier"] == "int4"
    assert response.json()["usage"]["completion_tokens"] == 200
    _wait_until(lambda: _in_flight(second)["int4"] == 0 and _in_flight(first)["int4"] == 0)


def _wait_until(condition: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)


def _in_flight(url: str) -> dict[str, int]:
    response = httpx.get(f"{url}/admin/tiers", headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 200, response.text
    payload = response.json()
    assert payload["shared_state"] is True
    return {name: int(entry["in_flight"]) for name, entry in payload["tiers"].items()}


def _wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, f"gateway at {url} exited with {process.returncode}"
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    pytest.fail(f"gateway at {url} not ready in 60 s")
