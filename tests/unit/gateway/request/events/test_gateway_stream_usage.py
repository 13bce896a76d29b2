"""A continuable stream asks its tier for usage and takes the prompt's tokens from it; the client
gets the usage event only if it asked (gateway/request/events/stream_usage.py): pure, then through a
real gateway and real stub tiers on 127.0.0.1."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from gateway.request.events.stream_usage import asking_usage, drop_usage_events, is_usage_event

MODEL = "stub-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Capital of France?"}]}
USAGE = b'data: {"id": "x", "choices": [], "usage": {"prompt_tokens": 5}}'
CHOICE = b'data: {"id": "x", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}'
DONE = b"data: [DONE]"


def test_a_body_without_stream_options_asks_for_usage() -> None:
    body = {**CHAT, "stream": True}
    assert asking_usage(body) == {**body, "stream_options": {"include_usage": True}}
    assert body == {**CHAT, "stream": True}  # the client's body is left as it was


@pytest.mark.parametrize("options", [None, {}, {"include_usage": False}, {"include_usage": True}])
def test_a_client_that_chose_stream_options_is_asked_as_it_asked(options: Any) -> None:
    assert asking_usage({**CHAT, "stream": True, "stream_options": options}) is None


def test_usage_events_are_told_from_the_others() -> None:
    assert is_usage_event(USAGE)
    assert is_usage_event(b'data: {"choices":[],"usage":{"prompt_tokens":5}}')  # compact
    assert not is_usage_event(CHOICE)
    assert not is_usage_event(b'data: {"choices": [{"delta": {}}], "usage": {"x": 1}}')
    assert not is_usage_event(b': a comment naming "usage" and "choices": []')
    assert not is_usage_event(DONE)


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        (CHOICE + b"\n\n", CHOICE + b"\n\n"),
        (USAGE + b"\n\n", b""),
        (CHOICE + b"\n\n" + USAGE + b"\n\n" + DONE + b"\n\n", CHOICE + b"\n\n" + DONE + b"\n\n"),
        (USAGE + b"\n\n" + DONE + b"\n\n", DONE + b"\n\n"),
        (CHOICE + b"\r\n\r\n" + USAGE + b"\r\n\r\n" + DONE, CHOICE + b"\r\n\r\n" + DONE),
        (CHOICE + b"\r\r" + USAGE + b"\r\r" + DONE + b"\r\r", CHOICE + b"\r\r" + DONE + b"\r\r"),
        (CHOICE + b"\n\n" + USAGE, CHOICE + b"\n\n"),  # an unended last event
    ],
)
def test_usage_events_are_dropped_from_a_block_of_events(block: bytes, expected: bytes) -> None:
    assert drop_usage_events(block) == expected


def _events(text: str) -> list[Any]:
    datas = [line[5:].strip() for line in text.split("\n") if line.startswith("data:")]
    return [data if data == "[DONE]" else json.loads(data) for data in datas]


def _input_tokens(metrics: str) -> float:
    found = re.search(r'gateway_tokens_total\{[^}]*direction="input"[^}]*\} ([0-9.]+)', metrics)
    assert found is not None, metrics
    return float(found.group(1))


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_stream_takes_its_prompt_tokens_from_the_tier_and_sends_no_usage(
    path: str, make_stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    tier = make_stub()
    gateway = start_gateway(tier.url)
    body: dict[str, Any] = {**CHAT} if "chat" in path else {"model": MODEL, "prompt": "Paris is"}
    body["stream"] = True
    answer = client.post(f"{gateway}{path}", json=body)
    assert answer.status_code == 200, answer.text
    assert tier.requests[-1]["body"]["stream_options"] == {"include_usage": True}
    events = _events(answer.text)
    assert events[-1] == "[DONE]"
    assert all("usage" not in event for event in events[:-1]), events
    assert len(events) == tier.chunks + 2  # the chunks, the last (finish_reason) one, [DONE]
    # 5: the stub tier's count, which the gateway's own tokenizer would not give this prompt
    assert _input_tokens(client.get(f"{gateway}/metrics").text) == 5.0


def test_a_client_that_asked_for_usage_gets_the_tiers(
    make_stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    tier = make_stub()
    gateway = start_gateway(tier.url)
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    events = _events(client.post(f"{gateway}/v1/chat/completions", json=body).text)
    assert events[-2]["choices"] == [] and events[-2]["usage"]["prompt_tokens"] == 5


def test_a_client_that_declined_usage_is_asked_as_it_asked(
    make_stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    tier = make_stub()
    gateway = start_gateway(tier.url)
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": False}}
    events = _events(client.post(f"{gateway}/v1/chat/completions", json=body).text)
    assert tier.requests[-1]["body"]["stream_options"] == {"include_usage": False}
    assert all("usage" not in event for event in events[:-1])
    assert _input_tokens(client.get(f"{gateway}/metrics").text) != 5.0  # counted by the gateway


def test_a_stream_that_cannot_be_continued_is_asked_as_sent(
    make_stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    tier = make_stub()
    gateway = start_gateway(tier.url)
    body = {**CHAT, "stream": True, "n": 2}  # several choices: relayed as it comes, not continued
    answer = client.post(f"{gateway}/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    assert "stream_options" not in tier.requests[-1]["body"]


def test_a_continued_stream_sends_no_usage_and_counts_its_prompt_itself(
    make_stub: Any, start_gateway: Any, client: httpx.Client, two_tier_policy: Any
) -> None:
    """The first tier dies midway: the continuation's usage (the gateway's sum of two tiers'
    counts) is neither sent nor taken for the prompt's tokens; the gateway counts it."""
    dying, healthy = make_stub(), make_stub()
    dying.mode = "die"  # two chunks, then the connection drops
    gateway = start_gateway(
        dying.url, healthy.url, policy_path=two_tier_policy(), watch_policy=False
    )
    answer = client.post(f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True})
    assert answer.status_code == 200, answer.text
    assert ": answer continued on tier t1" in answer.text
    assert healthy.requests[-1]["body"]["stream_options"] == {"include_usage": True}
    events = _events(answer.text)
    assert events[-1] == "[DONE]" and all("usage" not in e for e in events[:-1]), events
    counted = _input_tokens(client.get(f"{gateway}/metrics").text)
    assert counted not in (5.0, 10.0)  # neither one tier's count nor the two summed
