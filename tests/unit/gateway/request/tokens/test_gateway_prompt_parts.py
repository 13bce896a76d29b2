"""Every text vLLM renders into a chat prompt is counted and classified (issue 35, item 2):
content parts of type ``input_text``, ``output_text``, ``thinking``, ``refusal`` (and a
``tool_reference``'s name) as ``text`` parts are, and a role string no template knows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.request.tokens.prompt_count import ByteCounter
from gateway.request.tokens.prompt_text import content_texts, request_parts
from tests.shipped_fuzz import default_tokenizer_dir, shipped_gateway
from tests.stub_tier import StubTier

CODE = "Write a Python function that parses a CSV file and returns the rows as dictionaries."


def _parts(kind: str, text: str) -> list[dict[str, Any]]:
    field = {"thinking": "thinking", "refusal": "refusal"}.get(kind, "text")
    return [{"type": kind, field: text}]


@pytest.mark.parametrize("kind", ["text", "input_text", "output_text", "thinking", "refusal"])
def test_each_text_part_type_is_read_as_vllm_renders_it(kind: str) -> None:
    assert content_texts(_parts(kind, "hello")) == ["hello"]


def test_parts_vllm_does_not_render_as_text_are_not_read() -> None:
    content = [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
        {"type": "input_text", "thinking": "not its field"},
        {"type": "tool_reference", "name": "lookup"},
        {"text": "no type: counted (vLLM refuses it)"},
        "a bare string",
    ]
    assert content_texts(content) == [
        "lookup",
        "no type: counted (vLLM refuses it)",
        "a bare string",
    ]


def test_a_role_no_template_knows_is_read_as_the_clients_words() -> None:
    body = {"messages": [{"role": "customer", "content": [{"type": "input_text", "text": CODE}]}]}
    assert request_parts(body).turns == (f"customer\n\n{CODE}",)
    known = {"messages": [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]}
    assert request_parts(known).turns == ("y",)


def test_without_a_tokenizer_parts_and_roles_are_counted_too() -> None:
    counter = ByteCounter()
    text = [{"role": "user", "content": "word " * 100}]
    parts = [{"role": "user", "content": _parts("input_text", "word " * 100)}]
    role = [{"role": "word " * 100, "content": ""}]
    assert counter.count_chat(parts) == counter.count_chat(text) > 500
    assert counter.count_chat(role) >= 500


@pytest.fixture(scope="module")
def shipped() -> Iterator[tuple[str, list[StubTier]]]:
    with shipped_gateway(default_tokenizer_dir()) as running:
        yield running


def _chat(url: str, message: dict[str, Any]) -> httpx.Response:
    with httpx.Client(trust_env=False, timeout=30) as client:
        return client.post(f"{url}/v1/chat/completions", json={"messages": [message]})


@pytest.mark.parametrize("kind", ["input_text", "output_text", "thinking", "refusal"])
def test_a_3000_word_prompt_in_any_text_part_hits_the_length_limit(
    kind: str, shipped: tuple[str, list[StubTier]]
) -> None:
    url, stubs = shipped
    sent = sum(len(s.requests) for s in stubs)
    words = " ".join(f"word{i % 50}" for i in range(3000))
    answer = _chat(url, {"role": "user", "content": _parts(kind, words)})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "context_length_exceeded"
    assert sum(len(s.requests) for s in stubs) == sent  # nothing reached a tier


def test_a_3000_word_role_hits_the_length_limit(shipped: tuple[str, list[StubTier]]) -> None:
    url, _ = shipped
    words = " ".join(f"word{i % 50}" for i in range(3000))
    answer = _chat(url, {"role": words, "content": "hi"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("kind", ["input_text", "output_text"])
def test_a_code_question_in_input_text_is_classified_as_in_text_parts(
    kind: str, shipped: tuple[str, list[StubTier]]
) -> None:
    url, _ = shipped
    as_text = _chat(url, {"role": "user", "content": _parts("text", CODE)})
    as_kind = _chat(url, {"role": "user", "content": _parts(kind, CODE)})
    other_role = _chat(url, {"role": "customer", "content": _parts(kind, CODE)})
    assert as_text.status_code == as_kind.status_code == other_role.status_code == 200
    assert as_text.headers["x-route-class"] == "code"
    assert as_kind.headers["x-route-class"] == "code"
    assert other_role.headers["x-route-class"] == "code"
