"""A stream whose tier fails mid-answer goes on on the next tier (gateway/request/stream/resume.py),
through a real gateway and real stub tiers on 127.0.0.1."""

from __future__ import annotations

import json
from typing import Any

import httpx

from gateway.config import TierEndpoint
from gateway.request.stream.resume import rest_of_chain
from tests.unit.gateway.conftest import official_client

MODEL = "stub-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Capital of France?"}]}


def _stream(client: httpx.Client, url: str, body: dict[str, Any]) -> list[str]:
    with client.stream("POST", url, json={**body, "stream": True}) as answer:
        assert answer.status_code == 200, answer.read()
        return [line for line in answer.iter_lines() if line]


def _payloads(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def _dying_and_healthy(make_stub: Any) -> tuple[Any, Any]:
    dying, healthy = make_stub(), make_stub()
    dying.mode = "die"  # two chunks, then the connection drops
    dying.answer_id, healthy.answer_id, healthy.created = "chat-first", "chat-second", 99
    dying.role_chunk = healthy.role_chunk = True  # as vLLM opens a chat stream
    return dying, healthy


def test_a_chat_stream_goes_on_on_the_next_tier_as_one_answer(
    make_stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    dying, healthy = _dying_and_healthy(make_stub)
    gateway = start_gateway(dying.url, healthy.url)
    lines = _stream(client, f"{gateway}/v1/chat/completions", {**CHAT, "max_tokens": 50})
    payloads = _payloads(lines)
    assert not any("error" in p for p in payloads), lines
    assert lines[-1] == "data: [DONE]" and lines.count("data: [DONE]") == 1
    text = "".join(p["choices"][0]["delta"].get("content") or "" for p in payloads)
    assert text == "w0 w1 " + "w0 w1 w2 "  # the first tier's two words, then the next tier's
    assert {(p["id"], p["created"]) for p in payloads} == {("chat-first", 1)}
    assert sum(1 for p in payloads if "role" in p["choices"][0]["delta"]) == 1  # the first's
    assert ": answer continued on tier t1 after tier t0 failed" in lines
    sent = healthy.last_request["body"]
    assert sent["messages"] == [*CHAT["messages"], {"role": "assistant", "content": "w0 w1 "}]
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    # Less what was generated: without a tokenizer the gateway counts bytes, plus one.
    assert 50 - len("w0 w1 ") - 1 <= sent["max_tokens"] <= 50 - 2
    metrics = client.get(f"{gateway}/metrics").text
    assert 'gateway_stream_resumes_total{from_tier="t0",to_tier="t1"} 1.0' in metrics


def test_a_completions_stream_goes_on_from_prompt_plus_text(
    make_stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    dying, healthy = _dying_and_healthy(make_stub)
    gateway = start_gateway(dying.url, healthy.url)
    body = {"model": MODEL, "prompt": "Count:", "max_tokens": 30}
    payloads = _payloads(_stream(client, f"{gateway}/v1/completions", body))
    assert "".join(p["choices"][0]["text"] for p in payloads) == "w0 w1 w0 w1 w2 "
    assert healthy.last_request["body"]["prompt"] == "Count:w0 w1 "


def test_usage_asked_for_is_summed_over_both_tiers(
    make_stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    dying, healthy = _dying_and_healthy(make_stub)
    gateway = start_gateway(dying.url, healthy.url)
    body = {**CHAT, "stream_options": {"include_usage": True}}
    usage = [
        p["usage"]
        for p in _payloads(_stream(client, f"{gateway}/v1/chat/completions", body))
        if p.get("usage")
    ]
    # Without a tokenizer the gateway takes the first tier's two token events as its tokens:
    # the next tier's 3 plus 2, and the 2 it read again taken off its prompt's 5.
    assert usage == [{"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}]


def test_an_answer_whose_length_was_used_up_ends_with_length_and_no_second_tier(
    make_stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    dying, healthy = _dying_and_healthy(make_stub)
    gateway = start_gateway(dying.url, healthy.url)
    lines = _stream(client, f"{gateway}/v1/chat/completions", {**CHAT, "max_tokens": 2})
    payloads = _payloads(lines)
    assert payloads[-1]["choices"][0]["finish_reason"] == "length"
    assert payloads[-1]["id"] == "chat-first"
    assert lines[-1] == "data: [DONE]" and not any("error" in p for p in payloads)
    assert healthy.requests == []


def test_a_request_with_several_choices_still_ends_with_the_error_event(
    make_stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    dying, healthy = _dying_and_healthy(make_stub)
    gateway = start_gateway(dying.url, healthy.url)
    payloads = _payloads(_stream(client, f"{gateway}/v1/chat/completions", {**CHAT, "n": 2}))
    assert "error" in payloads[-1]
    assert healthy.requests == []  # never a second answer


def test_with_no_tier_left_the_stream_ends_with_the_error_event(
    make_stub: Any, start_gateway: Any, client: httpx.Client, refused_url: str
) -> None:
    dying, _ = _dying_and_healthy(make_stub)
    gateway = start_gateway(dying.url, refused_url)
    lines = _stream(client, f"{gateway}/v1/chat/completions", CHAT)
    assert "error" in _payloads(lines)[-1] and lines[-1] == "data: [DONE]"


def test_the_official_client_reads_the_continued_stream_as_one(
    make_stub: Any, start_gateway: Any
) -> None:
    dying, healthy = _dying_and_healthy(make_stub)
    gateway = start_gateway(dying.url, healthy.url)
    with official_client(gateway) as api:
        chunks = list(
            api.chat.completions.create(model=MODEL, messages=CHAT["messages"], stream=True)
        )
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "w0 w1 w0 w1 w2 "
    )
    assert {c.id for c in chunks} == {"chat-first"}
    assert chunks[-1].choices[0].finish_reason == "stop"


def _endpoints(*names: str) -> list[TierEndpoint]:
    return [TierEndpoint(name=name[:2], base_url=f"http://{name}") for name in names]


def test_the_rest_of_the_chain_starts_after_the_failed_endpoint() -> None:
    int4, int8 = _endpoints("i4a", "i4b"), _endpoints("i8a")
    chain = [int4, int8]
    assert rest_of_chain(chain, int4[0]) == [[int4[1]], int8]
    assert rest_of_chain(chain, int4[1]) == [[], int8]
    assert rest_of_chain(chain, int8[0]) == [[]]
    assert rest_of_chain(chain, _endpoints("zz")[0]) == []


def test_a_tier_sending_an_error_event_is_continued(
    make_stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    """A tier that sends an error event of its own (vLLM's way when its engine fails) is
    continued too: the client never sees that event."""
    failing, healthy = make_stub(), make_stub()
    failing.mode = "error_event"
    gateway = start_gateway(failing.url, healthy.url)
    lines = _stream(client, f"{gateway}/v1/chat/completions", CHAT)
    payloads = _payloads(lines)
    assert not any("error" in p for p in payloads), lines
    assert "".join(p["choices"][0]["delta"].get("content") or "" for p in payloads) == (
        "w0 w1 w0 w1 w2 "
    )
    assert healthy.last_request["body"]["messages"][-1]["content"] == "w0 w1 "


def test_a_tier_saying_the_request_is_wrong_is_not_continued(
    make_stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    """An error event with a 4xx code (vLLM's for a request it finds wrong mid-stream) would
    come back from every tier: the client gets the gateway's error for it (its text is the
    tier's own: tests/unit/gateway/test_gateway_errors.py)."""
    failing, healthy = make_stub(), make_stub()
    failing.mode, failing.error_code = "error_event", 400
    gateway = start_gateway(failing.url, healthy.url)
    lines = _stream(client, f"{gateway}/v1/chat/completions", CHAT)
    payloads = _payloads(lines)
    assert payloads[-1]["error"]["code"] == "upstream_rejected"
    assert lines[-1] == "data: [DONE]" and lines.count("data: [DONE]") == 1
    assert healthy.requests == []


def test_an_answer_ended_at_its_length_has_the_usage_asked_for(
    make_stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    dying, healthy = _dying_and_healthy(make_stub)
    gateway = start_gateway(dying.url, healthy.url)
    body = {**CHAT, "max_tokens": 2, "stream_options": {"include_usage": True}}
    payloads = _payloads(_stream(client, f"{gateway}/v1/chat/completions", body))
    usage = [p["usage"] for p in payloads if p.get("usage")]
    assert len(usage) == 1 and usage[0]["completion_tokens"] == 2
    assert usage[0]["total_tokens"] == usage[0]["prompt_tokens"] + 2
    assert payloads[-1]["choices"] == [] and payloads[-2]["choices"][0]["finish_reason"] == "length"
    assert healthy.requests == []


def test_a_stream_cut_cleanly_mid_answer_goes_on_on_the_next_tier(
    make_stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    """A tier stream that closes cleanly with neither a finish_reason nor [DONE] was cut
    mid-answer (issue 35, item 7): continued as a broken connection is, never a whole 200."""
    cut, healthy = make_stub(), make_stub()
    cut.mode = "cut"
    gateway = start_gateway(cut.url, healthy.url)
    lines = _stream(client, f"{gateway}/v1/chat/completions", CHAT)
    payloads = _payloads(lines)
    assert not any("error" in p for p in payloads), lines
    text = "".join(p["choices"][0]["delta"].get("content") or "" for p in payloads)
    assert text == "w0 w1 w0 w1 w2 " and lines[-1] == "data: [DONE]"
    assert healthy.last_request["body"]["messages"][-1]["content"] == "w0 w1 "


def test_a_stream_cut_cleanly_with_no_tier_left_ends_with_an_error_and_is_a_failure(
    make_stub: Any, start_gateway: Any, client: httpx.Client, refused_url: str
) -> None:
    cut = make_stub()
    cut.mode = "cut"
    gateway = start_gateway(cut.url, refused_url)
    lines = _stream(client, f"{gateway}/v1/chat/completions", CHAT)
    assert _payloads(lines)[-1]["error"]["code"] == "upstream_error"
    assert lines[-1] == "data: [DONE]" and lines.count("data: [DONE]") == 1
    metrics = client.get(f"{gateway}/metrics").text
    assert 'status="502"' in metrics and 'status="200"' not in metrics


def test_a_stream_that_cannot_be_continued_cut_cleanly_ends_with_an_error(
    make_stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    cut, healthy = make_stub(), make_stub()
    cut.mode = "cut"
    gateway = start_gateway(cut.url, healthy.url)
    lines = _stream(client, f"{gateway}/v1/chat/completions", {**CHAT, "n": 2})  # plain relay
    assert _payloads(lines)[-1]["error"]["code"] == "upstream_error"
    assert lines[-1] == "data: [DONE]" and healthy.requests == []
    metrics = client.get(f"{gateway}/metrics").text
    assert 'status="502"' in metrics and 'status="200"' not in metrics


def test_a_finished_stream_missing_only_its_done_is_an_answer_and_gets_its_done(
    make_stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    tier, healthy = make_stub(), make_stub()
    tier.mode = "no_done"
    gateway = start_gateway(tier.url, healthy.url)
    for body in (CHAT, {**CHAT, "n": 2}):  # continuable, and the plain relay
        lines = _stream(client, f"{gateway}/v1/chat/completions", body)
        payloads = _payloads(lines)
        assert not any("error" in p for p in payloads), lines
        assert payloads[-1]["choices"][0]["finish_reason"] == "stop"
    assert healthy.requests == []
