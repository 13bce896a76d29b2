"""``model-optimizer routes``: /admin/routes printed readably, and its failures in one line."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from model_optimizer import cli
from model_optimizer.routes import render

DOCUMENT: dict[str, Any] = {
    "reference": "fp16",
    "live_window": {"answers": 512, "seconds": 900.0},
    "classes": {
        "tolerant": {
            "tiers": ["int4", "fp16", "int8"], "overflow": ["int8"], "how": "derived",
            "reasons": {
                "int4": "agreement 0.930, 2.5 s/answer; gain 0.42 [0.35, 0.49] over fp16, n=8"
            },
            "last_change": {"at": "2026-12-06T04:00:00.000Z", "from": ["fp16", "int4"],
                            "to": ["int4", "fp16"], "reason": "policy sha256 abc applied: ..."},
        },
        "code": {
            "tiers": ["int8", "fp16"], "overflow": [], "how": "pinned", "reasons": {},
            "pin": "pinned; measurements prefer fp16 (agreement 1.000, 4.89 s/answer)",
            "last_change": {"at": "2026-12-06T03:00:00.000Z", "from": None, "to": ["int8", "fp16"],
                            "reason": "policy sha256 abc loaded: the route as written"},
        },
    },
    "tiers": {
        "fp16": {
            "calibration": {"ttft_ms": 200.0, "tpot_ms": 36.6, "throughput_tok_s": 27.3,
                            "samples": 8, "emulated": False},
            "live": {"n": 12, "streams": 10, "whole": 2,
                     "tpot_ms": {"n": 10, "median_ms": 35.1, "interval_ms": [33.0, 38.2]},
                     "tpot_by_load": {"2-4": {"tpot_ms": {"n": 4, "median_ms": 41.0}}}},
        },
        "int4": {"calibration": None, "live": None},
    },
}  # fmt: skip


def test_render_shows_each_class_and_each_tier() -> None:
    text = render(DOCUMENT)
    assert "tolerant: int4 -> fp16, then overflow int8  [derived]" in text
    assert "  int4: agreement 0.930, 2.5 s/answer; gain 0.42 [0.35, 0.49] over fp16, n=8" in text
    assert "  since 2026-12-06T04:00:00.000Z (was fp16, int4): policy sha256 abc" in text
    assert "code: int8 -> fp16  [pinned]\n  pinned; measurements prefer fp16" in text
    assert "(loaded): policy sha256 abc loaded" in text
    assert "fp16: calibration TTFT 200 ms, TPOT 36.6 ms, 27.3 tok/s under load (8 prompts)" in text
    assert "live: 12 answers (10 streamed); TPOT 35.1 ms [33, 38.2] (n=10)" in text
    assert "TPOT at load 2-4 41 ms (n=4)" in text
    assert "int4: not calibrated\n  live: no answers in the window" in text


def test_routes_asks_the_gateway_with_the_admin_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked: list[tuple[str, dict[str, str]]] = []

    def get(url: str, headers: dict[str, str], **_: Any) -> httpx.Response:
        asked.append((url, headers))
        return httpx.Response(200, json=DOCUMENT)

    monkeypatch.setattr(httpx, "get", get)
    monkeypatch.setenv("MO_GATEWAY_ADMIN_KEYS", "k1,k2")
    assert cli.main(["routes", "--gateway", "http://gw:9/", "--json"]) == 0
    assert asked == [("http://gw:9/admin/routes", {"authorization": "Bearer k1"})]
    assert json.loads(capsys.readouterr().out) == DOCUMENT


def test_routes_fails_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MO_GATEWAY_ADMIN_KEYS", raising=False)
    assert cli.main(["routes"]) == 2
    assert "needs MO_GATEWAY_ADMIN_KEYS" in capsys.readouterr().err
    monkeypatch.setenv("MO_GATEWAY_ADMIN_KEYS", "k")
    monkeypatch.setattr(httpx, "get", lambda *a, **k: httpx.Response(403))
    assert cli.main(["routes"]) == 1
    assert capsys.readouterr().err.strip().endswith("/admin/routes: HTTP 403")
