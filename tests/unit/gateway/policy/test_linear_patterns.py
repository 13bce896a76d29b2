"""No pattern the repository ships takes more than linear time, checked two ways: the
structural rule the policy loader enforces (gateway/policy/linear.py), and the clock: each
pattern searched over 10 KB and 100 KB of adversarial text (its own literals repeated, the way
the old quadratic ones were broken) may take at most ~2.5x the linear growth (10x)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import yaml

from gateway.policy.linear import superlinear
from gateway.policy.schema import PolicyError, parse_policy

ROOT = Path(__file__).resolve().parents[4]
FILES = (ROOT / "policies" / "routing.yaml", ROOT / "policies" / "classes-keyword-rules.yaml")
ROUTES = "tiers: [t]\nroutes: {tolerant: [t], code: [t], math: [t], long: [t]}\n"
# Pieces that make a backtracking pattern start often and scan far before it fails.
PIECES = (
    "SELECT a, b.c, * ",
    "function f(a, b ",
    "def f ",
    "`aaa ",
    "<a href=x title=y ",
    "x = y ",
    "from a.b import ",
    "import a.b.c ",
    "const x ",
    "#include ",
    "void f ",
    "a.b(",
    "f(x ",
    "2 + 3 ",
    "1 - 2 ",
    "== ",
    ") { ",
    ") => ",
    "\nclass A ",
    "```",
    "x^2 ",
    "\\frac ",
)


def shipped_patterns() -> list[tuple[str, str]]:
    found = []
    for path in FILES:
        classes = yaml.safe_load(path.read_text(encoding="utf-8"))["classes"]
        for cls in ("code", "math"):
            for pattern in (classes.get(cls) or {}).get("patterns", []):
                found.append((f"{path.name}:{pattern['name']}", pattern["regex"]))
        for override in classes.get("overrides") or []:
            if "regex" in override:
                found.append((f"{path.name}:{override['name']}", override["regex"]))
    return found


def adversarial(size: int) -> list[str]:
    texts = [(piece * (size // len(piece) + 1))[:size] for piece in PIECES]
    mixed = "".join(PIECES)
    return [*texts, (mixed * (size // len(mixed) + 1))[:size]]


def total_time(regex: re.Pattern[str], texts: list[str]) -> float:
    """The search time over ``texts``, each the best of 7 runs (robust to a loaded machine),
    and never below 100 us (so a ratio of two tiny times is not noise)."""
    total = 0.0
    for text in texts:
        best = float("inf")
        for _ in range(7):
            started = time.perf_counter()
            regex.search(text)
            best = min(best, time.perf_counter() - started)
        total += best
    return max(total, 1e-4)


def test_the_shipped_files_have_patterns() -> None:
    names = [name for name, _ in shipped_patterns()]
    assert "routing.yaml:fenced_block" in names
    assert "classes-keyword-rules.yaml:sql_query" in names
    assert len(names) > 20


@pytest.mark.parametrize(("name", "pattern"), shipped_patterns())
def test_every_shipped_pattern_passes_the_rule(name: str, pattern: str) -> None:
    assert superlinear(pattern) is None, name


@pytest.mark.parametrize(("name", "pattern"), shipped_patterns())
def test_every_shipped_pattern_grows_linearly(name: str, pattern: str) -> None:
    regex = re.compile(pattern)
    small, large = adversarial(10_000), adversarial(100_000)
    total_time(regex, small)  # warm-up
    ratio = total_time(regex, large) / total_time(regex, small)
    assert ratio < 25, f"{name}: 100 KB took {ratio:.0f}x the time of 10 KB"


def test_the_clock_catches_the_old_quadratic_patterns() -> None:
    """The guard is not vacuous: the patterns the review found quadratic fail it."""
    for old in (
        r"SELECT[ \t]+[\w*,. \t]+[ \t]FROM[ \t]+\w",
        r"function[ \t]*\w*[ \t]*\([^)\n]*\)[ \t]*\{",
    ):
        regex = re.compile(old)
        small, large = adversarial(2_000), adversarial(20_000)
        ratio = total_time(regex, large) / total_time(regex, small)
        assert ratio > 40, old
        assert superlinear(old) is not None


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"(a+)+b", "inside another repeat"),
        (r"SELECT[\w ,]+FROM", "followed by more of the pattern"),
        (r"(\w{1,5})\1", "backreference"),
        (r"x{0,5000}y", "followed by more of the pattern"),
    ],
)
def test_the_rule_refuses_superlinear_patterns(pattern: str, why: str) -> None:
    reason = superlinear(pattern)
    assert reason is not None and why in reason


@pytest.mark.parametrize(
    "pattern", [r"def\w+", r"`[^`\n]{1,200}`", r"(?:ab|cd)[ \t]{0,8}x", r"a.*"]
)
def test_the_rule_accepts_bounded_or_final_repeats(pattern: str) -> None:
    assert superlinear(pattern) is None


def test_the_policy_refuses_a_superlinear_pattern_in_one_line() -> None:
    text = (
        ROUTES + "classes:\n  overrides:\n    - {name: sql, class: code, regex: 'SELECT.+FROM'}\n"
    )
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    message = str(info.value)
    assert "\n" not in message and "classes.overrides[0].regex" in message
    assert "more than linear time" in message
