"""Cheap online checks that a streamed answer has degenerated. Pure: text in, a verdict out.

Two detectors, each run on the tail of the answer's text every time it grows (work bounded by
its settings, not by the answer's length):

- ``find_loop``: the text ends in a unit of at most ``max_period`` characters repeated at least
  ``min_repeats`` times and covering at least ``min_chars`` characters ("SISSISSISSISS...",
  "the the the the", a sentence said again and again). The verdict's ``cut`` keeps the first
  occurrence of the unit and drops the repeats.
- ``find_script_mix``: within the last ``window_chars`` characters, letters of more than
  ``max_scripts`` writing systems ("Promachevredjacouter ბა%(Β¥#ינגערא": Latin, Georgian,
  Greek, Hebrew). Digits, punctuation, symbols and spaces belong to no script. The ``cut`` is
  where the window's first letter of a script beyond the answer's first ``max_scripts`` is.

``Degeneration.cut`` is a character offset into the text: what comes before it is kept.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from functools import lru_cache

LOOKBACK = 4096  # characters a loop is followed back to its start (a stream finds it sooner)


@dataclass(frozen=True)
class LoopCheck:
    max_period: int = 40
    min_repeats: int = 4
    min_chars: int = 40


@dataclass(frozen=True)
class ScriptCheck:
    window_chars: int = 32
    max_scripts: int = 2


@dataclass(frozen=True)
class Degeneration:
    kind: str  # "loop" or "scripts"
    cut: int  # keep text[:cut]
    detail: str  # what was seen, for logs and span events


def find_loop(text: str, check: LoopCheck) -> Degeneration | None:
    """A repeated unit at the end of ``text`` (see the module docstring), or None."""
    length = len(text)
    if length < max(check.min_chars, check.min_repeats):
        return None
    for period in range(1, check.max_period + 1):
        span = max(period * check.min_repeats, check.min_chars)
        if span > length:
            break
        # text[-span:] repeats with this period iff it equals itself shifted by one period.
        if text[length - span + period :] != text[length - span : length - period]:
            continue
        start, floor = length - span, max(length - LOOKBACK, period)
        while start >= floor and text[start - period : start] == text[start : start + period]:
            start -= period  # back to the loop's first occurrence (within LOOKBACK)
        unit = text[length - period :]
        return Degeneration("loop", start + period, f"{unit!r} x{(length - start) // period}")
    return None


def find_script_mix(text: str, check: ScriptCheck) -> Degeneration | None:
    """Letters of too many writing systems at the end of ``text``, or None."""
    window = text[-check.window_chars :]
    if window.isascii():
        return None
    seen: dict[str, int] = {}
    offset = len(text) - len(window)
    for index, char in enumerate(window):
        script = _script(char)
        if script is not None and script not in seen:
            seen[script] = offset + index
    if len(seen) <= check.max_scripts:
        return None
    firsts = sorted(seen.values())
    cut = firsts[check.max_scripts]
    names = ", ".join(sorted(seen, key=seen.__getitem__))
    return Degeneration("scripts", cut, f"{len(seen)} scripts in {len(window)} chars: {names}")


# Scripts one language writes together: Japanese mixes kana and kanji, Korean hangul and hanja.
_EAST_ASIAN = {"CJK", "HIRAGANA", "KATAKANA", "HANGUL", "FULLWIDTH", "HALFWIDTH", "IDEOGRAPHIC"}


@lru_cache(maxsize=4096)
def _script(char: str) -> str | None:
    """The writing system of a letter (the first word of its Unicode name: LATIN, CYRILLIC,
    GEORGIAN, ...; the East Asian ones as one, CJK); None for what is not a letter."""
    if char.isascii():
        return "LATIN" if char.isalpha() else None
    if not unicodedata.category(char).startswith("L"):
        return None
    name = unicodedata.name(char, "")
    script = name.split(" ", 1)[0] if name else None
    return "CJK" if script in _EAST_ASIAN else script
