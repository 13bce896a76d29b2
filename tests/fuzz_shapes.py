"""Shapes a JSON-schema fuzzer cannot write, derived from its valid cases (tests/shipped_fuzz.py).

schemathesis writes what ``/openapi.json`` describes: UTF-8 JSON with finite numbers and
well-formed strings. The second review of the gateway (issue 35) broke it with bodies of
another kind, each derived here from a valid (positive) case:

- ``utf16`` / ``utf32``: the same body in another Unicode encoding (``json.loads`` decodes
  them; the gateway takes UTF-8 only, RFC 8259 section 8.1) - refused;
- ``nonfinite``: ``NaN``, ``-Infinity`` or ``1e999`` in a field the gateway does not read
  (the upstream encoder refuses them) - refused;
- ``surrogate``: a lone surrogate escape in the prompt text or in ``stop`` - refused;
- ``extension``: a vLLM extension a client may not set (``kv_transfer_params``,
  ``vllm_xargs``) - refused;
- ``parts``: a chat message's text sent as content parts of type ``input_text`` (vLLM renders
  them into the prompt) - valid: answered, and counted like text.

Each shape names what the gateway must answer: ``refused`` (a 4xx in OpenAI's shape, nothing
forwarded to a tier) or ``valid`` (as a positive case: a 2xx, or a 4xx over a limit).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

NONFINITE = ("NaN", "-Infinity", "1e999")
REFUSED_EXTENSIONS = ("kv_transfer_params", "vllm_xargs")


@dataclass(frozen=True)
class Shape:
    """One derived request: its name, the body's bytes, and what it must get."""

    name: str
    content: bytes
    expect: str  # "refused" or "valid"


def derive(path: str, body: Any, index: int) -> list[Shape]:
    """The shapes derived from the valid case ``body`` sent to ``path`` (its ``index``
    picks which non-finite number and extension field, so a run covers them all)."""
    if not isinstance(body, dict):
        return []
    text = json.dumps(body, ensure_ascii=False)
    shapes = [
        Shape("utf16", text.encode("utf-16"), "refused"),  # with its BOM
        Shape("utf16le", text.encode("utf-16-le"), "refused"),  # without: json.loads guesses
        Shape("utf32", text.encode("utf-32"), "refused"),
        Shape("nonfinite", _with_number(body, NONFINITE[index % len(NONFINITE)]), "refused"),
    ]
    extension = REFUSED_EXTENSIONS[index % len(REFUSED_EXTENSIONS)]
    shapes.append(Shape("extension", _encode({**body, extension: {"x": 1}}), "refused"))
    surrogate = _with_surrogate(path, body)
    if surrogate is not None:
        shapes.append(Shape("surrogate", surrogate, "refused"))
    parts = _as_parts(body) if path.endswith("/chat/completions") else None
    if parts is not None:
        shapes.append(Shape("parts", _encode(parts), "valid"))
    return shapes


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()  # ASCII: a lone surrogate travels as its \u escape


def _with_number(body: dict[str, Any], literal: str) -> bytes:
    """``body`` with a field the gateway does not read set to ``literal``, a number JSON
    itself has no spelling for (Python's json module reads all three)."""
    encoded = _encode({**body, "repetition_penalty": 0})
    return encoded.replace(b'"repetition_penalty": 0', f'"repetition_penalty": {literal}'.encode())


def _with_surrogate(path: str, body: dict[str, Any]) -> bytes | None:
    """``body`` with a lone surrogate in the text the tier tokenizes: the last message's
    string content (chat), the prompt string (completions), else in ``stop``."""
    lone = "\ud800"
    if path.endswith("/chat/completions"):
        messages = body.get("messages")
        if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
            last = messages[-1]
            if isinstance(last.get("content"), str):
                changed = {**last, "content": last["content"] + lone}
                return _encode({**body, "messages": [*messages[:-1], changed]})
    elif isinstance(body.get("prompt"), str):
        return _encode({**body, "prompt": body["prompt"] + lone})
    return _encode({**body, "stop": lone})


def _as_parts(body: dict[str, Any]) -> dict[str, Any] | None:
    """``body`` with every string message content as one ``input_text`` part, or None when
    no message has string content."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    changed = False
    out = []
    for message in messages:
        if isinstance(message, dict) and isinstance(message.get("content"), str):
            part = {"type": "input_text", "text": message["content"]}
            out.append({**message, "content": [part]})
            changed = True
        else:
            out.append(message)
    return {**body, "messages": out} if changed else None
