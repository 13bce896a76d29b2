"""create_app, its lifespan, routing errors, serve and ``python -m gateway``."""

from __future__ import annotations

import logging
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.testclient import TestClient

import gateway.__main__ as gateway_main
import gateway.app as gateway_app
from gateway.app import create_app
from gateway.config import GatewayConfig, TierEndpoint
from gateway.metrics import GatewayMetrics
from gateway.request.upstream.client import Upstream

KEYS = {"message", "type", "param", "code"}
WAIT = 10.0


def _config(url: str = "http://127.0.0.1:9") -> GatewayConfig:
    return GatewayConfig(
        model_name="m",
        tiers=[TierEndpoint(name="fp16", base_url=url)],
        connect_timeout=1.5,
        read_timeout=42.0,
    )


def test_create_app_has_no_side_effects_until_lifespan() -> None:
    config = _config()
    first, second = create_app(config), create_app(config)
    assert first is not second
    assert first.state.config is config
    assert not hasattr(first.state, "runtime")


def test_lifespan_owns_one_client() -> None:
    app = create_app(_config())
    with TestClient(app) as client:
        upstream = app.state.runtime.upstream
        assert isinstance(upstream, Upstream)
        http = upstream.client
        assert not http.is_closed
        assert http.trust_env is False
        assert (http.timeout.connect, http.timeout.read) == (1.5, 42.0)
        assert client.get("/healthz").status_code == 200
        assert app.state.runtime.upstream is upstream  # one client serves every request
    assert http.is_closed
    assert not hasattr(app.state, "runtime")


def test_unknown_route_and_wrong_method_use_error_shape(
    start_gateway: Any, refused_url: str, client: httpx.Client
) -> None:
    gateway = start_gateway(refused_url)
    missing = client.post(f"{gateway}/v1/embeddings", json={})
    assert missing.status_code == 404
    assert set(missing.json()["error"]) == KEYS
    assert "/v1/embeddings" in missing.json()["error"]["message"]

    wrong = client.get(f"{gateway}/v1/chat/completions")
    assert wrong.status_code == 405
    assert wrong.headers["allow"] == "POST"
    assert set(wrong.json()["error"]) == KEYS


def test_serve_binds_loopback_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(gateway_app.uvicorn, "run", lambda app, **kw: calls.append(kw))
    gateway_app.serve(_config(), port=8123)
    assert calls and calls[0]["host"] == "127.0.0.1"
    assert calls[0]["port"] == 8123
    assert calls[0]["limit_concurrency"] == 1024  # the gateway's limits (gateway/server.py)
    assert calls[0]["proxy_headers"] is False


def test_main_loads_config_and_serves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(
        "model_name: m\ntiers: [{name: fp16, base_url: 'http://127.0.0.1:8001'}]\n",
        encoding="utf-8",
    )
    calls: list[tuple[GatewayConfig, str, int]] = []
    monkeypatch.setattr(
        gateway_main, "serve", lambda config, host, port: calls.append((config, host, port))
    )
    assert gateway_main.main(["--config", str(path), "--port", "9000"]) == 0
    assert calls[0][0].model_name == "m"
    assert calls[0][1:] == ("127.0.0.1", 9000)


def test_main_reports_a_bad_config_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gateway_main.main(["--config", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "missing.yaml" in err


def test_healthz_is_503_while_no_runtime_is_alive() -> None:
    # Without its lifespan (not started, or torn down by a failure) the gateway answers every
    # /v1 request 500: /healthz must not say 200 then.
    response = TestClient(create_app(_config())).get("/healthz")
    assert response.status_code == 503
    assert set(response.json()["error"]) == KEYS
    assert response.json()["error"]["code"] == "not_alive"


def test_keep_running_logs_counts_and_restarts_a_failing_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = GatewayMetrics()
    calls: list[int] = []

    async def loop() -> None:
        calls.append(len(calls))
        if len(calls) <= 2:
            raise RecursionError("a bug")
        await anyio.sleep_forever()

    async def main() -> None:
        with anyio.move_on_after(WAIT):
            async with anyio.create_task_group() as group:
                group.start_soon(
                    partial(gateway_app.keep_running, delay=0.01), "scrape", loop, metrics
                )
                while len(calls) < 3:
                    await anyio.sleep(0.01)
                group.cancel_scope.cancel()

    anyio.run(main)
    assert len(calls) == 3
    text = metrics.render(None)[0].decode()
    assert 'gateway_background_errors_total{loop="scrape"} 2.0' in text
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and "scrape" in errors[0].getMessage()


def test_a_failing_scrape_does_not_take_the_gateway_down(
    stub: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An exception in a background loop ended the lifespan's task group: the runtime was torn
    # down and every /v1 request answered 500 while /healthz said 200.
    config = GatewayConfig(
        model_name="stub-model",
        tiers=[TierEndpoint(name="t0", base_url=stub.url)],
        metrics_interval=0.05,
    )
    app = create_app(config)
    with TestClient(app) as client:
        real = gateway_app.apply_shared_marks
        failures: list[int] = []

        async def broken(*args: Any) -> None:
            failures.append(1)
            raise ValueError("a bad shared value")

        monkeypatch.setattr(gateway_app, "apply_shared_marks", broken)
        deadline = time.monotonic() + WAIT
        while len(failures) < 2:  # failed, and was started again
            assert time.monotonic() < deadline
            time.sleep(0.02)
        monkeypatch.setattr(gateway_app, "apply_shared_marks", real)
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
        assert client.get("/healthz").status_code == 200
        assert 'gateway_background_errors_total{loop="scrape"}' in client.get("/metrics").text


def test_a_deeply_nested_policy_edit_leaves_the_gateway_serving_and_a_fix_applies(
    stub: Any, start_gateway: Any, client: httpx.Client, tmp_path: Path
) -> None:
    # The case: the edit raised RecursionError out of the watch, the lifespan tore
    # the runtime down (every /v1 request and /readyz 500) and restoring the file did not help.
    route = "[t0]"
    good = (
        f"tiers: [t0]\nroutes: {{tolerant: {route}, code: {route}, math: {route}, long: {route}}}\n"
    )
    policy = tmp_path / "routing.yaml"
    policy.write_text(good)
    gateway = start_gateway(stub.url, policy_path=str(policy), metrics_interval=0.2)
    chat = {"messages": [{"role": "user", "content": "hi"}]}

    def reloads(outcome: str) -> bool:
        text = client.get(f"{gateway}/metrics").text
        return f'gateway_policy_reloads_total{{outcome="{outcome}"}} 1.0' in text

    policy.write_text(good + "saturation: " + "[" * 5000 + "]" * 5000 + "\n")
    deadline = time.monotonic() + WAIT
    while not reloads("rejected"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert client.post(f"{gateway}/v1/chat/completions", json=chat).status_code == 200
    assert client.get(f"{gateway}/readyz").status_code == 200
    assert client.get(f"{gateway}/healthz").status_code == 200
    policy.write_text(good + "saturation: {max_requests_waiting: 8}\n")
    while not reloads("applied"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert client.post(f"{gateway}/v1/chat/completions", json=chat).status_code == 200
