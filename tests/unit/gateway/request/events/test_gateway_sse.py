"""gateway/request/events/sse.py, the one SSE reader (issue 34): events read alike in every framing
and however the bytes are cut (a property test), multi-line data and comments; a tier's bytes
held until they make complete events, bounded (issue 35, item 15): the buffer, the counter's
line buffer, and a tier sending one event too large for ``max_answer_bytes`` through a real
gateway over stub tiers."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.request.events.sse import (
    BOUNDARIES,
    EventBuffer,
    aread_payloads,
    encode,
    ends_event,
    payload,
    payloads,
    read_payloads,
    split_events,
)
from gateway.request.events.sse_counter import MAX_LINE, SSECounter

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


# One line of an event: a data field (with or without the space after its colon), a bare
# ``data`` field, a comment, or another field; no value holds a line ending.
_VALUE = st.text(st.characters(exclude_characters="\r\n", exclude_categories=("Cs",)), max_size=8)
_LINE = st.one_of(
    st.tuples(st.just("data"), st.sampled_from([":", ": "]), _VALUE),
    st.tuples(st.just("data"), st.just(""), st.just("")),
    st.tuples(st.just(""), st.just(":"), _VALUE),
    st.tuples(st.sampled_from(["event", "id", "retry"]), st.just(": "), _VALUE),
)
_EVENTS = st.lists(st.lists(_LINE, min_size=1, max_size=4), min_size=1, max_size=6)
Line = tuple[str, str, str]


def _framed(events: list[list[Line]], end: bytes) -> bytes:
    line_end = end[: len(end) // 2]
    return b"".join(
        line_end.join((name + colon + value).encode() for name, colon, value in event) + end
        for event in events
    )


def _expected(events: list[list[Line]]) -> list[bytes]:
    """Each event's data as the SSE spec reads it (``payload`` drops surrounding whitespace)."""
    found = []
    for event in events:
        fields = [(colon + value)[1:] for name, colon, value in event if name == "data"]
        values = [field.removeprefix(" ") for field in fields]  # one space after the colon
        if values:
            found.append("\n".join(values).encode().strip())
    return found


def _read(pieces: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """(what the buffer handed out, piece by piece; the payloads of all of it)."""
    buffer = EventBuffer()
    out = [buffer.feed(piece) for piece in pieces]
    out.append(buffer.rest())
    return out, payloads(b"".join(out))


@settings(max_examples=40, deadline=None)
@given(events=_EVENTS, cuts=st.lists(st.integers(min_value=0), max_size=8))
@pytest.mark.parametrize("end", BOUNDARIES)
def test_every_framing_and_every_cut_reads_the_same_events(
    end: bytes, events: list[list[Line]], cuts: list[int]
) -> None:
    stream = _framed(events, end)
    expected = _expected(events)
    assert payloads(stream) == expected
    assert [payload(event) for event, _ in split_events(stream) if event] == [
        payload(event) for event in (_framed([e], end) for e in events)
    ]
    points = sorted({0, len(stream), *(cut % (len(stream) + 1) for cut in cuts)})
    every = [[stream[:at], stream[at:]] for at in range(len(stream) + 1)]
    random = [stream[a:b] for a, b in itertools.pairwise(points)]
    for pieces in [*every, random]:
        out, read = _read(pieces)
        assert b"".join(out) == stream and read == expected  # the bytes as sent, the same events
        assert out[-1] == b""  # every event came out at its boundary
        assert all(ends_event(piece) for piece in out if piece)


def test_multi_line_data_comments_and_fields() -> None:
    event = b': keep-alive\r\nevent: chunk\r\ndata: {"a":\r\ndata:  1}\r\nid: 4\r\n\r\n'
    assert payload(event) == b'{"a":\n 1}'
    assert payload(b": only a comment\n\n") is None and payload(b"data\n\n") == b""
    assert payloads(b"data: 1\r\rdata:2\r\r: c\r\rdata: [DONE]") == [b"1", b"2", b"[DONE]"]
    assert encode(b"[DONE]") == b"data: [DONE]\n\n"
    assert encode(b'{"a":\n 1}') == b'data: {"a":\ndata:  1}\n\n'
    assert payload(encode(b'{"a":\n 1}')) == b'{"a":\n 1}'


def test_a_stream_read_chunk_by_chunk_gives_each_payload_once() -> None:
    stream = b'data: {"a":1}\r\n\r\n: c\r\n\r\ndata: [DONE]\r\n\r\ndata: tail'
    pieces = [stream[i : i + 5] for i in range(0, len(stream), 5)]
    assert list(read_payloads(pieces)) == [b'{"a":1}', b"[DONE]", b"tail"]

    async def chunks() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    async def read() -> list[bytes]:
        return [data async for data in aread_payloads(chunks())]

    assert asyncio.run(read()) == [b'{"a":1}', b"[DONE]", b"tail"]


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


@pytest.mark.parametrize("end", BOUNDARIES)
def test_the_counter_reads_every_framing_however_cut(end: bytes) -> None:
    stream = (
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
        b'data: {"choices":[{"delta":{}}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}\n\n'
        b"data: [DONE]\n\n"
    ).replace(b"\n\n", end)
    for size in (1, 2, 7, len(stream)):
        counter = SSECounter()
        for i in range(0, len(stream), size):
            counter.feed(stream[i : i + size])
        assert (counter.events, counter.usage_tokens, counter.prompt_tokens) == (2, 7, 3)


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
    from gateway.request.stream.assemble import Assembler

    assembler, piece = Assembler(chat=False), b"x" * 1024
    started = time.perf_counter()
    assembler.feed(b'data: {"id":"a","choices":[{"index":0,"text":"')
    for _ in range(8 * 1024):
        assembler.feed(piece)
    assembler.feed(b'","finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
    answer = assembler.result()
    assert time.perf_counter() - started < 2 and answer.status == 200
    assert len(json.loads(answer.body)["choices"][0]["text"]) == 8 * 1024 * 1024
