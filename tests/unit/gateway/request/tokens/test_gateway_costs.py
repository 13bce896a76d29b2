"""Client fields that multiply a request's cost, checked against the policy's limits."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.errors import APIError
from gateway.policy.schema import LimitsPolicy
from gateway.request.kind import Kind
from gateway.request.tokens.costs import request_cost

CHAT = Kind.CHAT
COMPLETIONS = Kind.COMPLETIONS
LIMITS = LimitsPolicy()  # the defaults
MESSAGES = [{"role": "user", "content": "Hi"}]


def _refused(body: dict[str, Any], kind: Kind = CHAT, limits: LimitsPolicy = LIMITS) -> APIError:
    with pytest.raises(APIError) as caught:
        request_cost(body, kind, limits)
    assert caught.value.status == 400
    assert caught.value.type == "invalid_request_error"
    assert "\n" not in caught.value.message
    return caught.value


def test_sane_defaults() -> None:
    assert (LIMITS.max_n, LIMITS.max_best_of, LIMITS.max_prompts) == (4, 4, 4)
    assert (LIMITS.max_logprobs, LIMITS.max_prompt_logprobs, LIMITS.max_tools) == (20, 0, 128)


def test_a_plain_request_costs_one() -> None:
    assert request_cost({"messages": MESSAGES}, CHAT, LIMITS) == 1
    assert request_cost({"prompt": "x", "stream": False, "n": None}, COMPLETIONS, LIMITS) == 1
    for temperature in (None, 0, 0.7, 3):  # vLLM sets no maximum
        assert request_cost({"prompt": "x", "temperature": temperature}, COMPLETIONS, LIMITS) == 1


def test_the_cost_is_the_sequences_generated() -> None:
    assert request_cost({"messages": MESSAGES, "n": 3}, CHAT, LIMITS) == 3
    assert request_cost({"prompt": ["a", "b"], "n": 2}, COMPLETIONS, LIMITS) == 4
    assert request_cost({"prompt": ["a", "b"], "n": 1, "best_of": 3}, COMPLETIONS, LIMITS) == 6
    assert request_cost({"prompt": [[1, 2], [3]]}, COMPLETIONS, LIMITS) == 2
    assert request_cost({"prompt": [1, 2, 3]}, COMPLETIONS, LIMITS) == 1  # one prompt of ids


@pytest.mark.parametrize(
    ("body", "kind", "param", "code"),
    [
        ({"stream": 1}, CHAT, "stream", "invalid_type"),
        ({"stream": "true"}, COMPLETIONS, "stream", "invalid_type"),
        ({"temperature": "0"}, CHAT, "temperature", "invalid_type"),
        ({"temperature": True}, COMPLETIONS, "temperature", "invalid_type"),
        ({"temperature": -0.5}, CHAT, "temperature", "invalid_value"),
        ({"temperature": float("nan")}, CHAT, "temperature", "invalid_value"),
        ({"n": 5}, CHAT, "n", "invalid_value"),
        ({"n": 0}, CHAT, "n", "invalid_value"),
        ({"n": True}, CHAT, "n", "invalid_type"),
        ({"n": 2.0}, COMPLETIONS, "n", "invalid_type"),
        ({"best_of": 5}, COMPLETIONS, "best_of", "invalid_value"),
        ({"best_of": 1, "n": 2}, COMPLETIONS, "best_of", "invalid_value"),
        ({"prompt": ["a"] * 5}, COMPLETIONS, "prompt", "invalid_value"),
        ({"prompt": [[1]] * 5}, COMPLETIONS, "prompt", "invalid_value"),
        ({"logprobs": 21}, COMPLETIONS, "logprobs", "invalid_value"),
        ({"logprobs": -1}, COMPLETIONS, "logprobs", "invalid_value"),
        ({"logprobs": 1}, CHAT, "logprobs", "invalid_type"),
        ({"logprobs": True, "top_logprobs": 21}, CHAT, "top_logprobs", "invalid_value"),
        ({"top_logprobs": -1}, CHAT, "top_logprobs", "invalid_value"),
        ({"prompt_logprobs": 1}, CHAT, "prompt_logprobs", "invalid_value"),
        ({"prompt_logprobs": -1}, COMPLETIONS, "prompt_logprobs", "invalid_value"),
        ({"echo": True, "logprobs": 1}, COMPLETIONS, "echo", "invalid_value"),
        ({"tools": [{"type": "function"}] * 129}, CHAT, "tools", "invalid_value"),
        ({"tools": {"type": "function"}}, CHAT, "tools", "invalid_type"),
    ],
)
def test_fields_past_their_limits_are_refused_naming_the_field(
    body: dict[str, Any], kind: Kind, param: str, code: str
) -> None:
    base = {"messages": MESSAGES} if kind is CHAT else {"prompt": "x"}
    error = _refused({**base, **body}, kind)
    assert (error.param, error.code) == (param, code)


def test_limits_are_the_policys() -> None:
    generous = LimitsPolicy(max_n=8, max_prompt_logprobs=2, max_prompts=2)
    assert request_cost({"messages": MESSAGES, "n": 8}, CHAT, generous) == 8
    body = {"prompt": "x", "echo": True, "logprobs": 2, "prompt_logprobs": 2}
    assert request_cost(body, COMPLETIONS, generous) == 1
    assert _refused({"prompt": ["a"] * 3}, COMPLETIONS, generous).param == "prompt"
    assert request_cost({"prompt": "x", "echo": True}, COMPLETIONS, LIMITS) == 1  # no logprobs


def test_stream_that_is_not_a_boolean_is_refused_before_any_tier(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    # "stream": 1 was a whole answer to the gateway (only True streams) and a stream to vLLM.
    gateway = start_gateway(stub.url)
    response = client.post(
        f"{gateway}/v1/chat/completions", json={"messages": MESSAGES, "stream": 1}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (
        "stream",
        "invalid_type",
        "invalid_request_error",
    )
    assert stub.requests == []
    response = client.post(f"{gateway}/v1/completions", json={"prompt": "x", "n": 100})
    assert response.status_code == 400 and response.json()["error"]["param"] == "n"
    assert stub.requests == []
