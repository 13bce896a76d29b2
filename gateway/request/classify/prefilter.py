"""The classifier's literal pre-filter: run a pattern only when the text holds the literals it
cannot match without.

``required_literals`` walks the pattern as Python's own regex parser (``re._parser``, a private
module) reads it: runs of literal characters, small character classes, ``\\d``, alternatives
(each must give a literal), groups, positive lookarounds and repeats of at least one. What the
pattern needs becomes ``Factor``s: each holds when one of its alternatives occurs. Most
alternatives are "marks" (punctuation, digits, non-ASCII characters), looked up in the text's
short marks string (``Scan.marks``: the UTF-8 bytes without ASCII letters and whitespace) rather
than in the text; the others are searched in the text, at most ``_MAX_SCANS`` per pattern.
``Matcher`` is a compiled pattern with its factors, checked before the regular expression runs.

The pre-filter may only skip work: a pattern it does not understand gets no factor and always
runs, and a factor never rejects a text the expression matches (short of exotic Unicode case
variants of ASCII letters under IGNORECASE). Patterns led by a literal run fastest in Python's
``re``; the shipped ones (policies/routing.yaml) are written that way.
"""

from __future__ import annotations

import importlib
import re
import string
from dataclasses import dataclass
from typing import Any

_MAX_SCANS = 2  # factors per pattern that search the text (the others are nearly free)
_MAX_SCAN_ALTERNATIVES = 4  # a factor needing more text searches than this is not worth it
# Deleting ASCII letters and whitespace leaves a short "marks" string: punctuation, digits and
# non-ASCII characters, which answers "does the text contain ';'" or "... '≤'" cheaply.
LETTERS_AND_SPACE = bytes(b for b in range(128) if chr(b).isalpha() or chr(b).isspace())
DIGITS = tuple(str(d).encode() for d in range(10))


@dataclass(frozen=True, slots=True)
class Factor:
    """One necessary condition of a pattern: at least one alternative occurs in the text.

    ``marks``: alternatives without ASCII letters or whitespace (``;``, ``==``, ``≤``), looked up
    in the text's marks (see ``LETTERS_AND_SPACE``); a literal occurring in the text occurs
    there too. ``words``: alternatives with letters, searched in the text, each with the marks
    it needs (``#include`` needs ``#``). ``unicode_digit``: the factor stands for ``\\d``,
    which non-ASCII digits satisfy too.
    """

    marks: tuple[bytes, ...] = ()  # ASCII ones
    other_marks: tuple[bytes, ...] = ()  # non-ASCII ones (absent from an ASCII text)
    words: tuple[tuple[str, tuple[bytes, ...]], ...] = ()
    unicode_digit: bool = False

    def holds(self, scan: Scan, haystack: str) -> bool:
        """Whether the factor holds for ``scan``; ``haystack`` is its text, lowercased when
        the pattern ignores case."""
        marks = scan.marks
        for mark in self.marks:
            if mark in marks:
                return True
        if not scan.ascii:
            if self.unicode_digit:
                return True
            for mark in self.other_marks:
                if mark in marks:
                    return True
        for literal, needs in self.words:
            if all(need in marks for need in needs) and literal in haystack:
                return True
        return False


@dataclass(frozen=True, slots=True)
class Matcher:
    """A compiled pattern and the factors checked before it runs (see ``required_literals``)."""

    name: str
    regex: re.Pattern[str]
    weight: float
    factors: tuple[Factor, ...]
    ignorecase: bool
    # The ASCII marks of the first factor when that is all it has: checked inline, first.
    gate: tuple[bytes, ...] | None

    @classmethod
    def build(cls, name: str, pattern: str, weight: float) -> Matcher:
        factors, ignorecase = required_literals(pattern)
        gate = None
        if factors and not (factors[0].other_marks or factors[0].words or factors[0].unicode_digit):
            gate, factors = factors[0].marks, factors[1:]
        return cls(name, re.compile(pattern), weight, factors, ignorecase, gate)

    def search(self, scan: Scan) -> bool:
        if self.gate is not None:
            marks = scan.marks
            for mark in self.gate:
                if mark in marks:
                    break
            else:
                return False
        if self.factors:
            haystack = scan.lowered() if self.ignorecase else scan.text
            for factor in self.factors:
                if not factor.holds(scan, haystack):
                    return False
        return self.regex.search(scan.text) is not None


@dataclass(slots=True)
class Scan:
    """The text as patterns see it (between two added newlines) and what is known about it."""

    text: str
    marks: bytes  # its UTF-8 bytes without ASCII letters and whitespace
    ascii: bool
    _lowered: str | None = None

    @classmethod
    def of(cls, text: str, raw: bytes | None = None) -> Scan:
        """``text`` ready for ``Matcher.search``; ``raw``: its UTF-8 bytes, when at hand."""
        raw = text.encode("utf-8", "surrogatepass") if raw is None else raw
        return cls("\n" + text + "\n", raw.translate(None, LETTERS_AND_SPACE), raw.isascii())

    def lowered(self) -> str:
        if self._lowered is None:
            self._lowered = self.text.lower()
        return self._lowered


# --------------------------------------------------------------------------- required literals

_parser: Any = importlib.import_module("re._parser")  # the standard library's regex parser
_SMALL_SET = 32  # a character class of at most this many characters becomes a factor


def required_literals(pattern: str) -> tuple[tuple[Factor, ...], bool]:
    """What ``pattern`` cannot match without: (factors, all true; whether to scan lowercased).

    Walks the parsed expression: runs of literal characters, small character classes, ``\\d``,
    alternatives (each must give a literal), groups, positive lookarounds and repeats of at
    least one. A factor with a whitespace or lone-letter alternative is dropped (it would hold
    for any text). Anything the walk does not understand gives no factor, which only weakens
    the pre-check; it never rejects a text the expression matches (short of exotic Unicode case
    variants of ASCII letters under IGNORECASE). No factor: the expression always runs.
    """
    try:
        parsed = _parser.parse(pattern)
        ignorecase = bool(parsed.state.flags & re.IGNORECASE)
        raw = _factors(parsed, ignorecase)
    except Exception:  # a private module: if it changes shape, just skip the pre-check
        return (), False
    factors: list[Factor] = []
    for alternatives in dict.fromkeys(raw):
        factor = _factor(alternatives, ignorecase)
        if factor is not None:
            factors.append(factor)
    free = [f for f in factors if not f.words]
    searched = sorted(
        (f for f in factors if f.words and len(f.words) <= _MAX_SCAN_ALTERNATIVES),
        key=lambda f: (len(f.words), -min(len(w) for w, _ in f.words)),
    )
    return tuple(free + searched[:_MAX_SCANS]), ignorecase


_DIGIT_ALTERNATIVE = "\x00digit"  # stands for \d among a factor's alternatives


def _factor(alternatives: tuple[str, ...], ignorecase: bool) -> Factor | None:
    marks: list[bytes] = []
    words: list[str] = []
    unicode_digit = False
    for alternative in alternatives:
        letters = [c for c in alternative if c.isascii() and c.isalpha()]
        if alternative == _DIGIT_ALTERNATIVE:
            marks.extend(DIGITS)
            unicode_digit = True
        elif alternative.isspace() or (
            len(alternative) == 1 and alternative in string.ascii_letters
        ):
            return None  # holds for nearly any text: not worth checking
        elif ignorecase and not alternative.isascii():
            return None  # case folding beyond ASCII: do not second-guess the regex engine
        elif not letters:
            marks.append(alternative.encode("utf-8", "surrogatepass"))
        else:
            words.append(alternative)
    # "print" occurring is implied by "println" occurring: keep only the shortest.
    kept = [w for w in words if not any(o != w and o in w for o in words)]
    needed = tuple(
        (w, tuple(c.encode("utf-8", "surrogatepass") for c in dict.fromkeys(w) if not c.isalpha()))
        for w in kept
    )
    unique = list(dict.fromkeys(marks))
    ascii_marks = tuple(m for m in unique if m.isascii())
    other_marks = tuple(m for m in unique if not m.isascii())
    return Factor(ascii_marks, other_marks, needed, unicode_digit)


def _factors(items: Any, ignorecase: bool) -> list[tuple[str, ...]]:
    """Factors (tuples of alternatives) of a parsed sequence; all must hold."""
    out: list[tuple[str, ...]] = []
    run: list[str] = []

    def flush() -> None:
        # A run with whitespace in it needs its longest part without any (whitespace checks
        # are worthless: every text has some).
        if run:
            literal = max("".join(run).split() or [""], key=len)
            if literal:
                out.append((literal.lower() if ignorecase else literal,))
            run.clear()

    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            run.append(chr(av))
            continue
        flush()
        if name == "SUBPATTERN":
            _group, add_flags, del_flags, sub = av
            if (add_flags | del_flags) & re.IGNORECASE:
                continue  # a local case flag: leave this group out
            out.extend(_factors(sub, ignorecase))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, _high, sub = av
            if low >= 1:
                out.extend(_factors(sub, ignorecase))
        elif name == "ATOMIC_GROUP":
            out.extend(_factors(av, ignorecase))
        elif name == "ASSERT":  # a positive lookahead/lookbehind must match too
            out.extend(_factors(av[1], ignorecase))
        elif name == "BRANCH":
            alternatives = _branch(av[1], ignorecase)
            if alternatives:
                out.append(alternatives)
        elif name == "IN":
            chars = _char_set(av)
            if chars:
                out.append(tuple(c.lower() for c in chars) if ignorecase else chars)
    flush()
    return out


def _branch(branches: Any, ignorecase: bool) -> tuple[str, ...]:
    alternatives: list[str] = []
    for branch in branches:
        factors = [f for f in _factors(branch, ignorecase) if _factor(f, ignorecase) is not None]
        if not factors:
            return ()  # this branch needs no literal, so the alternation needs none
        best: tuple[str, ...] = max(factors, key=_selectivity)
        alternatives.extend(best)
    return tuple(dict.fromkeys(alternatives))


def _selectivity(alternatives: tuple[str, ...]) -> tuple[int, int]:
    """Higher is rarer in text: long literals, then punctuation; digits are common."""
    lengths = [0 if a == _DIGIT_ALTERNATIVE else len(a) for a in alternatives]
    return min(lengths), -len(alternatives)


def _char_set(items: Any) -> tuple[str, ...]:
    chars: list[str] = []
    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            chars.append(chr(av))
        elif name == "RANGE" and av[1] - av[0] < _SMALL_SET:
            chars.extend(chr(c) for c in range(av[0], av[1] + 1))
        elif name == "CATEGORY" and str(av) == "CATEGORY_DIGIT":
            chars.append(_DIGIT_ALTERNATIVE)
        else:
            return ()  # NEGATE, other categories, wide ranges: no usable literal
        if len(chars) > _SMALL_SET:
            return ()
    return tuple(dict.fromkeys(chars))
