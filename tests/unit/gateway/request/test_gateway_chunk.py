"""gateway/request/chunk.py: one reader of OpenAI's streaming chunks, chat and completions
(issue 34): text, calls, the opening, finish reasons, logprobs, usage, errors, [DONE]."""

from __future__ import annotations

import json
from typing import Any

from gateway.request.chunk import DONE_CHUNK, read_chunk


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
