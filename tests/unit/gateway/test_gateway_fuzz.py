"""Bad input: schemathesis fuzzes the gateway from its own OpenAPI document, plus hand-made
cases. Every answer must be 2xx or a 4xx in OpenAI's error shape: never a 5xx, never a dead
process. The counts of inputs tried are printed (``pytest -s``) and asserted."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from gateway.config import hash_key
from gateway.openapi import openapi_document

KEY = "sk-fuzz"
AUTH = {"Authorization": f"Bearer {KEY}"}
EXAMPLES = 150  # per operation and generation mode


def _check(response: Any, tried: list[int]) -> None:
    tried.append(response.status_code)
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error"}, body
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        assert "\n" not in body["error"]["message"]


def test_the_openapi_document_is_served(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(stub.url)
    served = client.get(f"{gateway}/openapi.json").json()
    assert served == openapi_document()
    assert set(served["paths"]) >= {"/v1/chat/completions", "/v1/completions", "/v1/models"}


def test_schemathesis_finds_no_5xx(stub: Any, start_gateway: Any) -> None:
    gateway = start_gateway(stub.url, api_key_hashes=[hash_key(KEY)], max_body_bytes=20_000)
    schema = schemathesis.openapi.from_dict(openapi_document())
    tried: list[int] = []
    for path, method in [
        ("/v1/chat/completions", "POST"),
        ("/v1/completions", "POST"),
        ("/v1/models", "GET"),
    ]:
        operation = schema[path][method]
        modes = [GenerationMode.POSITIVE]
        if method == "POST":
            modes.append(GenerationMode.NEGATIVE)
        for mode in modes:

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(operation.as_strategy(generation_mode=mode))
            def run(case: Any) -> None:
                _check(case.call(base_url=gateway, headers=AUTH, timeout=30), tried)

            run()
    print(f"schemathesis: {len(tried)} inputs, statuses {sorted(set(tried))}")
    assert len(tried) >= 300
    assert any(status == 200 for status in tried) and any(400 <= s < 500 for s in tried)


HAND_MADE: list[tuple[str, dict[str, Any], int]] = [
    ("malformed JSON", {"content": b'{"messages": [', "headers": AUTH}, 400),
    ("a JSON array", {"content": b"[1, 2]", "headers": AUTH}, 400),
    ("invalid UTF-8", {"content": b'{"messages": "\xff\xfe"}', "headers": AUTH}, 400),
    ("messages missing", {"json": {}, "headers": AUTH}, 400),
    ("messages empty", {"json": {"messages": []}, "headers": AUTH}, 400),
    ("messages a string", {"json": {"messages": "hi"}, "headers": AUTH}, 400),
    ("a message without role", {"json": {"messages": [{"content": "x"}]}, "headers": AUTH}, 400),
    (
        "max_tokens negative",
        {"json": {"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}},
        400,
    ),
    (
        "max_tokens a string",
        {"json": {"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}},
        400,
    ),
    ("model not served", {"json": {"model": "gpt-9", "messages": []}}, 404),
    ("model a number", {"json": {"model": 7, "messages": []}}, 400),
    ("body over the limit", {"content": b'{"x": "' + b"a" * 30_000 + b'"}'}, 413),
    ("no API key", {"json": {"messages": [{"role": "user", "content": "x"}]}, "auth": None}, 401),
    ("a wrong API key", {"json": {"messages": []}, "auth": "sk-wrong"}, 401),
]


@pytest.mark.parametrize(
    ("what", "request_args", "status"), HAND_MADE, ids=[h[0] for h in HAND_MADE]
)
def test_hand_made_bad_input_is_a_4xx_in_openai_shape(
    what: str,
    request_args: dict[str, Any],
    status: int,
    stub: Any,
    start_gateway: Any,
    client: httpx.Client,
) -> None:
    gateway = start_gateway(stub.url, api_key_hashes=[hash_key(KEY)], max_body_bytes=20_000)
    args = dict(request_args)
    headers = dict(args.pop("headers", AUTH))
    if "auth" in args:
        key = args.pop("auth")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
    headers.setdefault("content-type", "application/json")
    response = client.post(f"{gateway}/v1/chat/completions", headers=headers, **args)
    assert response.status_code == status, response.text
    _check(response, [])
    assert client.get(f"{gateway}/healthz").status_code == 200  # the process lives on
    assert stub.requests == []  # nothing reached the tier


def test_unknown_fields_travel_to_the_tier(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(stub.url)
    body = {"messages": [{"role": "user", "content": "x"}], "x_custom": {"a": 1}}
    assert client.post(f"{gateway}/v1/chat/completions", json=body).status_code == 200
    assert stub.last_request["body"]["x_custom"] == {"a": 1}


@pytest.mark.parametrize(
    "path", ["/reset_prefix_cache", "/sleep", "/wake_up", "/v1/load_lora_adapter", "/metrics/x"]
)
def test_vllm_development_endpoints_are_not_reachable_through_the_gateway(
    path: str, stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(stub.url)
    response = client.post(f"{gateway}{path}", json={})
    assert response.status_code in (404, 405)
    _check(response, [])
    assert stub.requests == []
