"""The classifier's literal pre-filter: required literals of a pattern, and matchers that skip
the expression when one is missing but never change what a pattern finds."""

from __future__ import annotations

import re

import pytest

from gateway.request.classify.prefilter import Matcher, Scan, required_literals


def test_required_literals_of_a_literal_led_pattern() -> None:
    factors, ignorecase = required_literals(r"#include[ \t]*[<\"]")
    assert not ignorecase
    marks = sorted(m for f in factors for m in f.marks)
    assert marks == [b'"', b"<"]
    assert [w for f in factors for w, _ in f.words] == ["#include"]


def test_required_literals_of_alternatives_and_lookarounds() -> None:
    factors, _ = required_literals(r"\((?:(?<=sin\()|(?<=cos\())")
    words = sorted(w for f in factors for w, _ in f.words)
    assert words == ["cos(", "sin("]
    assert required_literals(r"\w+|;")[0] == ()  # one branch needs no literal: no factor
    assert required_literals(r"(?i:ab)cd")[0] != ()  # the group with its own flags is left out
    assert required_literals(r"(?i:ab)c")[0] == ()  # ... and a lone letter is not worth it


def test_ignorecase_patterns_are_checked_on_lowered_text() -> None:
    matcher = Matcher.build("select", r"(?i)select\s", 1)
    assert matcher.ignorecase
    assert matcher.search(Scan.of("SeLeCt x"))
    assert not matcher.search(Scan.of("choose x"))


PATTERNS = [
    r"def[ \t]+\w+[ \t]*\(",
    r"\n[ \t]*class[ \t]+\w+[ \t]*[(:]",
    r"=(?:(?<=[\w)]=)|(?<=[\w)] =))[ \t]*[-+]?(?:\d|[a-z](?!\w))",
    r"\^[ \t]?[\d(a-z]|\*\*(?<=[a-z0-9)]\*\*)\d|[²³]",
    r"[∑∫√π∞≈≠≤≥±∂∆∈∀∃×÷]",
    r"[+*/^](?:(?<=\d[+*/^])|(?<=\d [+*/^]))[ \t]?\d",
    r" - (?<=\d - )\d",
    r"(?:print(?:ln|f)?|console\.log)\(",
    r"(?i)\bselect\b.+\bfrom\b",
    r"\d{3}-\d{4}",
    r"x(?=y)",
    r"ab+c",
]
TEXTS = [
    "",
    "def f(x):\n  return x",
    "class Foo(Bar):\n pass",
    "x = 5 and y=z",
    "x^2 + 2**3 and x²",
    "∫ f and π",
    "٣ + ٤ digits",
    "12 + 7 and 3/4",
    "12 - 7",
    "println(1); console.log(2)",
    "SELECT a FROM b",
    "call 555-1234",
    "xy abbbc",
    "plain words only, nothing else here.",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_pre_checks_never_change_what_a_pattern_finds(pattern: str) -> None:
    matcher = Matcher.build("p", pattern, 1)
    for text in TEXTS:
        scan = Scan.of(text)
        assert matcher.search(scan) == bool(re.search(pattern, scan.text)), (pattern, text)


def test_the_pre_check_skips_the_expression_when_a_literal_is_missing() -> None:
    matcher = Matcher.build("p", r"void[ \t]+\w+\(", 1)

    class Exploding:
        def search(self, text: str) -> None:
            raise AssertionError("the expression ran")

    fake = Matcher(matcher.name, Exploding(), 1, matcher.factors, False, matcher.gate)  # type: ignore[arg-type]
    assert fake.search(Scan.of("a void function with no parenthesis")) is False
    with pytest.raises(AssertionError, match="the expression ran"):
        fake.search(Scan.of("void f("))
