"""A whole answer asked as a stream, continued on the next tier when its own fails midway and
assembled (policy ``failover.whole_answers: continue``; gateway/request/completions/whole.py),
through a real gateway and real stub tiers on 127.0.0.1."""

from __future__ import annotations

from typing import Any

import httpx

from tests.unit.gateway.conftest import official_client

MODEL = "stub-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Capital of France?"}]}


def _dying_and_healthy(make_stub: Any) -> tuple[Any, Any]:
    dying, healthy = make_stub(), make_stub()
    dying.mode = "die"  # two chunks of a stream, then the connection drops
    dying.answer_id, healthy.answer_id, healthy.created = "chat-first", "chat-second", 99
    dying.role_chunk = healthy.role_chunk = True
    return dying, healthy


def _gateway(start_gateway: Any, policy: Any, *urls: str, **sections: str) -> str:
    """A gateway over ``urls`` whose policy continues whole answers (unless told otherwise)."""
    path = policy(**{"failover": "{whole_answers: continue}", **sections})
    return str(start_gateway(*urls, policy_path=path, watch_policy=False))


def test_a_whole_chat_answer_goes_on_on_the_next_tier_and_is_sent_whole(
    make_stub: Any, start_gateway: Any, client: httpx.Client, two_tier_policy: Any
) -> None:
    dying, healthy = _dying_and_healthy(make_stub)
    gateway = _gateway(start_gateway, two_tier_policy, dying.url, healthy.url)
    answer = client.post(f"{gateway}/v1/chat/completions", json={**CHAT, "max_tokens": 50})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    whole = answer.json()
    assert whole["object"] == "chat.completion"
    assert (whole["id"], whole["created"]) == ("chat-first", 1)
    message = whole["choices"][0]["message"]
    assert message == {**message, "role": "assistant", "content": "w0 w1 " + "w0 w1 w2 "}
    assert whole["choices"][0]["finish_reason"] == "stop"
    # The stub counts 3 completion tokens and a prompt of 5; the gateway adds the first
    # tier's 2 token events and takes the 2 it read again off the prompt.
    counts = {
        key: whole["usage"][key] for key in ("prompt_tokens", "completion_tokens", "total_tokens")
    }
    assert counts == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert answer.headers["x-route-tier"] == "t0"
    assert answer.headers["x-route-continued"] == "t1"
    asked = dying.last_request["body"]
    assert asked["stream"] is True and asked["stream_options"] == {"include_usage": True}
    sent = healthy.last_request["body"]
    assert sent["messages"][-1] == {"role": "assistant", "content": "w0 w1 "}
    assert sent["continue_final_message"] is True and sent["stream"] is True
    metrics = client.get(f"{gateway}/metrics").text
    assert 'gateway_stream_resumes_total{from_tier="t0",to_tier="t1"} 1.0' in metrics
    assert 'gateway_requests_total{class="tolerant",status="200",tier="t1"} 1.0' in metrics


def test_a_whole_completion_goes_on_from_prompt_plus_text(
    make_stub: Any, start_gateway: Any, client: httpx.Client, two_tier_policy: Any
) -> None:
    dying, healthy = _dying_and_healthy(make_stub)
    gateway = _gateway(start_gateway, two_tier_policy, dying.url, healthy.url)
    body = {"model": MODEL, "prompt": "Count:", "max_tokens": 30}
    whole = client.post(f"{gateway}/v1/completions", json=body).json()
    assert whole["object"] == "text_completion"
    assert whole["choices"][0]["text"] == "w0 w1 w0 w1 w2 "
    assert healthy.last_request["body"]["prompt"] == "Count:w0 w1 "


def test_the_official_client_reads_the_assembled_answer(
    make_stub: Any, start_gateway: Any, two_tier_policy: Any
) -> None:
    dying, healthy = _dying_and_healthy(make_stub)
    gateway = _gateway(start_gateway, two_tier_policy, dying.url, healthy.url)
    with official_client(gateway) as api:
        completion = api.chat.completions.create(model=MODEL, messages=CHAT["messages"])
    assert completion.choices[0].message.content == "w0 w1 w0 w1 w2 "
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    assert completion.id == "chat-first"


def test_with_no_tier_left_the_client_gets_one_error_in_openais_shape(
    make_stub: Any, start_gateway: Any, client: httpx.Client, two_tier_policy: Any, refused_url: str
) -> None:
    dying, _ = _dying_and_healthy(make_stub)
    gateway = _gateway(start_gateway, two_tier_policy, dying.url, refused_url)
    answer = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert answer.status_code == 502, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert "x-route-continued" not in answer.headers


def test_regenerate_and_what_a_stream_cannot_give_back_are_asked_whole(
    make_stub: Any, start_gateway: Any, client: httpx.Client, two_tier_policy: Any
) -> None:
    tier = make_stub()
    regenerating = _gateway(
        start_gateway, two_tier_policy, tier.url, tier.url, failover="{whole_answers: regenerate}"
    )
    assert client.post(f"{regenerating}/v1/chat/completions", json=CHAT).status_code == 200
    assert "stream" not in tier.last_request["body"]
    continuing = _gateway(start_gateway, two_tier_policy, tier.url, tier.url)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    answer = client.post(f"{continuing}/v1/chat/completions", json={**CHAT, "tools": tools})
    assert answer.status_code == 200
    assert "stream" not in tier.last_request["body"]
    assert answer.json()["choices"][0]["message"]["content"] == tier.answer_text


def test_a_watched_tiers_whole_answer_that_loops_is_escalated(
    make_stub: Any, start_gateway: Any, client: httpx.Client, two_tier_policy: Any
) -> None:
    looping, healthy = make_stub(), make_stub()
    looping.stream_texts = ["De la ", "bibli", "é", *["KISS"] * 30]
    healthy.stream_texts = ["Paris."]
    gateway = _gateway(
        start_gateway, two_tier_policy, looping.url, healthy.url, escalation="{tiers: [t0]}"
    )
    answer = client.post(f"{gateway}/v1/chat/completions", json={**CHAT, "max_tokens": 60})
    assert answer.json()["choices"][0]["message"]["content"] == "De la bibliéKISS" + "Paris."
    assert answer.headers["x-route-continued"] == "t1"
    metrics = client.get(f"{gateway}/metrics").text
    labels = 'class="tolerant",from_tier="t0",kind="loop",to_tier="t1"'
    assert f"gateway_stream_escalations_total{{{labels}}} 1.0" in metrics


def test_a_whole_answer_ended_at_its_length_has_usage(
    make_stub: Any, start_gateway: Any, client: httpx.Client, two_tier_policy: Any
) -> None:
    dying, healthy = _dying_and_healthy(make_stub)
    gateway = _gateway(start_gateway, two_tier_policy, dying.url, healthy.url)
    whole = client.post(f"{gateway}/v1/chat/completions", json={**CHAT, "max_tokens": 2}).json()
    assert whole["choices"][0]["message"]["content"] == "w0 w1 "
    assert whole["choices"][0]["finish_reason"] == "length"
    assert whole["usage"]["completion_tokens"] == 2
    assert healthy.requests == []


def test_errors_the_tier_gives_come_back_with_their_status(
    make_stub: Any, start_gateway: Any, client: httpx.Client, two_tier_policy: Any
) -> None:
    refusing, other = make_stub(), make_stub()
    refusing.mode = "bad_request"  # a 400 answer to the stream asked for
    gateway = _gateway(start_gateway, two_tier_policy, refusing.url, other.url)
    answer = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "upstream_rejected"
    refusing.mode, refusing.error_code = "error_event", 422  # found wrong mid-stream
    answer = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert answer.status_code == 422 and answer.json()["error"]["code"] == "upstream_rejected"
    assert other.requests == []
