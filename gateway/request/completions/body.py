"""A completion request's body: read within its size and time limits, decoded as one JSON
object of bounded nesting, its ``model`` checked against the served one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from starlette.requests import ClientDisconnect, Request

from gateway.errors import APIError
from gateway.request.completions.body_values import (
    NonFinite,
    check_surrogates,
    finite_float,
    non_finite_error,
    refuse_constant,
)

CLOSE = {"Connection": "close"}  # on an answer sent before the whole body was read
# Objects and arrays in a request body, nested; OpenAI bodies (tool and response schemas
# included) stay far below it, and it keeps every later encoder and walker off the recursion
# limit (json.dumps of the body to a tier, for one).
MAX_JSON_DEPTH = 64
MAX_BODY_VALUES = 65_536  # GatewayConfig.max_body_values' default
# Built once: json.loads with hooks would build a decoder per call (~10 us). It decodes text:
# the bytes are decoded as UTF-8 first (utf8_text).
_DECODER = json.JSONDecoder(parse_float=finite_float, parse_constant=refuse_constant)
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))


async def read_body(request: Request, max_bytes: int, timeout: float = float("inf")) -> bytes:
    """The request body, or 413 as soon as it is known to exceed ``max_bytes``, or 408 when it
    has not all arrived within ``timeout`` seconds (both close the connection: the rest of the
    body is never read)."""
    try:
        async with asyncio.timeout(None if timeout == float("inf") else timeout):
            return await _read_body(request, max_bytes)
    except TimeoutError:
        raise APIError(
            408,
            f"request body not received within {timeout:g} s",
            code="request_timeout",
            headers=CLOSE,
        ) from None


async def _read_body(request: Request, max_bytes: int) -> bytes:
    too_large = APIError(
        413, f"request body exceeds {max_bytes} bytes", code="request_too_large", headers=CLOSE
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_bytes:
                raise too_large
    except ClientDisconnect as exc:
        raise APIError(400, "client disconnected while sending the request body") from exc
    return bytes(body)


def parse_json_object(raw: bytes, max_values: int = MAX_BODY_VALUES) -> dict[str, Any]:
    """Decode a UTF-8 JSON object body nested at most ``MAX_JSON_DEPTH`` levels, holding at
    most ``max_values`` values (the gateway's ``max_body_values``), whose numbers
    are finite and whose strings are Unicode (gateway/request/completions/body_values.py: what a
    tier can be sent); anything else is a one-line 400 (a body of ``[`` too: refused before the
    decoder, which recurses, sees it)."""
    too_deep = APIError(
        400,
        f"request body is nested too deeply (objects and arrays more than {MAX_JSON_DEPTH} levels)",
    )
    # UTF-8 first: the nesting bound reads bytes, and a quote byte is a quote only in UTF-8 (in
    # UTF-16 a character such as U+4E22 carries a 0x22 byte and hid ~960 levels from it).
    text = utf8_text(raw)
    check_shape(raw, MAX_JSON_DEPTH, max_values)
    try:
        body = _DECODER.decode(text)
    except RecursionError as exc:
        raise too_deep from exc
    except NonFinite as exc:
        raise non_finite_error(text, exc) from None
    except json.JSONDecodeError as exc:
        raise APIError(
            400,
            f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
        ) from exc
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise APIError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise APIError(400, f"request body must be a JSON object, got {type(body).__name__}")
    check_surrogates(raw, body)
    return body


def utf8_text(raw: bytes) -> str:
    """The body as text: UTF-8 only, as RFC 8259 (8.1) asks of JSON between systems (Python's
    decoder would also take UTF-16 and UTF-32, and surrogates' bytes); a leading byte order
    mark is ignored, as the RFC allows. Anything else is a 400."""
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in raw[:4]:
        raise APIError(400, "request body is not UTF-8 (UTF-16 or UTF-32?): JSON must be UTF-8")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(
            400,
            f"request body is not UTF-8: byte {raw[exc.start]:#04x} at offset {exc.start} "
            f"({exc.reason}); JSON must be UTF-8",
        ) from None
    return text[1:] if text.startswith("\ufeff") else text


def check_shape(raw: bytes, max_depth: int, max_values: int) -> None:
    """A 400 when the UTF-8 JSON text ``raw`` nests objects and arrays more than ``max_depth``
    levels or holds more than ``max_values`` values, found in one pass of byte operations
    before anything is decoded (a 1 MB body of ``{},`` decodes to ~24 MB of objects)."""
    found = _shape(raw, max_depth, max_values)
    if found is None:
        return
    if found[0] == "depth":
        raise APIError(
            400,
            f"request body is nested too deeply (objects and arrays more than {max_depth} levels)",
        )
    raise APIError(
        400,
        f"request body holds {found[1]:,} JSON values (objects, arrays, strings, numbers, keys); "
        f"at most {max_values:,} are allowed",
        code="request_too_large",
    )


def _shape(raw: bytes, max_depth: int | None, max_values: int | None) -> tuple[str, int] | None:
    """("depth", 0) when ``raw`` nests deeper than ``max_depth`` (brackets that never pair up
    count as deeper: the decoder would refuse them anyway), ("values", n) when it holds ``n``
    > ``max_values`` values, None when neither.

    Byte operations only (no recursion, no Python loop per byte). Upper bounds from the length
    and counts of the raw bytes settle most bodies at once; otherwise string contents are
    dropped (escapes first, then everything between two quotes, each string kept as one
    quote), and then:
    depth: innermost ``[]``/``{}`` pairs removed ``max_depth`` times, anything left is deeper;
    values: every value is the body itself, or a container's first or after a comma, and
    every key has a colon, so values = 1 + commas + colons + non-empty containers.
    """
    deep = max_depth is not None and raw.count(b"[") + raw.count(b"{") > max_depth
    # Each comma, colon and open bracket of a non-empty container is matched by a byte of its
    # own (the value after it, the closing bracket): at most 1 + len / 2 values, so bodies up
    # to 128 KiB (with the default) are settled without reading them.
    many = max_values is not None and len(raw) > 2 * (max_values - 1)
    if many:
        assert max_values is not None
        punctuation = sum(raw.count(c) for c in (b"[", b"{", b",", b":"))
        many = 1 + punctuation > max_values
    if not (deep or many):
        return None
    bare = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b'"'.join(bare.split(b'"')[::2])  # each string now one quote
    if deep:
        assert max_depth is not None
        brackets = outside.translate(None, _NOT_BRACKETS)
        for _ in range(max_depth):
            paired = brackets.replace(b"[]", b"").replace(b"{}", b"")
            if len(paired) == len(brackets):
                break
            brackets = paired
        if brackets:
            return ("depth", 0)
    if many:
        assert max_values is not None
        tight = outside.translate(None, b" \t\r\n")
        empty = tight.count(b"[]") + tight.count(b"{}")
        opened = tight.count(b"[") + tight.count(b"{")
        total = 1 + tight.count(b",") + tight.count(b":") + opened - empty
        if total > max_values:
            return ("values", total)
    return None


def check_model(body: dict[str, Any], model_name: str) -> dict[str, Any]:
    """Require ``model`` to be the served model (missing means it); returns the body to send."""
    model = body.get("model")
    if model is None:
        return {**body, "model": model_name}
    if not isinstance(model, str):
        raise APIError(400, "'model' must be a string", param="model", code="invalid_type")
    if model != model_name:
        raise APIError(
            404,
            f"The model '{_one_line(model)}' does not exist; this gateway serves '{model_name}'",
            param="model",
            code="model_not_found",
        )
    return body


def _one_line(text: str, limit: int = 100) -> str:
    """``text`` for an error message: escaped (no newline) and bounded."""
    shown = json.dumps(text, ensure_ascii=False)[1:-1]
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def wants_stream(body: Mapping[str, Any]) -> bool:
    """True when the client asked for server-sent events."""
    return body.get("stream") is True
