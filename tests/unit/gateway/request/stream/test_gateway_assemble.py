"""A whole answer assembled from a stream's events (gateway/request/stream/assemble.py): pure."""

from __future__ import annotations

import json
from typing import Any

from gateway.request.kind import Kind
from gateway.request.stream.assemble import Assembled, Assembler, as_stream, assemblable

CHAT, COMPLETIONS = Kind.CHAT, Kind.COMPLETIONS


def assemble(events: bytes, chat: bool, failure: int | None = None) -> Assembled:
    """The whole answer of a relayed stream's ``events`` fed at once."""
    assembler = Assembler(chat)
    assembler.feed(events)
    return assembler.result(failure)


def events(*payloads: Any) -> bytes:
    out = b""
    for payload in payloads:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        out += f"data: {data}\n\n".encode()
    return out


def chat_chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **extra}
    return {"id": "chat-1", "object": "chat.completion.chunk", "created": 7, "model": "m",
            "choices": [choice]}  # fmt: skip


USAGE = {
    "id": "chat-1",
    "object": "chat.completion.chunk",
    "created": 7,
    "model": "m",
    "choices": [],
    "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
}


def test_a_chat_stream_becomes_one_chat_completion() -> None:
    stream = events(
        chat_chunk({"role": "assistant", "content": ""}),
        chat_chunk({"content": "Paris"}),
        chat_chunk({"content": " is."}),
        chat_chunk({}, "stop", stop_reason=None),
        USAGE,
        "[DONE]",
    )
    answer = assemble(stream, chat=True)
    assert answer.status == 200
    whole = json.loads(answer.body)
    assert whole["object"] == "chat.completion"
    assert (whole["id"], whole["created"], whole["model"]) == ("chat-1", 7, "m")
    choice = whole["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == "Paris is."
    assert "tool_calls" not in choice["message"]  # vLLM leaves an empty list out
    assert choice["message"]["reasoning"] is None
    assert (choice["finish_reason"], choice["logprobs"]) == ("stop", None)
    nulls = {"prompt_tokens_details": None, "completion_tokens_details": None}
    assert whole["usage"] == {**USAGE["usage"], **nulls}  # as vLLM's whole answer has them


def test_chat_logprobs_and_reasoning_are_joined() -> None:
    first = chat_chunk({"reasoning": "think "})
    second = chat_chunk({"reasoning": "more", "content": "A"})
    first["choices"][0]["logprobs"] = {"content": [{"token": "t", "logprob": -0.1}]}
    second["choices"][0]["logprobs"] = {"content": [{"token": "A", "logprob": -0.2}]}
    whole = json.loads(assemble(events(first, second, chat_chunk({}, "length")), True).body)
    choice = whole["choices"][0]
    assert choice["message"]["reasoning"] == "think more"
    assert choice["message"]["content"] == "A"
    assert [e["token"] for e in choice["logprobs"]["content"]] == ["t", "A"]
    assert choice["finish_reason"] == "length"


def test_a_completions_stream_joins_text_and_logprob_lists() -> None:
    def chunk(text: str, offset: int, finish: str | None = None) -> dict[str, Any]:
        logprobs = {"tokens": [text], "token_logprobs": [-1.0], "top_logprobs": [None],
                    "text_offset": [offset]}  # fmt: skip
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return {"id": "cmpl-1", "object": "text_completion", "created": 3, "model": "m",
                "choices": [choice]}  # fmt: skip

    whole = json.loads(assemble(events(chunk("a", 0), chunk("b", 1, "stop")), chat=False).body)
    assert whole["object"] == "text_completion"
    choice = whole["choices"][0]
    assert choice["text"] == "ab" and choice["finish_reason"] == "stop"
    assert choice["logprobs"]["tokens"] == ["a", "b"]
    assert choice["logprobs"]["text_offset"] == [0, 1]


def test_an_error_event_becomes_the_error_answer_with_the_relays_status() -> None:
    error = {"message": "the model server failed", "type": "server_error", "param": None,
             "code": None}  # fmt: skip
    stream = events(chat_chunk({"content": "Par"}), {"error": error}, "[DONE]")
    answer = assemble(stream, chat=True, failure=503)
    assert answer.status == 503
    assert json.loads(answer.body) == {"error": error}


def test_an_empty_stream_is_a_server_error_not_an_empty_answer() -> None:
    answer = assemble(b"", chat=True)
    assert answer.status == 502
    assert json.loads(answer.body)["error"]["type"] == "server_error"


def test_sse_comments_are_not_part_of_the_answer() -> None:
    stream = events(chat_chunk({"content": "a"})) + b": answer continued on tier t1\n\n"
    stream += events(chat_chunk({"content": "b"}, "stop"))
    assert json.loads(assemble(stream, True).body)["choices"][0]["message"]["content"] == "ab"


def test_what_is_asked_as_a_stream() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert assemblable(chat, CHAT)
    assert assemblable({"model": "m", "prompt": "hi"}, COMPLETIONS)
    assert assemblable({**chat, "stream": False}, CHAT)
    assert assemblable({**chat, "logprobs": True, "top_logprobs": 2}, CHAT)
    # What a stream cannot give back as the whole answer has it, or cannot be continued.
    for extra in (
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"prompt_logprobs": 1},
        {"return_token_ids": True},
        {"stream_options": {"include_usage": True}},
        {"n": 2},
        {"response_format": {"type": "json_object"}},
    ):
        assert not assemblable({**chat, **extra}, CHAT), extra
    assert not assemblable({"model": "m", "prompt": ["a", "b"]}, COMPLETIONS)


def test_as_stream_asks_for_usage_and_keeps_the_rest() -> None:
    body = {"model": "m", "prompt": "hi", "max_tokens": 5}
    assert as_stream(body) == {**body, "stream": True, "stream_options": {"include_usage": True}}
    assert "stream" not in body  # not changed in place
