"""The official ``openai`` client against a real gateway in front of a stub tier."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.unit.gateway.conftest import official_client

MODEL = "stub-model"
MESSAGES: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def api(stub: Any, start_gateway: Any) -> Iterator[openai.OpenAI]:
    gateway = start_gateway(stub.url)
    with official_client(gateway) as client:
        yield client


def test_chat(api: openai.OpenAI, stub: Any) -> None:
    answer = api.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert answer.choices[0].message.content == "The capital of France is Paris."
    assert answer.usage is not None and answer.usage.total_tokens == 12
    assert "authorization" not in stub.last_request["headers"]


def test_chat_stream(api: openai.OpenAI) -> None:
    chunks = list(api.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "w0 w1 w2 "
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_completions(api: openai.OpenAI) -> None:
    answer = api.completions.create(model=MODEL, prompt="The capital of France is")
    assert answer.choices[0].text == " Paris."
    streamed = list(api.completions.create(model=MODEL, prompt="x", stream=True))
    assert "".join(c.choices[0].text for c in streamed) == "w0 w1 w2 "


def test_models(api: openai.OpenAI) -> None:
    assert [model.id for model in api.models.list()] == [MODEL]


def test_unknown_model_raises_not_found(api: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        api.chat.completions.create(model="gpt-4", messages=MESSAGES)
    assert caught.value.code == "model_not_found"


def test_stream_broken_upstream_raises_api_error(api: openai.OpenAI, stub: Any) -> None:
    stub.mode = "die"
    received: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in api.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True):
            received.append(chunk.choices[0].delta.content or "")
    assert received == ["w0 ", "w1 "]
    assert "the model server failed" in caught.value.message
