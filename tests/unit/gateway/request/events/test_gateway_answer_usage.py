"""A whole answer's usage read without decoding the whole answer
(gateway/request/events/answer_usage.py), and a tier's whole answer that is malformed or too large
as a tier failure (issue 35, items 11 and 15), through a real gateway over a stub tier."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from gateway.request.events.answer_usage import INLINE_DECODE, MalformedAnswer, answer_usage

USAGE = {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}
CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "Capital of France?"}]}


def _answer(text: str, usage: Any = USAGE, size: int = 0) -> bytes:
    """A chat answer whose content is ``text`` padded to about ``size`` bytes."""
    content = text + "x" * max(size - len(text), 0)
    choice = {"index": 0, "message": {"role": "assistant", "content": content}}
    body: dict[str, Any] = {"id": "a", "choices": [choice]}
    if usage is not ...:
        body["usage"] = usage
    return json.dumps(body).encode()


@pytest.mark.parametrize("size", [0, 2 * INLINE_DECODE], ids=["decoded", "searched"])
def test_the_usage_of_a_whole_answer(size: int) -> None:
    # The answer's text says "usage": a key's bytes never occur inside a JSON string.
    text = 'my "usage": {"prompt_tokens": 1} and "usage"'
    assert answer_usage(_answer(text, size=size)) == (5, 9)
    assert answer_usage(_answer(text, usage=None, size=size)) == (None, None)
    assert answer_usage(_answer(text, usage=..., size=size)) == (None, None)
    assert answer_usage(_answer(text, usage={"prompt_tokens": True}, size=size)) == (None, None)
    for bad in (5, [1], "many"):
        with pytest.raises(MalformedAnswer, match="usage is not an object"):
            answer_usage(_answer(text, usage=bad, size=size))


def test_a_whole_answer_that_is_not_a_json_object_is_malformed() -> None:
    for raw in (b"not json", b"[1, 2]", b"<html>"):
        with pytest.raises(MalformedAnswer):
            answer_usage(raw)
    with pytest.raises(MalformedAnswer, match="usage is not JSON"):
        answer_usage(b'{"x": "' + b"y" * 2 * INLINE_DECODE + b'", "usage": {nope')


def test_a_large_answer_is_not_decoded_to_read_its_usage() -> None:
    """~20 MB: json.loads takes 0.5-2 s of the event loop here; the search, microseconds."""
    raw = _answer("", size=20_000_000)
    started = time.perf_counter()
    assert answer_usage(raw) == (5, 9)
    assert time.perf_counter() - started < 0.05


def test_a_whole_answer_whose_usage_is_not_an_object_is_a_502(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    stub.whole_body = {"id": "a", "choices": [], "usage": 5}
    gateway = start_gateway(stub.url)
    answer = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert answer.status_code == 502
    assert answer.json()["error"] == {"message": "the model server failed",
        "type": "server_error", "param": None, "code": "upstream_error"}  # fmt: skip
    assert answer.headers["x-route-tier"] == "t0"


def test_a_whole_answer_past_max_answer_bytes_is_a_502(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    stub.answer_text = "x" * 2000
    gateway = start_gateway(stub.url, max_answer_bytes=1000)
    answer = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert answer.status_code == 502
    error = answer.json()["error"]
    assert error["code"] == "answer_too_large" and "1000 bytes" in error["message"]
    stub.answer_text = "short"
    assert client.post(f"{gateway}/v1/chat/completions", json=CHAT).status_code == 200
