"""What a request body's values may be beyond JSON's grammar: what can be sent on to a tier.

Python's decoder takes ``NaN``, ``Infinity``, ``-Infinity`` and numbers that overflow to them
(``1e999``), and string escapes of lone UTF-16 surrogates (``"\\ud800"``); none of them can be
sent on (the tier-bound encoder refuses non-finite numbers, a lone surrogate is not Unicode:
encoding it as UTF-8 raises), so each is a 400 naming where it is. The checks cost nothing on
the common path: the decoder's hooks see only floats and the constants, and strings are
walked only when the raw body holds a surrogate escape at all.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from gateway.errors import APIError

# A surrogate escape somewhere in the raw body (a pair, a lone one, or an escaped backslash
# followed by such text): only then can a decoded string hold a lone surrogate (the body is
# strict UTF-8, which encodes no surrogate: gateway/request/completions/body.py).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # (one alternative: 15x faster)
_SURROGATE = re.compile("[\ud800-\udfff]")
_MAX_KEY_SHOWN = 40
_MAX_PATH_SHOWN = 200


class NonFinite(ValueError):
    """Raised by the decoder's hooks on a number JSON cannot carry on (its text kept)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class _Marked(float):
    """A non-finite number as the second, locating decode keeps it."""

    text: str


def finite_float(text: str) -> float:
    """The decoder's ``parse_float``: the number, or ``NonFinite`` when it overflows."""
    value = float(text)
    if math.isinf(value):
        raise NonFinite(text)
    return value


def refuse_constant(text: str) -> float:
    """The decoder's ``parse_constant`` (``NaN``, ``Infinity``, ``-Infinity``): refused."""
    raise NonFinite(text)


def _mark(text: str) -> float:
    marked = _Marked(text)
    marked.text = text
    return marked


def _mark_large(text: str) -> float:
    value = float(text)
    return _mark(text) if math.isinf(value) else value


def non_finite_error(raw: str, found: NonFinite) -> APIError:
    """The 400 for a body whose decode met ``found``: decoded again, marking such numbers,
    to name the first one's place (the error path only)."""
    body = json.loads(raw, parse_float=_mark_large, parse_constant=_mark)
    path = _first(body, lambda value: isinstance(value, _Marked))
    where = path or "the request body"
    return APIError(
        400,
        f"Invalid value for '{where}': {_shown(found.text)} is not a finite number (JSON "
        "numbers must be finite)",
        param=path or None,
        code="invalid_value",
    )


def check_surrogates(raw: bytes, body: Any) -> None:
    """A 400 naming the first string (value or key) of ``body`` that holds a lone UTF-16
    surrogate; strings are walked only when ``raw`` escapes a surrogate at all."""
    if _SURROGATE_ESCAPE.search(raw) is None:
        return
    path = _first(body, lambda value: isinstance(value, str) and bool(_SURROGATE.search(value)))
    if path is None:
        return
    raise APIError(
        400,
        f"Invalid value for '{path}': a string holds a lone UTF-16 surrogate (U+D800 to U+DFFF "
        "without its pair), which is not Unicode text",
        param=path,
        code="invalid_value",
    )


def _first(body: Any, bad: Any) -> str | None:
    """The path (``messages[0].content``) of the first value, or dictionary key, of ``body``
    for which ``bad`` holds, depth first in document order; ``""`` for the body itself.
    Iterative: the body's nesting is bounded before decoding, but no recursion either way."""
    stack: list[tuple[Any, str]] = [(body, "")]
    while stack:
        value, path = stack.pop()
        if bad(value):
            return path
        if isinstance(value, dict):
            children = []
            for key, item in value.items():
                where = _key_path(path, key)
                if bad(key):
                    return where
                children.append((item, where))
            stack.extend(reversed(children))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]") for i, item in reversed(list(enumerate(value))))
    return None


def _key_path(path: str, key: str) -> str:
    if key.isidentifier():
        shown = key if len(key) <= _MAX_KEY_SHOWN else key[: _MAX_KEY_SHOWN - 3] + "..."
        step = f".{shown}" if path else shown
    else:
        step = f"[{_shown(json.dumps(key))}]"
    joined = path + step
    return joined if len(joined) <= _MAX_PATH_SHOWN else "..." + joined[-_MAX_PATH_SHOWN + 3 :]


def _shown(text: str) -> str:
    """``text`` bounded for a one-line message (ASCII: surrogates shown as escapes)."""
    text = json.dumps(text)[1:-1] if not text.isascii() or not text.isprintable() else text
    return text if len(text) <= _MAX_KEY_SHOWN else text[: _MAX_KEY_SHOWN - 3] + "..."
