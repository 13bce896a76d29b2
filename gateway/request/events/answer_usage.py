"""Reading a whole answer's ``usage`` (its tokens) without decoding the whole answer.

A tier's whole answer is relayed as the bytes it sent; the gateway reads only its ``usage``
(the prompt's and the completion's tokens, for the metrics and the request log). A small answer
is decoded (``json.loads``: a few microseconds, and it checks that the answer is a JSON object);
one past ``INLINE_DECODE`` bytes (n choices of thousands of tokens with logprobs: tens of MB,
0.5-1 s of the event loop to decode) is searched from its end for its top-level ``"usage":``
key, and only the object after it is decoded. The search cannot be fooled by the answer's text:
inside a JSON string a quote is escaped, so ``"usage":`` there is never a key's bytes. A tier
answer that is not a JSON object, or whose ``usage`` is not an object, is malformed
(``MalformedAnswer``): a tier failure, never the gateway's 500.
"""

from __future__ import annotations

import json
import re
from typing import Any

INLINE_DECODE = 256 * 1024  # answers up to this many bytes are decoded whole
_KEY = b'"usage"'
_COLON = re.compile(rb"\s*:\s*")
_WINDOW = 4096  # bytes read after the key: a usage object is ~100-300 bytes
_DECODER = json.JSONDecoder()


class MalformedAnswer(ValueError):
    """A tier's whole answer the gateway cannot read: what is wrong with it."""


def answer_usage(raw: bytes) -> tuple[int | None, int | None]:
    """(prompt, completion) tokens of a whole JSON answer's ``usage`` (None for each it does
    not give); ``MalformedAnswer`` when the answer or its usage is not what a tier sends."""
    if len(raw) <= INLINE_DECODE:
        try:
            answer = json.loads(raw)
        except ValueError as exc:
            raise MalformedAnswer("it is not JSON") from exc
        if not isinstance(answer, dict):
            raise MalformedAnswer("it is not a JSON object")
        usage = answer.get("usage")
    else:
        usage = _scanned_usage(raw)
    if usage is None:
        return None, None
    if not isinstance(usage, dict):
        raise MalformedAnswer(f"its usage is not an object ({type(usage).__name__})")
    return _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))


def _scanned_usage(raw: bytes) -> Any:
    """The value of the last ``"usage":`` key in ``raw`` (None without one), decoded alone."""
    end = len(raw)
    while (at := raw.rfind(_KEY, 0, end)) >= 0:
        colon = _COLON.match(raw, at + len(_KEY))
        if colon is None:  # "usage" as a value, not a key: look further back
            end = at
            continue
        window = raw[colon.end() : colon.end() + _WINDOW].decode("utf-8", "replace")
        try:
            return _DECODER.raw_decode(window)[0]
        except ValueError as exc:
            raise MalformedAnswer("its usage is not JSON") from exc
    return None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
