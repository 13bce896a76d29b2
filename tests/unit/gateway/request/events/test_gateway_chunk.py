"""gateway/request/events/chunk.py: one reader of OpenAI's streaming chunks, chat and completions
(issue 34): text, calls, the opening, finish reasons, logprobs, usage, errors, [DONE]; and
every reader of a relayed stream reading one answer alike in every framing and cut."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.request.events.chunk import DONE_CHUNK, read_chunk
from gateway.request.events.sse import BOUNDARIES, EventBuffer, payloads
from gateway.request.stream.assemble import Assembler
from gateway.request.stream.continuation import read_sent, split_error
from gateway.request.stream.stream_watch import StreamWatch


def data(payload: Any) -> bytes:
    return json.dumps(payload).encode()


def test_a_chat_chunk_and_a_completion_chunk_read_alike() -> None:
    chat = read_chunk(
        data({"id": "c", "created": 3, "choices": [{"index": 0, "delta": {"content": "Hi"}}]}),
        chat=True,
    )
    completion = read_chunk(data({"id": "c", "created": 3, "choices": [{"text": "Hi"}]}), False)
    for chunk in (chat, completion):
        assert (chunk.id, chunk.created, chunk.error, chunk.done) == ("c", 3, None, False)
        (choice,) = chunk.choices
        assert (choice.index, choice.text, choice.calls, choice.finished) == (0, "Hi", False, False)


def test_the_opening_tool_calls_and_the_finish() -> None:
    opening = read_chunk(data({"choices": [{"delta": {"role": "assistant"}}]}), chat=True)
    assert opening.choices[0].opening and opening.choices[0].text == ""
    calls = read_chunk(data({"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]}), True)
    assert calls.choices[0].calls
    odd = read_chunk(data({"choices": [{"delta": "x"}, 5, {"index": "1"}]}), chat=True)
    assert odd.choices[0].calls and odd.choices[1].body is None and odd.choices[2].index is None
    end = read_chunk(data({"choices": [{"text": "", "finish_reason": "length"}]}), chat=False)
    assert end.choices[0].finished and end.choices[0].finish_reason == "length"
    assert not read_chunk(data({"choices": [{"finish_reason": None}]}), True).choices[0].finished


def test_logprobs_of_either_kind() -> None:
    chat_logprobs = {"content": [{"token": "a", "logprob": -0.5}, {"logprob": True}, "x"]}
    chat = read_chunk(data({"choices": [{"delta": {}, "logprobs": chat_logprobs}]}), True)
    assert chat.choices[0].logprobs == [-0.5]
    listed = {"tokens": ["a", "b"], "token_logprobs": [-1, None]}
    completion = read_chunk(data({"choices": [{"text": "ab", "logprobs": listed}]}), False)
    assert completion.choices[0].logprobs == [-1.0]


def test_usage_errors_done_and_what_is_not_a_chunk() -> None:
    usage = read_chunk(data({"choices": [], "usage": {"prompt_tokens": 5}}), chat=True)
    assert usage.choices == () and usage.usage_tokens == (5, None)
    assert read_chunk(data({"choices": [], "usage": 5}), True).usage_tokens == (None, None)
    error = read_chunk(data({"error": {"message": "engine died", "code": 500}}), chat=True)
    assert error.error is not None and (error.error.message, error.error.status) == (
        "engine died",
        500,
    )
    flat = read_chunk(data({"error": "bad", "code": 400}), chat=False).error
    assert flat is not None and (flat.message, flat.status) == ("bad", None)
    assert read_chunk(b"[DONE]", chat=True) is DONE_CHUNK
    assert read_chunk(b"{not json", chat=True).problem == "not JSON"
    assert read_chunk(b"[1]", chat=True).problem == "not a JSON object"


_TEXTS = st.lists(st.text(max_size=6), min_size=1, max_size=8)


def _stream(texts: list[str], chat: bool, end: bytes) -> bytes:
    def choice(text: str, finish: str | None = None) -> dict[str, Any]:
        body = {"delta": {"content": text}} if chat else {"text": text}
        return {"index": 0, **body, "finish_reason": finish}

    chunks = [{"id": "x", "created": 1, "choices": [choice(t)]} for t in texts]
    chunks.append({"id": "x", "created": 1, "choices": [choice("", "stop")]})
    events = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]
    return b"".join([*events, b": done\n\n", b"data: [DONE]\n\n"]).replace(b"\n\n", end)


@settings(max_examples=30, deadline=None)
@given(texts=_TEXTS, chat=st.booleans(), cuts=st.lists(st.integers(min_value=0), max_size=6))
@pytest.mark.parametrize("end", BOUNDARIES)
def test_every_reader_reads_the_same_answer_in_every_framing_and_cut(
    end: bytes, texts: list[str], chat: bool, cuts: list[int]
) -> None:
    """The relays' readers (continuation, stream watch, assembly) read one answer alike."""
    stream = _stream(texts, chat, end)
    points = sorted({0, len(stream), *(cut % (len(stream) + 1) for cut in cuts)})
    buffer, assembler = EventBuffer(), Assembler(chat)
    watch = StreamWatch(None, None, 0, chat)
    blocks, watched = [], []
    for a, b in itertools.pairwise(points):
        assembler.feed(stream[a:b])
        if block := buffer.feed(stream[a:b]):
            blocks.append(block)
            watched.append(watch.feed(block))
    sent = read_sent(blocks, chat)
    assert (sent.text, sent.finished, sent.id, sent.why_not) == ("".join(texts), True, "x", None)
    whole = json.loads(assembler.result().body)["choices"][0]
    assert (whole["message"]["content"] if chat else whole["text"]) == "".join(texts)
    assert watch.text == "".join(texts) and payloads(b"".join(watched))[-1] == b"[DONE]"
    error = b'data: {"error": {"message": "died", "code": 500}}' + end
    kept, found = split_error(b"".join(blocks[:-1]) + error)  # the events before it, as sent
    assert kept == b"".join(blocks[:-1]) and found is not None and found.status == 500
