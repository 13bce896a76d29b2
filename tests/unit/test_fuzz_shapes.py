"""The shapes derived from valid fuzz cases (tests/fuzz_shapes.py) are what they claim."""

from __future__ import annotations

import json

import pytest

from tests.fuzz_shapes import NONFINITE, derive

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
COMPLETION = {"prompt": "hi", "max_tokens": 3}


def _by_name(path: str, body: dict, index: int = 0) -> dict:
    return {shape.name: shape for shape in derive(path, body, index)}


def test_the_unicode_shapes_decode_to_the_same_body() -> None:
    shapes = _by_name("/v1/chat/completions", CHAT)
    for name, codec in (("utf16", "utf-16"), ("utf16le", "utf-16-le"), ("utf32", "utf-32")):
        assert shapes[name].content.decode(codec) == json.dumps(CHAT, ensure_ascii=False)
        assert json.loads(shapes[name].content) == CHAT  # what json.loads alone would take
        assert shapes[name].expect == "refused"


@pytest.mark.parametrize("index", range(len(NONFINITE)))
def test_a_nonfinite_number_in_a_field_the_gateway_does_not_read(index: int) -> None:
    shape = _by_name("/v1/completions", COMPLETION, index)["nonfinite"]
    literal = NONFINITE[index]
    assert f'"repetition_penalty": {literal}'.encode() in shape.content
    value = json.loads(shape.content)["repetition_penalty"]
    assert value != value or abs(value) == float("inf")  # NaN or an infinity


def test_a_lone_surrogate_in_the_text_the_tier_tokenizes() -> None:
    chat = json.loads(_by_name("/v1/chat/completions", CHAT)["surrogate"].content)
    assert chat["messages"][-1]["content"] == "hi\ud800"
    completion = json.loads(_by_name("/v1/completions", COMPLETION)["surrogate"].content)
    assert completion["prompt"] == "hi\ud800"
    token_ids = json.loads(_by_name("/v1/completions", {"prompt": [1, 2]})["surrogate"].content)
    assert token_ids["stop"] == "\ud800"


def test_extensions_alternate_and_parts_are_chat_only() -> None:
    fields = {
        next(
            k
            for k in json.loads(derive("/v1/completions", COMPLETION, i)[4].content)
            if k not in COMPLETION
        )
        for i in range(2)
    }
    assert fields == {"kv_transfer_params", "vllm_xargs"}
    parts = _by_name("/v1/chat/completions", CHAT)["parts"]
    assert parts.expect == "valid"
    assert json.loads(parts.content)["messages"][0]["content"] == [
        {"type": "input_text", "text": "hi"}
    ]
    assert "parts" not in _by_name("/v1/completions", COMPLETION)
    assert derive("/v1/completions", None, 0) == []
