"""create_app, its lifespan, routing errors, serve and ``python -m gateway``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

import gateway.__main__ as gateway_main
import gateway.app as gateway_app
from gateway import GatewayConfig, TierEndpoint, create_app
from gateway.request.upstream import Upstream

KEYS = {"message", "type", "param", "code"}


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
