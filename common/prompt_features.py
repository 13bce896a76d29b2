"""A prompt's features for the request classifier's model: shared by the gateway (inference,
gateway/prompt_model.py) and the training (classifier/train.py), so both see the same thing.

Standard library only. All features are binary (present or not) and read from a bounded window
(the first ``head`` and the last ``tail`` characters of the text):

- ``w:<word>``: the lowercased ASCII words (punctuation splits words, except ``+`` and ``#``,
  so ``c++`` and ``c#`` are words); non-ASCII bytes stay inside words;
- ``c:<byte>``: each distinct byte that is neither an ASCII letter nor whitespace
  (punctuation, digits, the UTF-8 bytes of symbols such as ``≤``): what code and formulas are
  made of;
- ``x:numbers=<bucket>``, ``x:words=<bucket>``: how many numbers, how many words.

Everything is a C-level pass over the window's bytes (``translate``, ``split``,
``frozenset``): linear in the window, with no regular expressions. (Adjacent word pairs were
tried: no better in cross-validation, and they cost as much as everything else together.)
"""

from __future__ import annotations

import string
from dataclasses import dataclass

# Bytes: punctuation (but + and #) and whitespace split words; letters lowercase first.
_PUNCTUATION = set(string.punctuation.encode()) - set(b"+#")
_SEPARATORS = _PUNCTUATION | set(string.whitespace.encode())
_WORD_TABLE = bytes(32 if b in _SEPARATORS else b for b in range(256))
_LETTERS_AND_SPACE = bytes(b for b in range(128) if chr(b).isalpha() or chr(b).isspace())
_DIGIT_TABLE = bytes(b if 48 <= b <= 57 else 32 for b in range(256))
_NUMBER_BUCKETS = ((0, "0"), (1, "1"), (2, "2"), (5, "3-5"), (10, "6-10"), (1 << 62, "11+"))
_WORD_BUCKETS = ((8, "1-8"), (24, "9-24"), (64, "25-64"), (256, "65-256"), (1 << 62, "257+"))


def window(text: str, head: int, tail: int) -> str:
    """The part of ``text`` the model reads: all of it, or its first ``head`` and last
    ``tail`` characters joined by a newline."""
    if len(text) <= head + tail:
        return text
    return text[:head] + "\n" + text[len(text) - tail :] if tail else text[:head]


def _bucket(value: int, buckets: tuple[tuple[int, str], ...]) -> str:
    for limit, name in buckets:
        if value <= limit:
            return name
    return buckets[-1][1]


@dataclass(frozen=True, slots=True)
class Features:
    """The features present in one text (its window), by kind."""

    words: frozenset[bytes]
    marks: frozenset[int]
    extra: tuple[str, ...]

    @property
    def count(self) -> int:
        return len(self.words) + len(self.marks) + len(self.extra)

    def names(self) -> list[str]:
        """Every feature as its name in a weights file (training uses these)."""
        out = [f"w:{w.decode('utf-8', 'surrogateescape')}" for w in self.words]
        out += [f"c:{m}" for m in self.marks]
        out += list(self.extra)
        return out


def features(text: str, head: int, tail: int) -> Features:
    """The features of ``text``'s window (see the module docstring)."""
    raw = window(text, head, tail).encode("utf-8", "surrogatepass").lower()
    words = raw.translate(_WORD_TABLE).split()
    numbers = len(raw.translate(_DIGIT_TABLE, b".,").split())
    extra = (
        f"x:numbers={_bucket(numbers, _NUMBER_BUCKETS)}",
        f"x:words={_bucket(len(words), _WORD_BUCKETS)}",
    )
    return Features(
        frozenset(words),
        frozenset(raw.translate(None, _LETTERS_AND_SPACE)),
        extra,
    )


def feature_key(name: str) -> bytes | int | str:
    """A feature name of a weights file → the key ``Features`` holds."""
    kind, _, body = name.partition(":")
    if kind == "w":
        return body.encode("utf-8", "surrogateescape")
    if kind == "c":
        return int(body)
    if kind == "x":
        return name
    raise ValueError(f"unknown feature kind {kind!r} in {name!r}")


def feature_name(key: object) -> str:
    """How a feature reads in a reason: ``python``, ``'='``, ``numbers=3-5``."""
    if isinstance(key, bytes):
        return key.decode("utf-8", "replace")
    if isinstance(key, int):
        return repr(chr(key)) if key < 128 else f"byte {key:#x}"
    return str(key).removeprefix("x:")
