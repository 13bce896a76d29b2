"""The keyword rules: the classifier of a policy without a model (``classes.code`` and
``classes.math``; policies/classes-keyword-rules.yaml ships them).

``code`` and ``math`` each add up weighted signals (keywords, a task phrase, named patterns;
code also a fenced block, math also the density of numbers); a class whose score reaches its
threshold claims the text; when both do, the higher score wins, ``code`` on a tie; else
``tolerant``. Patterns run code's first, then math's, and stop as soon as the ones left cannot
change the class (their weights could not lift the loser past the winner). The reason names the
signals found, e.g. ``code 5 >= 2: fenced block + 2 keywords (python, function)``.

Keywords and task words match ASCII letters case-insensitively, as whole words (punctuation
counts as a space, except ``+`` and ``#``); a phrase's words must be separated by exactly one
space, newline or punctuation character. The text is encoded once; its words come from one
``bytes.translate`` + ``split``, and every keyword and task verb is found with one set
intersection; each pattern runs only when the literals it cannot match without occur
(gateway/request/classify/prefilter.py).
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from common.class_categories import CODE, MATH, TOLERANT
from gateway.policy.classes import ClassesPolicy, CodeRule, MathRule, Pattern, TaskRule
from gateway.request.classify.classification import Classification, ascii_text
from gateway.request.classify.prefilter import DIGITS, Matcher, Scan

_FENCE = r"\n[ \t]*(?:```|~~~)"
_MAX_LISTED = 3  # keywords named in a reason

# The text is also handled as UTF-8 bytes, ASCII letters lowercased.
_PUNCTUATION = set(string.punctuation.encode()) - set(b"+#")  # c++ and c# stay words
_SEPARATORS = _PUNCTUATION | set(string.whitespace.encode())
WORD_TABLE = bytes(32 if b in _SEPARATORS else b for b in range(256))
# Numbers: after "." and "," are deleted (so 4.5 and 1,000 count once), digits stay and every
# other byte becomes a space; the words left are the numbers (the 8 of "int8" counts too).
_DIGIT_TABLE = bytes(b if 48 <= b <= 57 else 32 for b in range(256))


# --------------------------------------------------------------------------- words

_WORD, _PHRASE, _VERB = 0, 1, 2  # kinds of _Words entries


@dataclass(frozen=True, slots=True)
class _Task:
    objects: frozenset[bytes]
    window: int
    weight: float


@dataclass(frozen=True, slots=True)
class _Words:
    """Keywords and task verbs of both classes, found with one set intersection."""

    # first word -> (class, kind, the word; a phrase's words joined and padded by single spaces)
    index: dict[bytes, tuple[tuple[str, int, bytes], ...]]
    firsts: frozenset[bytes]

    @classmethod
    def build(
        cls, keywords: Mapping[str, Iterable[str]], verbs: Mapping[str, Iterable[str]]
    ) -> _Words:
        index: dict[bytes, list[tuple[str, int, bytes]]] = {}
        for owner, words in keywords.items():
            for keyword in words:
                parts = words_of(keyword)
                if parts:
                    kind = _PHRASE if len(parts) > 1 else _WORD
                    joined = b" ".join(parts)
                    joined = b" " + joined + b" " if kind == _PHRASE else joined
                    index.setdefault(parts[0], []).append((owner, kind, joined))
        for owner, words in verbs.items():
            for verb in words:
                for part in words_of(verb)[:1]:
                    index.setdefault(part, []).append((owner, _VERB, part))
        frozen = {word: tuple(entries) for word, entries in index.items()}
        return cls(frozen, frozenset(frozen))

    def found(
        self, words: list[bytes], spaced: bytes
    ) -> tuple[dict[str, list[str]], dict[str, list[bytes]]]:
        """(class -> distinct keywords present, class -> task verbs present).

        ``words`` are the text's words; ``spaced`` is the text with punctuation and whitespace
        turned into spaces, padded with one space each side (phrases are looked up in it, so
        a phrase's words must be exactly one whitespace or punctuation character apart).
        """
        keywords: dict[str, list[str]] = {}
        verbs: dict[str, list[bytes]] = {}
        for word in sorted(self.firsts.intersection(words)):
            for owner, kind, keyword in self.index[word]:
                if kind == _VERB:
                    verbs.setdefault(owner, []).append(word)
                elif kind == _WORD or keyword in spaced:
                    keywords.setdefault(owner, []).append(
                        keyword.strip().decode("utf-8", "replace")
                    )
        return keywords, verbs


def words_of(text: str) -> list[bytes]:
    return text.encode("utf-8", "surrogatepass").lower().translate(WORD_TABLE).split()


def _task(rule: TaskRule | None) -> _Task | None:
    if rule is None:
        return None
    objects = frozenset(w for o in rule.objects for w in words_of(o)[:1])
    return _Task(objects, rule.window, rule.weight)


def _task_found(task: _Task, verbs: list[bytes], words: list[bytes]) -> str | None:
    """``"verb ... object"`` when some verb (present in ``words``) has one of the task's
    objects within its window of following words."""
    for verb in verbs:
        at = words.index(verb)
        while True:
            following = words[at + 1 : at + 1 + task.window]
            for word in following:
                if word in task.objects:
                    return f"{verb.decode()} ... {word.decode()}"
            try:
                at = words.index(verb, at + 1)
            except ValueError:
                break
    return None


# --------------------------------------------------------------------------- compiled rules


@dataclass(frozen=True, slots=True)
class KeywordRules:
    """The ``code`` and ``math`` keyword rules of a ``ClassesPolicy``, words indexed and
    patterns compiled."""

    code: CodeRule
    math: MathRule
    words: _Words
    code_task: _Task | None
    math_task: _Task | None
    fence: Matcher
    code_patterns: tuple[Matcher, ...]
    math_patterns: tuple[Matcher, ...]
    code_patterns_weight: float
    math_patterns_weight: float

    @classmethod
    def build(cls, policy: ClassesPolicy) -> KeywordRules:
        code, math = policy.code, policy.math
        return cls(
            code=code,
            math=math,
            words=_Words.build(
                {CODE: code.keywords, MATH: math.keywords},
                {
                    CODE: code.task.verbs if code.task else [],
                    MATH: math.task.verbs if math.task else [],
                },
            ),
            code_task=_task(code.task),
            math_task=_task(math.task),
            fence=Matcher.build("fenced block", _FENCE, code.fence_weight or 1.0),
            code_patterns=_matchers(code.patterns),
            math_patterns=_matchers(math.patterns),
            code_patterns_weight=sum(p.weight for p in code.patterns),
            math_patterns_weight=sum(p.weight for p in math.patterns),
        )


def _matchers(patterns: Sequence[Pattern]) -> tuple[Matcher, ...]:
    return tuple(Matcher.build(p.name, p.regex, p.weight) for p in patterns)


# --------------------------------------------------------------------------- classification


@dataclass(slots=True)
class _Score:
    total: float = 0.0
    signals: list[str] = field(default_factory=list)
    left: float = 0.0  # weight of the patterns not run yet

    def add(self, weight: float, signal: str) -> None:
        self.total += weight
        self.signals.append(signal)

    def add_keywords(self, hits: list[str], weight: float) -> None:
        if hits and weight:
            listed = ", ".join(hits[:_MAX_LISTED]) + (", ..." if len(hits) > _MAX_LISTED else "")
            self.add(weight * len(hits), f"{len(hits)} keyword{'s' * (len(hits) > 1)} ({listed})")

    def add_task(self, task: _Task | None, verbs: list[bytes], words: list[bytes]) -> None:
        found = _task_found(task, verbs, words) if task is not None and verbs else None
        if task is not None and found:
            self.add(task.weight, f"task ({found})")

    def describe(self) -> str:
        return " + ".join(self.signals) if self.signals else "no signal"


def classify_text(text: str, rules: KeywordRules) -> Classification:
    """The keyword rules' class of ``text`` (see the module docstring)."""
    raw = text.encode("utf-8", "surrogatepass")
    spaced = raw.lower().translate(WORD_TABLE)
    words = spaced.split()
    keywords, verbs = rules.words.found(words, b" " + spaced + b" ")
    # Patterns see the text between two newlines, so "\n" anchors the first and last lines too.
    scan = Scan.of(text, raw)

    code, math = _Score(), _Score()
    if rules.code.fence_weight and rules.fence.search(scan):
        code.add(rules.code.fence_weight, rules.fence.name)
    code.add_keywords(keywords.get(CODE, []), rules.code.keyword_weight)
    code.add_task(rules.code_task, verbs.get(CODE, []), words)
    math.add_keywords(keywords.get(MATH, []), rules.math.keyword_weight)
    math.add_task(rules.math_task, verbs.get(MATH, []), words)
    if rules.math.number_weight and any(digit in scan.marks for digit in DIGITS):
        numbers, count = count_numbers(raw), max(len(words), 1)
        if numbers >= rules.math.min_numbers and numbers / count >= rules.math.number_density:
            math.add(rules.math.number_weight, f"{numbers} numbers in {count} words")

    # The patterns, code's then math's, until the outcome can no longer change.
    code.left, math.left = rules.code_patterns_weight, rules.math_patterns_weight
    for score, matchers in ((code, rules.code_patterns), (math, rules.math_patterns)):
        for matcher in matchers:
            if _decided(code, math, rules):
                break
            score.left -= matcher.weight
            if matcher.search(scan):
                score.add(matcher.weight, matcher.name)
    return _verdict(code, math, rules)


def _decided(code: _Score, math: _Score, rules: KeywordRules) -> bool:
    """Whether the patterns not run yet (worth ``left``) can no longer change the class."""
    code_max, math_max = code.total + code.left, math.total + math.left
    if code.total >= rules.code.threshold and code.total >= math_max:
        return True  # code wins, whatever math still finds (a tie goes to code)
    if math.total >= rules.math.threshold and math.total > code_max:
        return True
    return code_max < rules.code.threshold and math_max < rules.math.threshold


def _verdict(code: _Score, math: _Score, rules: KeywordRules) -> Classification:
    code_hit = code.total >= rules.code.threshold
    math_hit = math.total >= rules.math.threshold
    if code_hit and (not math_hit or code.total >= math.total):
        reason = f"code {code.total:g} >= {rules.code.threshold:g}: {code.describe()}"
        if math_hit:
            reason += f" (math {math.total:g})"
        return Classification(CODE, ascii_text(reason), code.total, math.total)
    if math_hit:
        reason = f"math {math.total:g} >= {rules.math.threshold:g}: {math.describe()}"
        if code_hit:
            reason += f" (code {code.total:g})"
        return Classification(MATH, ascii_text(reason), code.total, math.total)
    reason = (
        f"tolerant: code {code.total:g} < {rules.code.threshold:g}{_brief(code)}, "
        f"math {math.total:g} < {rules.math.threshold:g}{_brief(math)}"
    )
    return Classification(TOLERANT, ascii_text(reason), code.total, math.total)


def count_numbers(data: bytes) -> int:
    """Numbers in the UTF-8 text ``data``: runs of ASCII digits ("." and "," inside a number do
    not split it)."""
    return len(data.translate(_DIGIT_TABLE, b".,").split())


def _brief(score: _Score) -> str:
    return f" ({score.describe()})" if score.signals else ""
