"""Request bodies the gateway decodes but could not send on (gateway/request/completions/body.py,
body_values.py): each a 400 in OpenAI's shape naming where, nothing forwarded, no error log."""

from __future__ import annotations

import json
import logging
import random
import re
from typing import Any

import httpx
import pytest

from gateway.config import GatewayConfig, TierEndpoint
from gateway.errors import APIError
from gateway.request.completions.body import check_shape, parse_json_object


def values_over(raw: bytes, limit: int) -> int | None:
    """How many JSON values ``check_shape`` finds in ``raw`` when over ``limit``; else None."""
    try:
        check_shape(raw, len(raw) + 1, limit)  # a depth no body reaches: values only
    except APIError as refused:
        found = re.search(r"holds ([\d,]+) JSON values", refused.message)
        assert found is not None, refused.message
        return int(found[1].replace(",", ""))
    return None


CHAT = b'{"messages": [{"role": "user", "content": "hi"}]%s}'

UNSENDABLE: list[tuple[str, str, bytes, str]] = [
    ("NaN", "chat", CHAT % b', "temperature": NaN', "temperature"),
    ("-Infinity", "chat", CHAT % b', "top_p": -Infinity', "top_p"),
    ("Infinity unchecked", "chat", CHAT % b', "x_extra": {"a": [0, Infinity]}', "x_extra.a[1]"),
    ("1e999", "chat", CHAT % b', "presence_penalty": 1e999', "presence_penalty"),
    ("-1e999 in a list", "chat", CHAT % b', "logit_bias": {"11": -1e999}', 'logit_bias["11"]'),
    (
        "lone high",
        "chat",
        b'{"messages": [{"role": "user", "content": "a\\ud800"}]}',
        "messages[0].content",
    ),
    (
        "lone low in a part",
        "chat",
        b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}',
        "messages[0].content[0].text",
    ),
    ("in stop", "chat", CHAT % b', "stop": ["a", "\\ud83dx"]', "stop[1]"),
    ("a prompt", "completions", b'{"prompt": "\\udfff"}', "prompt"),
    ("a key", "completions", b'{"prompt": "x", "\\ud800": 1}', '["\\ud800"]'),
]


@pytest.mark.parametrize(
    ("raw", "param"), [(u[2], u[3]) for u in UNSENDABLE], ids=[u[0] for u in UNSENDABLE]
)
def test_values_that_cannot_be_sent_on_are_refused_naming_their_place(
    raw: bytes, param: str
) -> None:
    with pytest.raises(APIError) as caught:
        parse_json_object(raw)
    assert caught.value.status == 400
    assert caught.value.param == param
    assert caught.value.code == "invalid_value"
    assert f"'{param}'" in caught.value.message
    assert "\n" not in caught.value.message


@pytest.mark.parametrize(
    "raw",
    [
        b'{"e": "\\ud83d\\ude00"}',  # a surrogate pair: one emoji
        b'{"e": "\\\\ud800"}',  # an escaped backslash, then text
        b'{"t": 1.7976931348623157e308, "u": -1e-999, "v": 1e308}',  # finite; an underflow is 0
    ],
)
def test_valid_unicode_and_finite_numbers_pass(raw: bytes) -> None:
    assert isinstance(parse_json_object(raw), dict)


def test_a_bare_non_finite_body_is_named_as_the_body() -> None:
    with pytest.raises(APIError) as caught:
        parse_json_object(b"NaN")
    assert caught.value.status == 400 and caught.value.param is None


@pytest.mark.parametrize(
    ("what", "path", "raw", "param"), UNSENDABLE, ids=[u[0] for u in UNSENDABLE]
)
def test_through_the_gateway_a_400_nothing_forwarded_nothing_logged_as_an_error(
    what: str,
    path: str,
    raw: bytes,
    param: str,
    stub: Any,
    start_gateway: Any,
    client: httpx.Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gateway = start_gateway(stub.url)
    with caplog.at_level(logging.INFO):
        response = client.post(
            f"{gateway}/v1/{'chat/completions' if path == 'chat' else 'completions'}",
            content=raw,
            headers={"content-type": "application/json"},
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert stub.requests == []
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


# --- encodings (item 9) -----------------------------------------------------------------------

# U+4E22 is 22 4E in UTF-16-LE: a quote byte that flipped the byte-level nesting bound.
DEEP_UTF16 = ('{"a": "\u4e22", "b": ' + "[" * 200 + "]" * 200 + "}").encode("utf-16-le")


@pytest.mark.parametrize(
    "raw",
    [
        DEEP_UTF16,
        ('{"a": "\u4e22", "b": ' + "[" * 2000 + "]" * 2000 + "}").encode("utf-16-le"),
        '{"messages": [{"role": "user", "content": "hi"}]}'.encode("utf-16"),  # with its BOM
        '{"messages": [{"role": "user", "content": "hi"}]}'.encode("utf-16-be"),
        '{"prompt": "hi"}'.encode("utf-32"),
        b'{"prompt": "\xed\xa0\x80"}',  # a surrogate's bytes (Python's decoder passed them)
        b'{"prompt": "\xc0\xaf"}',  # an overlong encoding
        b'{"prompt": "caf\xe9"}',  # Latin-1
    ],
    ids=[
        "utf-16 deep",
        "utf-16 deeper",
        "utf-16",
        "utf-16-be",
        "utf-32",
        "surrogate bytes",
        "overlong",
        "latin-1",
    ],
)
def test_bodies_not_in_utf8_are_refused(raw: bytes) -> None:
    with pytest.raises(APIError) as caught:
        parse_json_object(raw)
    assert caught.value.status == 400
    assert "not UTF-8" in caught.value.message
    assert "\n" not in caught.value.message


def test_a_utf8_byte_order_mark_is_ignored() -> None:
    assert parse_json_object(b'\xef\xbb\xbf{"prompt": "\xe4\xb8\xa2"}') == {"prompt": "\u4e22"}


def test_utf16_nesting_reaches_neither_tier_nor_traceback(
    stub: Any, start_gateway: Any, client: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = start_gateway(stub.url)
    for depth in (200, 970, 3000):
        raw = ('{"prompt": "\u4e22", "x": ' + "[" * depth + "]" * depth + "}").encode("utf-16-le")
        response = client.post(
            f"{gateway}/v1/completions", content=raw, headers={"content-type": "application/json"}
        )
        assert response.status_code == 400, (depth, response.text)
        assert "not UTF-8" in response.json()["error"]["message"]
    assert stub.requests == []
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


# --- values (item 10) -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "count"),
    [
        ({}, 1),
        ({"a": 1}, 3),
        ({"a": [1, 2, {}], "b": "x,:[{", "c": [[], {}, [[]], ""]}, 15),
        ({"m": [{"role": "user", "content": 'a, b: [c] {d} \\" e'}]}, 8),
        ([[], [[]], {"": ""}], 7),
    ],
)
def test_values_are_counted_from_the_bytes(value: Any, count: int) -> None:
    for raw in (json.dumps(value), json.dumps(value, indent="\t")):
        assert values_over(raw.encode(), count - 1) == count
        assert values_over(raw.encode(), count) is None


def test_a_body_of_more_values_than_allowed_is_refused_before_decoding() -> None:
    body = b'{"prompt": "x", "x": [' + b"{}," * 333_000 + b"{}]}"  # ~1 MB: ~24 MB decoded
    with pytest.raises(APIError) as caught:
        parse_json_object(body)
    assert caught.value.status == 400 and caught.value.code == "request_too_large"
    assert "333,006 JSON values" in caught.value.message and "65,536" in caught.value.message
    at_the_limit = b'{"x": [' + b"0," * 65_532 + b"0]}"  # the body, a key, a list, 65,533 zeros
    assert values_over(at_the_limit, 65_536) is None
    assert len(parse_json_object(at_the_limit)["x"]) == 65_533
    with pytest.raises(APIError):
        parse_json_object(at_the_limit.replace(b"[0,", b"[0,0,"))


def test_ordinary_large_bodies_stay_under_the_default() -> None:
    long_text = json.dumps({"messages": [{"role": "user", "content": "a, b: [c] " * 90_000}]})
    token_ids = json.dumps(
        {"prompt": [list(range(2048))] * 4, "logit_bias": {str(i): 1 for i in range(300)}}
    )
    assert parse_json_object(long_text.encode()) and parse_json_object(token_ids.encode())


def test_through_the_gateway_max_body_values_is_a_400(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(stub.url, max_body_values=100)
    url = f"{gateway}/v1/completions"
    over = client.post(url, json={"prompt": "x", "stop": ["a"] * 98})  # 1 + 2 keys + 1 + 98
    assert over.status_code == 400, over.text
    assert over.json()["error"]["code"] == "request_too_large"
    assert stub.requests == []
    assert client.post(url, json={"prompt": "x", "stop": ["a"] * 95}).status_code == 200


def test_max_body_values_defaults_to_65536() -> None:
    config = GatewayConfig(model_name="m", tiers=[TierEndpoint(name="t", base_url="http://x:1")])
    assert config.max_body_values == 65_536


def _decoded_values(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + sum(1 + _decoded_values(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_decoded_values(v) for v in value)
    return 1


def test_the_count_from_bytes_is_the_decoded_count_and_at_most_half_the_bytes() -> None:
    rng = random.Random(35)
    leaves = [0, -1.5e3, "", ' ,:[]{}"\\', "\\", True, None, 'x"', "\u4e22"]

    def value(depth: int) -> Any:
        roll = rng.random()
        if depth > 4 or roll < 0.4:
            return rng.choice(leaves)
        if roll < 0.7:
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        keys = ["a", "[", '\\"', ",:", "k"]
        return {f"{rng.choice(keys)}{i}": value(depth + 1) for i in range(rng.randint(0, 4))}

    for _ in range(500):
        body = value(0)
        indent = rng.choice([None, 1, "\t"])
        raw = json.dumps(body, indent=indent, ensure_ascii=rng.random() < 0.5).encode()
        count = _decoded_values(body)
        assert values_over(raw, 0) == count, raw
        assert values_over(raw, count) is None
        assert count <= 1 + len(raw) / 2  # why bodies up to 2 x (limit - 1) bytes skip the count
