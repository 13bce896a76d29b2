"""gateway/request/stream/continuation.py: what the client has, the next tier's body, the
rewriting."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.request.events.sse import DONE, complete_events
from gateway.request.kind import Kind
from gateway.request.stream.continuation import (
    Rewriter,
    Sent,
    SentEvents,
    continuation_body,
    ends_answer,
    length_ending,
    read_sent,
    split_error,
    unresumable,
    used_up,
)

CHAT, COMPLETIONS = Kind.CHAT, Kind.COMPLETIONS


def event(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def chat_chunk(content: str | None = None, finish: str | None = None, **extra: Any) -> bytes:
    delta: dict[str, Any] = {} if content is None else {"content": content}
    delta.update(extra.pop("delta", {}))
    choice = {"index": extra.pop("index", 0), "delta": delta, "finish_reason": finish}
    return event({"id": "chat-1", "created": 7, "choices": [choice], **extra})


def test_complete_events_holds_back_what_follows_the_last_boundary() -> None:
    assert complete_events(b"data: a\n\n") == (b"data: a\n\n", b"")
    assert complete_events(b'data: a\n\ndata: {"x') == (b"data: a\n\n", b'data: {"x')
    assert complete_events(b'data: {"x') == (b"", b'data: {"x')
    assert complete_events(b"data: a\r\n\r\ndata: b") == (b"data: a\r\n\r\n", b"data: b")
    assert complete_events(b"data: a\r\rdata: b") == (b"data: a\r\r", b"data: b")


@pytest.mark.parametrize("end", [b"\n\n", b"\r\n\r\n", b"\r\r"])
def test_split_error_keeps_every_event_before_the_error_in_any_framing(end: bytes) -> None:
    line_end = end[: len(end) // 2]
    content = chat_chunk("Paris").replace(b"\n\n", end)
    error = b'data: {"error": {"message": "engine died", "code": 500}}' + end
    done = b"data: [DONE]" + end
    comment = b": keep-alive" + line_end + b"data: " + b'{"id": "c"}' + end
    kept, found = split_error(content + comment + error + done)
    assert kept == content + comment  # nothing before the error is lost, framing as sent
    assert found is not None and found.message == "engine died" and found.status == 500
    assert split_error(content + done) == (content + done, None)


def test_split_error_keeps_the_content_event_of_a_crlf_block() -> None:
    """Issue 34's loss: split on ``\\n\\n`` only, a CRLF block was one event, and the content
    before the error event went with it (``(b"", error)``)."""
    content = chat_chunk("Paris").replace(b"\n\n", b"\r\n\r\n")
    error = b'data: {"error": {"message": "engine died", "code": 500}}\r\n\r\n'
    kept, found = split_error(content + error)
    assert kept == content and found is not None and found.status == 500
    assert found.event == b'data: {"error": {"message": "engine died", "code": 500}}\n\n'


def test_read_sent_joins_the_text_and_keeps_the_answers_identity() -> None:
    events = [
        chat_chunk("", delta={"role": "assistant"}),
        chat_chunk("Hel") + chat_chunk("lo"),
        chat_chunk(" there"),
    ]
    sent = read_sent(events, chat=True)
    assert sent == Sent("chat-1", 7, "Hello there", 3, False, None)


@pytest.mark.parametrize("fold_bytes", [1, 150, 400, 65_536])
def test_sent_events_folded_as_they_come_read_as_the_whole_stream(fold_bytes: int) -> None:
    blocks = [chat_chunk("", delta={"role": "assistant"})]
    blocks += [chat_chunk(f"w{i} ") + chat_chunk("x") for i in range(20)]
    blocks += [chat_chunk(None, finish="length"), DONE]
    sent = SentEvents(chat=True, fold_bytes=fold_bytes)
    for block in blocks:
        sent.add(block)
    assert sent.read() == read_sent(blocks, chat=True)
    assert sent.read().text == "".join(f"w{i} x" for i in range(20)) and sent.read().finished
    assert sent.done and sent.clean_end
    if fold_bytes < 400:  # folded: what is kept as bytes is under the bound, whatever was sent
        assert sum(len(b) for b in sent._blocks) <= fold_bytes + max(len(b) for b in blocks)


def test_sent_events_keep_a_reason_not_to_continue_across_folds() -> None:
    sent = SentEvents(chat=True, fold_bytes=1)
    sent.add(chat_chunk("a"))
    sent.add(chat_chunk(None, delta={"tool_calls": [{"index": 0}]}))
    sent.add(chat_chunk("b"))
    assert sent.read().why_not is not None and not sent.done
    partial = SentEvents(chat=True)
    assert partial.read() == Sent() and partial.clean_end
    partial.add(b'data: {"id": "x", "choices": []}\n')  # not ended at a boundary
    assert not partial.clean_end
    framed = SentEvents(chat=True)
    framed.add(b"data:[DONE]\r\n\r\n")  # another server's framing: still the end
    assert framed.done


def test_read_sent_of_completions_reads_text_and_sees_the_finish() -> None:
    done = event(
        {"id": "c", "created": 1, "choices": [{"index": 0, "text": "", "finish_reason": "length"}]}
    )
    sent = read_sent(
        [event({"id": "c", "choices": [{"index": 0, "text": " 4"}]}), done], chat=False
    )
    assert (sent.text, sent.events, sent.finished) == (" 4", 1, True)


@pytest.mark.parametrize(
    ("events", "why"),
    [
        ([chat_chunk("a", index=1)], "several choices"),
        ([chat_chunk(None, delta={"tool_calls": [{"index": 0}]})], "tool calls"),
        ([b"data: {not json\n\n"], "not JSON"),
        ([event({"error": {"message": "x"}})], "error event"),
    ],
)
def test_read_sent_refuses_what_cannot_be_continued(events: list[bytes], why: str) -> None:
    found = read_sent(events, chat=True).why_not
    assert found is not None and why in found


@pytest.mark.parametrize(
    ("body", "path", "why"),
    [
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, CHAT, "several choices"),
        ({"prompt": "x", "best_of": 3}, COMPLETIONS, "several choices"),
        ({"prompt": "x", "echo": True}, COMPLETIONS, "echo"),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "response_format": {"type": "json_object"},
            },
            CHAT,
            "structured output",
        ),
        ({"prompt": "x", "guided_regex": "a+"}, COMPLETIONS, "structured output"),
        ({"prompt": ["a", "b"]}, COMPLETIONS, "one text"),
        ({"prompt": [1, 2, 3]}, COMPLETIONS, "one text"),
        (
            {
                "messages": [{"role": "assistant", "content": [{"type": "text", "text": "x"}]}],
                "continue_final_message": True,
            },
            CHAT,
            "not text",
        ),
        ({"messages": []}, CHAT, "no messages"),
    ],
)
def test_unresumable_names_the_reason(body: dict[str, Any], path: str, why: str) -> None:
    found = unresumable(body, path)
    assert found is not None and why in found


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"messages": [{"role": "user", "content": "x"}], "n": 1}, CHAT),
        (
            {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "text"}},
            CHAT,
        ),
        ({"prompt": "x"}, COMPLETIONS),
        ({"prompt": ["x"]}, COMPLETIONS),
    ],
)
def test_plain_requests_are_resumable(body: dict[str, Any], path: str) -> None:
    assert unresumable(body, path) is None


def test_a_chat_continues_from_the_partial_assistant_message() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    body = {"messages": messages, "max_tokens": 100, "min_tokens": 10, "temperature": 0}
    sent = Sent("id", 1, "Hello, I am", 4)
    follow = continuation_body(body, CHAT, sent, 4, "max_tokens")
    assert follow["messages"] == [*messages, {"role": "assistant", "content": "Hello, I am"}]
    assert follow["continue_final_message"] is True
    assert follow["add_generation_prompt"] is False
    assert (follow["max_tokens"], follow["min_tokens"], follow["temperature"]) == (96, 6, 0)
    assert body["messages"] == messages and body["max_tokens"] == 100  # the original is kept


def test_a_chat_the_client_prefilled_extends_its_own_final_message() -> None:
    messages = [{"role": "user", "content": "List"}, {"role": "assistant", "content": "1."}]
    body = {"messages": messages, "continue_final_message": True, "add_generation_prompt": False}
    follow = continuation_body(body, CHAT, Sent(text=" apples\n2."), 3, "max_completion_tokens")
    assert follow["messages"] == [messages[0], {"role": "assistant", "content": "1. apples\n2."}]
    assert "max_completion_tokens" not in follow  # none was asked: none is made up


def test_a_completion_continues_from_prompt_plus_text() -> None:
    follow = continuation_body(
        {"prompt": ["2+2="], "max_tokens": 8}, COMPLETIONS, Sent(text="4,"), 2, "max_tokens"
    )
    assert (follow["prompt"], follow["max_tokens"]) == ("2+2=4,", 6)


def test_the_length_used_up_is_seen_and_ended_with_length() -> None:
    assert used_up({"max_tokens": 5}, 5, "max_tokens")
    assert not used_up({"max_tokens": 5}, 4, "max_tokens")
    assert not used_up({}, 10_000, "max_tokens")
    ending = length_ending(Sent("chat-1", 7, "abc", 3), chat=True, model="m")
    first, rest = ending.split(b"\n\n", 1)
    payload = json.loads(first.removeprefix(b"data: "))
    assert payload["id"] == "chat-1" and payload["created"] == 7
    assert payload["choices"] == [{"index": 0, "finish_reason": "length", "delta": {}}]
    assert rest == DONE


def test_the_rewriter_continues_the_first_answers_identity_without_a_second_role() -> None:
    rewrite = Rewriter(Sent("chat-1", 7, "Hello", 2), chat=True, generated=2, resent=2)
    second = [
        event(
            {
                "id": "other",
                "created": 99,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
            }
        ),
        event(
            {
                "id": "other",
                "created": 99,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": " world"}}],
            }
        ),
        event(
            {
                "id": "other",
                "created": 99,
                "choices": [],
                "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
            }
        ),
    ]
    out = rewrite(b"".join(second) + DONE)
    lines = [line for line in out.split(b"\n\n") if line]
    assert lines[-1] == b"data: [DONE]"
    payloads = [json.loads(line.removeprefix(b"data: ")) for line in lines[:-1]]
    assert len(payloads) == 2  # the role-only chunk is gone
    assert {(p["id"], p["created"]) for p in payloads} == {("chat-1", 7)}
    assert payloads[0]["choices"][0]["delta"] == {"content": " world"}
    assert payloads[1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def test_the_rewriter_passes_completions_text_and_errors_through() -> None:
    rewrite = Rewriter(Sent("c-1", 3, "4", 1), chat=False, generated=1, resent=1)
    out = rewrite(event({"id": "x", "created": 5, "choices": [{"index": 0, "text": ","}]}))
    assert json.loads(out.removeprefix(b"data: "))["choices"][0]["text"] == ","
    error = event({"error": {"message": "boom"}})
    assert rewrite(error) == error


def test_the_rewriter_counts_completion_text_offsets_from_the_answers_start() -> None:
    rewrite = Rewriter(Sent("c-1", 3, "2+2=4", 3), chat=False, generated=3, resent=3)
    logprobs = {"text_offset": [0, 1], "tokens": [",", " 5"], "token_logprobs": [-0.1, -0.2]}
    out = rewrite(
        event({"id": "x", "choices": [{"index": 0, "text": ", 5", "logprobs": logprobs}]})
    )
    moved = json.loads(out.removeprefix(b"data: "))["choices"][0]["logprobs"]
    assert moved["text_offset"] == [5, 6] and moved["tokens"] == [",", " 5"]


def test_what_says_an_answer_ended() -> None:
    """A finish_reason that is a string, or [DONE], in vLLM's compact JSON or spaced."""
    assert ends_answer(DONE) and ends_answer(b'data: {"finish_reason":"stop"}\n\n')
    assert ends_answer(b'{"choices":[{"finish_reason": "length"}]}')
    assert ends_answer(b'{"finish_reason":null}\n\n{"finish_reason":"stop"}')
    for going_on in (b'{"finish_reason":null}', b'{"finish_reason": null}', b'{"content":"x"}'):
        assert not ends_answer(going_on)
