"""The request log (gateway/request_log.py): every 5xx, a sample of the rest, one JSON line
each — the decision with plain values, and the gateway writing it for real requests."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest

from gateway.request_log import RequestLog, RequestRecord, should_log

CHAT = {"messages": [{"role": "user", "content": "Capital of France?"}]}


@pytest.mark.parametrize(
    ("status", "sample", "draw", "logged"),
    [
        (200, 0.0, 0.0, False),  # sampling off: no 2xx at all
        (200, 0.01, 0.005, True),
        (200, 0.01, 0.5, False),
        (429, 0.01, 0.5, False),  # refusals are sampled like answers
        (502, 0.0, 0.99, True),  # every 5xx, whatever the draw
        (503, 0.0, 0.99, True),
        (200, 1.0, 0.999, True),
    ],
)
def test_should_log(status: int, sample: float, draw: float, logged: bool) -> None:
    assert should_log(status, sample, draw) is logged


def test_a_sample_of_one_in_ten_logs_about_one_in_ten() -> None:
    draws = iter([i / 1000 for i in range(1000)])
    log = RequestLog(0.1, draw=lambda: next(draws))
    assert sum(log.wants(200) for _ in range(1000)) == 100


def test_the_gateway_logs_every_5xx_and_its_sample(
    stub: Any,
    start_gateway: Any,
    client: httpx.Client,
    refused_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.requests")
    gateway = start_gateway(stub.url, request_log_sample=1.0)
    assert client.post(f"{gateway}/v1/chat/completions", json=CHAT).status_code == 200
    down = start_gateway(refused_url, request_log_sample=0.0)
    assert client.post(f"{down}/v1/chat/completions", json=CHAT).status_code >= 500
    quiet = start_gateway(stub.url, request_log_sample=0.0)
    assert client.post(f"{quiet}/v1/chat/completions", json=CHAT).status_code == 200

    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "gateway.requests"]
    assert [line["status"] for line in lines] == [200, lines[1]["status"]]
    assert lines[1]["status"] >= 500 and lines[1]["error"]
    answered = lines[0]
    assert set(answered) == set(RequestRecord.__dataclass_fields__)
    assert answered["tier"] == "t0" and answered["path"] == "/v1/chat/completions"
    assert answered["duration_ms"] > 0 and len(answered["trace_id"]) == 32
    levels = [r.levelno for r in caplog.records if r.name == "gateway.requests"]
    assert levels == [logging.INFO, logging.WARNING]
