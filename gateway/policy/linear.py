"""Is a routing-policy pattern linear-time? A structural check, run when the policy is loaded.

Python's ``re`` backtracks. A pattern searched over a prompt costs time linear in the prompt
only when no start position can make it scan far and then fail; the classic ways to break that
are an unbounded repeat followed by more pattern (``SELECT[\\w ,]+FROM``: from every ``SELECT``
it scans the whole run, then fails and tries the next start: quadratic) and a repeat inside a
repeat (``(a+)+``: exponential). The rule enforced here is simple and explainable:

- an unbounded repeat (``*``, ``+``, ``{n,}`` or a bound over ``MAX_BOUND``) is allowed only as
  the very last thing in the pattern (a search stops at the first match, so it runs once);
- no unbounded repeat inside another repeat;
- no backreferences.

Everything else must be bounded: write ``[\\w ,]{1,100}`` rather than ``[\\w ,]+``. A bounded
repeat costs at most its bound per start position: linear in the text, with a constant the
operator chose. (The classifier also reads only a bounded window of each prompt, so even a
slow pattern is bounded per request; this check keeps the constant honest.)
tests/unit/gateway/policy/test_linear_patterns.py times every shipped pattern on 10 KB and
100 KB of adversarial text.
"""

from __future__ import annotations

import importlib
from typing import Any

_parser: Any = importlib.import_module("re._parser")  # the standard library's regex parser
MAX_BOUND = 1000
_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")


def superlinear(pattern: str) -> str | None:
    """Why ``pattern`` may take more than linear time, or ``None`` when it passes the rule."""
    try:
        parsed = _parser.parse(pattern)
    except Exception as exc:  # re.error, or the private module changed shape
        return f"cannot be checked ({exc})"
    return _walk(list(parsed), tail_free=True, in_repeat=False)


def _walk(items: list[Any], tail_free: bool, in_repeat: bool) -> str | None:
    for i, (op, av) in enumerate(items):
        name = str(op)
        last = tail_free and i == len(items) - 1
        if name in _REPEATS:
            low, high, sub = av
            unbounded = high is _parser.MAXREPEAT or high > MAX_BOUND
            shown = f"{{{low},}}" if high is _parser.MAXREPEAT else f"{{{low},{high}}}"
            found = _walk(list(sub), last and high <= 1, in_repeat or high > 1)
            if found:
                return found
            if unbounded and in_repeat:
                return f"an unbounded repeat {shown} inside another repeat"
            if unbounded and not last:
                return (
                    f"an unbounded repeat {shown} followed by more of the pattern "
                    f"(bound it, e.g. {{{low},100}})"
                )
        elif name == "SUBPATTERN":
            found = _walk(list(av[3]), last, in_repeat)
        elif name == "ATOMIC_GROUP":
            found = _walk(list(av), last, in_repeat)
        elif name == "BRANCH":
            found = None
            for branch in av[1]:
                found = found or _walk(list(branch), last, in_repeat)
        elif name in ("ASSERT", "ASSERT_NOT"):
            found = _walk(list(av[1]), False, in_repeat)
        elif name == "GROUPREF_EXISTS":
            found = _walk(list(av[1]), last, in_repeat)
            if found is None and av[2] is not None:
                found = _walk(list(av[2]), last, in_repeat)
        elif name == "GROUPREF":
            found = "a backreference"
        else:
            found = None
        if found:
            return found
    return None
