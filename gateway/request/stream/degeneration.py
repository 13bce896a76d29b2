"""Cheap online checks that a streamed answer has degenerated. Pure: text in, a verdict out.

Two detectors run on the tail of the answer's text every time it grows (work bounded by
their settings, not by the answer's length), a third on its tokens' logprobs when the answer
carries them:

- ``find_loop``: the text ends in a unit of at most ``max_period`` characters repeated at least
  ``min_repeats`` times and covering at least ``min_chars`` characters ("SISSISSISSISS...",
  "the the the the", a sentence said again and again). The verdict's ``cut`` keeps the first
  occurrence of the unit and drops the repeats.
- ``find_script_mix``: within the last ``window_chars`` characters, runs of two letters or more
  of more than ``max_scripts`` writing systems ("Promachevredjacouter ბა%(Β¥#ינגערא": Latin,
  Georgian, Hebrew; the lone Greek Β counts for nothing, as α in a formula would not). Digits,
  punctuation, symbols and spaces belong to no script. The ``cut`` is where the first run of a
  script beyond the window's first ``max_scripts`` starts.

- ``LowConfidence``: the mean logprob of the answer's last ``window_tokens`` sampled tokens
  falls under ``min_mean`` (the model no longer believes what it says: garbage, usually). The
  ``cut`` is where the text of the window's first token under ``min_mean`` starts.

``Degeneration.cut`` is a character offset into the text: what comes before it is kept.
"""

from __future__ import annotations

import unicodedata
from collections import deque
from collections.abc import Iterable
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
class ConfidenceCheck:
    window_tokens: int = 16
    min_mean: float = -4.0


LOGPROB_FLOOR = -50.0  # vLLM writes -9999 for a -inf logprob: one token must not swamp a window


@dataclass(frozen=True)
class Degeneration:
    kind: str  # "loop", "scripts" or "logprob"
    cut: int  # keep text[:cut]
    detail: str  # what was seen, for logs and span events


def find_loop(text: str, check: LoopCheck) -> Degeneration | None:
    """A repeated unit at the end of ``text`` (see the module docstring), or None."""
    length = len(text)
    if length < max(check.min_chars, check.min_repeats):
        return None
    last = text[-1]
    for period in range(1, check.max_period + 1):
        span = max(period * check.min_repeats, check.min_chars)
        if span > length:
            break
        if text[-1 - period] != last:  # cheap first: the last character must repeat too
            continue
        # text[-span:] repeats with this period iff it equals itself shifted by one period.
        if text[length - span + period :] != text[length - span : length - period]:
            continue
        # Back to where the repetition starts (within LOOKBACK): whole units, then characters.
        start, floor = length - span, max(length - LOOKBACK, 0)
        while (
            start - period >= floor and text[start - period : start] == text[start : start + period]
        ):
            start -= period
        while start > floor and text[start - 1] == text[start - 1 + period]:
            start -= 1
        unit = text[length - period :]
        if not any(char.isalpha() for char in unit):
            continue  # rules, separators, runs of digits: "-----", "| --- |", "0, 0, 0"
        return Degeneration("loop", start + period, f"{unit!r} x{(length - start) // period}")
    return None


def find_script_mix(text: str, check: ScriptCheck) -> Degeneration | None:
    """Letters of too many writing systems at the end of ``text``, or None."""
    window = text[-check.window_chars :]
    if window.isascii():
        return None
    # A script counts from its first run of two letters: a lone letter is a symbol more often
    # than not (α, β and π in a formula), garbage strings whole fragments of words.
    seen: dict[str, int] = {}
    offset = len(text) - len(window)
    previous = None
    for index, char in enumerate(window):
        script = _script(char)
        if script is not None and script == previous and script not in seen:
            seen[script] = offset + index - 1
        previous = script
    if len(seen) <= check.max_scripts:
        return None
    firsts = sorted(seen.values())
    cut = firsts[check.max_scripts]
    names = ", ".join(sorted(seen, key=seen.__getitem__))
    return Degeneration("scripts", cut, f"{len(seen)} scripts in {len(window)} chars: {names}")


class LowConfidence:
    """The rolling mean of an answer's last ``window_tokens`` token logprobs (see the module
    docstring). Fed each event's tokens' logprobs with where the event's text starts."""

    def __init__(self, check: ConfidenceCheck) -> None:
        self.check = check
        self._window: deque[tuple[float, int]] = deque()  # (logprob, its text's start)
        self._total = 0.0

    def add(self, logprobs: Iterable[float], start: int) -> Degeneration | None:
        """The verdict after these tokens, or None."""
        size = self.check.window_tokens
        for logprob in logprobs:
            value = max(logprob, LOGPROB_FLOOR)
            self._window.append((value, start))
            self._total += value
            if len(self._window) > size:
                self._total -= self._window.popleft()[0]
        if len(self._window) < size:
            return None
        mean = self._total / size
        if mean >= self.check.min_mean:
            return None
        # Cut where the drop begins: the window's first token under the mean asked for.
        cut = next(start for value, start in self._window if value < self.check.min_mean)
        detail = f"mean logprob {mean:.2f} over the last {size} tokens"
        return Degeneration("logprob", cut, detail)

    def clear(self) -> None:
        """The answer goes on elsewhere: the next tier's tokens start a new window."""
        self._window.clear()
        self._total = 0.0


# Scripts one language writes together: Japanese mixes kana and kanji, Korean hangul and hanja.
_EAST_ASIAN = {
    "CJK", "HIRAGANA", "KATAKANA", "KATAKANA-HIRAGANA", "HANGUL", "FULLWIDTH", "HALFWIDTH",
    "IDEOGRAPHIC", "BOPOMOFO",
}  # fmt: skip
# Writing systems by the first word of their letters' Unicode names. Any other letter (letter-
# like symbols: DOUBLE-STRUCK, MATHEMATICAL, MICRO, MODIFIER ...) belongs to none.
_SCRIPTS = _EAST_ASIAN | {
    "LATIN", "GREEK", "COPTIC", "CYRILLIC", "ARMENIAN", "HEBREW", "ARABIC", "SYRIAC", "THAANA",
    "NKO", "DEVANAGARI", "BENGALI", "GURMUKHI", "GUJARATI", "ORIYA", "TAMIL", "TELUGU",
    "KANNADA", "MALAYALAM", "SINHALA", "THAI", "LAO", "TIBETAN", "MYANMAR", "GEORGIAN",
    "ETHIOPIC", "CHEROKEE", "CANADIAN", "OGHAM", "RUNIC", "KHMER", "MONGOLIAN", "YI", "TIFINAGH",
    "JAVANESE", "BALINESE", "SUNDANESE", "TAGALOG", "VAI", "BAMUM", "ADLAM", "OL",
}  # fmt: skip


@lru_cache(maxsize=4096)
def _script(char: str) -> str | None:
    """The writing system of a letter (the first word of its Unicode name: LATIN, CYRILLIC,
    GEORGIAN, ...; the East Asian ones as one, CJK); None for what is not a letter."""
    if char.isascii():
        return "LATIN" if char.isalpha() else None
    if unicodedata.category(char) not in ("Lu", "Ll", "Lt", "Lo"):
        return None  # Lm (modifier letters) and everything else: no script
    name = unicodedata.name(char, "")
    script = name.split(" ", 1)[0] if name else ""
    if script not in _SCRIPTS:
        return None
    return "CJK" if script in _EAST_ASIAN else script
