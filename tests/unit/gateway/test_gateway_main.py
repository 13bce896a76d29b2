"""``python -m gateway`` refuses to listen beyond loopback without API keys."""

from __future__ import annotations

from pathlib import Path

import pytest

import gateway.__main__ as gateway_main
from gateway.config import GatewayConfig, hash_key

CONFIG = "model_name: m\ntiers: [{name: fp16, base_url: 'http://127.0.0.1:8001'}]\n"


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[tuple[GatewayConfig, str, int]]:
    calls: list[tuple[GatewayConfig, str, int]] = []
    monkeypatch.setattr(
        gateway_main, "serve", lambda config, host, port: calls.append((config, host, port))
    )
    monkeypatch.delenv("MO_GATEWAY_API_KEYS", raising=False)
    return calls


def _config(tmp_path: Path, extra: str = "") -> str:
    path = tmp_path / "gateway.yaml"
    path.write_text(CONFIG + extra, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "gateway.example"])
def test_beyond_loopback_without_keys_is_refused(
    host: str,
    tmp_path: Path,
    served: list[tuple[GatewayConfig, str, int]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert gateway_main.main(["--config", _config(tmp_path), "--host", host]) == 2
    assert served == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert host in err and "MO_GATEWAY_API_KEYS" in err


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_needs_no_keys(
    host: str, tmp_path: Path, served: list[tuple[GatewayConfig, str, int]]
) -> None:
    assert gateway_main.main(["--config", _config(tmp_path), "--host", host]) == 0
    assert served[0][1] == host


def test_beyond_loopback_with_keys_from_the_environment_serves(
    tmp_path: Path, served: list[tuple[GatewayConfig, str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MO_GATEWAY_API_KEYS", "client-key")
    assert gateway_main.main(["--config", _config(tmp_path), "--host", "0.0.0.0"]) == 0
    assert served[0][0].api_key_hashes == [hash_key("client-key")]


def test_beyond_loopback_with_hashed_keys_in_the_file_serves(
    tmp_path: Path, served: list[tuple[GatewayConfig, str, int]]
) -> None:
    path = _config(tmp_path, f"api_key_hashes: ['{hash_key('k')}']\n")
    assert gateway_main.main(["--config", path, "--host", "0.0.0.0"]) == 0
