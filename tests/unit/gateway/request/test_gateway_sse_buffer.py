"""A tier's SSE bytes held until they make complete events, bounded (issue 35, item 15):
gateway/request/sse_buffer.py, the counter's line buffer, and a tier sending one event too large
for ``max_answer_bytes`` through a real gateway over stub tiers."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from gateway.request.exchange import MAX_LINE, SSECounter
from gateway.request.sse_buffer import EventBuffer

CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "Capital of France?"}]}


def test_events_come_out_whole_however_the_bytes_are_cut() -> None:
    stream = b'data: {"a":1}\n\ndata: {"b":2}\r\n\r\ndata: {"c":3}\r\rdata: [DONE]\n\n'
    for size in (1, 2, 3, 5, 64):
        buffer = EventBuffer()
        out = [buffer.feed(stream[i : i + size]) for i in range(0, len(stream), size)]
        assert b"".join(out) == stream and buffer.held == 0 and buffer.rest() == b""
        # Each event comes out as soon as its boundary has arrived, never a piece of one.
        assert all(piece.endswith((b"\n\n", b"\r\n\r\n", b"\r\r")) for piece in out if piece)
    buffer = EventBuffer()
    assert buffer.feed(b"data: 1\n\ndata: 2") == b"data: 1\n\n"
    assert buffer.held == len(b"data: 2") and buffer.rest() == b"data: 2"


def test_one_long_event_costs_linear_time() -> None:
    """8 MB a KB at a time: joining what was held to each chunk copied ~32 GB."""
    buffer, piece = EventBuffer(), b"x" * 1024
    started = time.perf_counter()
    assert buffer.feed(b"data: ") == b""
    for _ in range(8 * 1024):
        assert buffer.feed(piece) == b""
    assert buffer.feed(b"\n\n").endswith(b"x\n\n")
    assert time.perf_counter() - started < 2 and buffer.held == 0


def test_the_counter_holds_a_bounded_head_of_a_long_line() -> None:
    counter, piece = SSECounter(), b"x" * 4096
    started = time.perf_counter()
    counter.feed(b'data: {"choices":[{"delta":{"content":"')
    for _ in range(4 * 1024):  # 16 MB, no line break
        counter.feed(piece)
    assert len(counter._partial) <= MAX_LINE and time.perf_counter() - started < 2
    counter.feed(b'"}}]}\n\n')
    assert counter.events == 1


def test_a_usage_that_is_not_an_object_is_not_counted() -> None:
    counter = SSECounter()
    counter.feed(b'data: {"choices":[],"usage":5}\n\ndata: {"choices":[],"usage":[1]}\n\n')
    assert counter.usage_tokens is None and counter.prompt_tokens is None


def _stream(client: httpx.Client, url: str, body: dict[str, Any]) -> list[str]:
    with client.stream("POST", url, json={**body, "stream": True}) as answer:
        assert answer.status_code == 200
        return [line for line in answer.iter_lines() if line.startswith("data: ")]


def test_an_event_past_max_answer_bytes_fails_its_tier(
    make_stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    huge, healthy = make_stub(), make_stub()
    huge.mode = "huge_event"  # 64 KiB of one event, never ended
    gateway = start_gateway(huge.url, healthy.url, max_answer_bytes=16_384)
    url = f"{gateway}/v1/chat/completions"
    lines = _stream(client, url, CHAT)  # continued on the next tier
    payloads = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert not any("error" in p for p in payloads), lines
    assert "".join(p["choices"][0]["delta"].get("content") or "" for p in payloads) == (
        "w0 w1 w0 w1 w2 "
    )
    lines = _stream(client, url, {**CHAT, "n": 2})  # cannot be continued: the error event
    assert json.loads(lines[-2][6:])["error"]["code"] == "upstream_error"
    assert lines[-1] == "data: [DONE]" and not any("xxxx" in line for line in lines)


def test_a_whole_answer_assembled_from_one_long_event_costs_linear_time() -> None:
    from gateway.request.assemble import Assembler

    assembler, piece = Assembler(chat=False), b"x" * 1024
    started = time.perf_counter()
    assembler.feed(b'data: {"id":"a","choices":[{"index":0,"text":"')
    for _ in range(8 * 1024):
        assembler.feed(piece)
    assembler.feed(b'","finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
    answer = assembler.result()
    assert time.perf_counter() - started < 2 and answer.status == 200
    assert len(json.loads(answer.body)["choices"][0]["text"]) == 8 * 1024 * 1024
