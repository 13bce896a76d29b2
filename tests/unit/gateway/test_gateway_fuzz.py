"""Bad input: schemathesis fuzzes the gateway as shipped (tests/shipped_fuzz.py: up's
configuration, the shipped policy and body limit, the default model's real tokenizer; stub
tiers) from its own OpenAPI document, valid and invalid cases counted apart; plus hand-made
cases. Valid: a 2xx or a 4xx over a limit; invalid: a 4xx; never a 5xx, never a dead process.
The counts are printed (``pytest -s``) and asserted. 10,000 and more: benchmarks/bench_fuzz.py.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.config import hash_key
from gateway.openapi import openapi_document
from gateway.policy.schema import LimitsPolicy
from tests.shipped_fuzz import (
    default_tokenizer_dir,
    fuzz,
    judge,
    shipped_gateway,
)
from tests.stub_tier import StubTier

KEY = "sk-fuzz"
AUTH = {"Authorization": f"Bearer {KEY}"}
EXAMPLES = 60  # per operation and mode: ~240 cases, ~15 s here (the benchmark runs 10,000+)


def _check(response: Any, tried: list[int]) -> None:
    tried.append(response.status_code)
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error"}, body
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        assert "\n" not in body["error"]["message"]


def _error(code: str) -> dict[str, Any]:
    return {"message": "m", "type": "invalid_request_error", "param": None, "code": code}


@pytest.fixture(scope="module")
def shipped() -> Iterator[tuple[str, list[StubTier]]]:
    with shipped_gateway(default_tokenizer_dir()) as running:
        yield running


def test_the_openapi_document_is_served(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(stub.url)
    served = client.get(f"{gateway}/openapi.json").json()
    assert served == openapi_document("stub-model", LimitsPolicy())
    assert set(served["paths"]) >= {"/v1/chat/completions", "/v1/completions", "/v1/models"}
    chat = served["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]
    assert chat["application/json"]["schema"]["properties"]["model"]["enum"] == ["stub-model"]
    # The fields the gateway bounds by the policy are declared with those bounds (a fuzzer that
    # drew an 'n' of -4.8e16 as "any value" once found the document silent on them).
    fields = chat["application/json"]["schema"]["properties"]
    assert (fields["n"]["minimum"], fields["n"]["maximum"]) == (1, LimitsPolicy().max_n)
    assert fields["top_logprobs"]["maximum"] == LimitsPolicy().max_logprobs
    assert fields["tools"]["maxItems"] == LimitsPolicy().max_tools
    # What the policy's fields refuse may take no value; what it bounds, only what it allows.
    assert fields["kv_transfer_params"]["not"] == {} and fields["cache_salt"]["not"] == {}
    assert fields["logprob_token_ids"]["maxItems"] == LimitsPolicy().max_logprobs
    assert fields["chat_template_kwargs"]["additionalProperties"] is False


def test_the_shipped_gateway_uses_the_shipped_configuration(
    shipped: tuple[str, list[StubTier]],
) -> None:
    url, stubs = shipped
    with httpx.Client(trust_env=False, timeout=30) as client:
        # The real tokenizer with the shipped limits: a prompt over max_input_tokens (1536).
        long = {"prompt": "hello " * 1600}
        refused = client.post(f"{url}/v1/completions", json=long)
        answered = client.post(f"{url}/v1/completions", json={"prompt": "hello " * 300})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    assert "1536" in refused.json()["error"]["message"]
    # The shipped 1 MB body limit: a request announcing 1,000,001 bytes is refused before its
    # body is read (sending the body would race the gateway closing the connection).
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        sock.sendall(f"{head}content-length: 1000001\r\n\r\n".encode())
        assert sock.recv(4096).startswith(b"HTTP/1.1 413 ")
    assert answered.status_code == 200 and answered.headers["x-route-class"] == "tolerant"
    assert sum(len(s.requests) for s in stubs) >= 1


def test_schemathesis_on_the_shipped_gateway(shipped: tuple[str, list[StubTier]]) -> None:
    url, stubs = shipped
    tally = fuzz(url, stubs, EXAMPLES)
    summary = tally.summary()
    print(f"schemathesis, gateway as shipped: {json.dumps(summary)}")
    assert tally.findings == [], tally.findings[:10]
    assert tally.server_errors() == 0
    positive, negative = summary["positive"], summary["negative"]
    assert positive["cases"] >= 100 and negative["cases"] >= 100
    assert all(400 <= status < 500 for status in negative["statuses"])
    assert negative["reached_a_tier"] == 0  # refused by the gateway itself, never forwarded
    assert positive["statuses"].get(200, 0) >= positive["cases"] // 2
    assert positive["reached_a_tier"] >= positive["cases"] // 2
    # The shapes schemathesis cannot write (tests/fuzz_shapes.py), each sent and judged.
    shaped = {key.split()[0] for key in summary["shapes"]}
    assert shaped == {"utf16", "utf16le", "utf32", "nonfinite", "extension", "surrogate", "parts"}
    with httpx.Client(trust_env=False, timeout=30) as client:
        assert client.get(f"{url}/healthz").status_code == 200  # the process lives on


@pytest.mark.parametrize(
    ("mode", "status", "body", "finding"),
    [
        ("positive", 200, {"id": "x"}, None),
        ("negative", 200, {"id": "x"}, "a 2xx to an invalid request"),
        ("positive", 502, None, "502 (a 5xx)"),
        ("negative", 500, {"error": {}}, "500 (a 5xx)"),
        ("negative", 400, {"detail": "no"}, "400 not in OpenAI's error shape"),
        ("positive", 400, {"error": _error("context_length_exceeded")}, None),
        ("positive", 413, {"error": _error("request_too_large")}, None),
        ("positive", 400, {"error": _error("invalid_value")}, "400 invalid_value to a valid"),
        ("negative", 404, {"error": _error("model_not_found")}, None),
        ("negative", 400, {"error": {**_error("x"), "message": "a\nb"}}, "multi-line"),
    ],
)
def test_what_counts_as_a_finding(mode: str, status: int, body: Any, finding: str | None) -> None:
    found = judge(mode, status, body)
    assert (found is None) if finding is None else (found is not None and finding in found)


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


def test_unknown_fields_are_answered_but_never_reach_the_tier(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    """As vLLM ignores fields it does not know, the gateway drops them (gateway/request/
    fields.py): the request is answered, the field goes no further; vLLM's known ones travel."""
    gateway = start_gateway(stub.url)
    body = {"messages": [{"role": "user", "content": "x"}], "x_custom": {"a": 1}, "top_k": 3}
    assert client.post(f"{gateway}/v1/chat/completions", json=body).status_code == 200
    assert "x_custom" not in stub.last_request["body"]
    assert stub.last_request["body"]["top_k"] == 3


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
