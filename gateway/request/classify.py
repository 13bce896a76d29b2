"""The request classifier: a request → ``tolerant`` | ``code`` | ``math`` | ``long``, with a reason.

Pure and deterministic. ``classify_request`` is the entry point (gateway/request/plan.py calls
it); the policy's ``classes`` section (gateway/policy/schema.py) decides, in this order:

1. ``long`` when the prompt has at least ``long.min_tokens`` tokens;
2. ``overrides`` with ``stage: before``: the first whose regex or keywords match forces its class;
3. the trained model (``classes.model``, gateway/request/prompt_model.py): P(precise) at or above
   the threshold is ``code`` or ``math`` (its code-vs-math regression tells which), below it
   ``tolerant``; a chat's user turns are scored one by one and weighted toward the last, the
   system messages count too, and the context can raise the last turn's probability, never lower
   it; each prompt of a completions list is scored and the most precise decides;
   or, in a policy without a model, the keyword rules (``classify`` below);
4. ``overrides`` with ``stage: after``: a match replaces the class found.

What is read is bounded whatever the request's size (``classes.window``): the last
``max_turns`` user messages and the leading system messages of a chat, the first ``max_prompts``
prompts of a list (the rest as one text), and of each text a window of its first and last
characters. The reason is ASCII (anything else is escaped) so it can travel as a header:
``code: p(precise) 0.998 >= 0.106 (prompt-model v1: +that +program +pytho); p(code) 1.00``.

The keyword rules (``classify``): ``code`` and ``math`` each add up weighted signals (keywords,
a task phrase, named patterns; code also a fenced block, math also the density of numbers); a
class whose score reaches its threshold claims the text; when both do, the higher score wins,
``code`` on a tie; else ``tolerant``. Patterns run code's first, then math's, and stop as soon as
the ones left cannot change the class. Keywords and task words match ASCII letters
case-insensitively, as whole words (punctuation counts as a space, except ``+`` and ``#``); a
phrase's words must be separated by exactly one space, newline or punctuation character.

Speed (the issue asks for a median under 100 µs for a 1,000-token prompt):
- the rules and the model are compiled once per policy (``CompiledClasses.build``; the
  gateway's policy store keeps the compiled form beside the policy it came from; passing a bare
  ``ClassesPolicy`` to ``classify`` compiles it on every call, which is for tests);
- the text is encoded once; its words come from one ``bytes.translate`` + ``split``, and every
  keyword and task verb is found with one set intersection;
- each pattern carries the literals it cannot match without and runs only when they occur (the
  literal pre-filter: gateway/request/prefilter.py); every pattern is linear-time
  (gateway/policy/linear.py).
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.prompt_features import window
from gateway.policy.schema import (
    ClassesPolicy,
    CodeRule,
    MathRule,
    ModelRule,
    Override,
    Pattern,
    PolicyError,
    TaskRule,
)
from gateway.request.prefilter import DIGITS, Matcher, Scan
from gateway.request.prompt_model import ModelError, PromptModel, TextScore, combine, sigmoid

TOLERANT, CODE, MATH, LONG = "tolerant", "code", "math", "long"
_FENCE = r"\n[ \t]*(?:```|~~~)"
_MAX_LISTED = 3  # keywords named in a reason

# The text is also handled as UTF-8 bytes, ASCII letters lowercased.
_PUNCTUATION = set(string.punctuation.encode()) - set(b"+#")  # c++ and c# stay words
_SEPARATORS = _PUNCTUATION | set(string.whitespace.encode())
_WORD_TABLE = bytes(32 if b in _SEPARATORS else b for b in range(256))
# Numbers: after "." and "," are deleted (so 4.5 and 1,000 count once), digits stay and every
# other byte becomes a space; the words left are the numbers (the 8 of "int8" counts too).
_DIGIT_TABLE = bytes(b if 48 <= b <= 57 else 32 for b in range(256))


@dataclass(frozen=True)
class Classification:
    """The class of a request and why. The scores (for telemetry) add up the signals found
    before the class was decided, so they are lower bounds of the full scores."""

    cls: str
    reason: str
    code_score: float = 0.0
    math_score: float = 0.0
    p_precise: float | None = None  # the model's probability, when a model decided


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
                parts = _words(keyword)
                if parts:
                    kind = _PHRASE if len(parts) > 1 else _WORD
                    joined = b" ".join(parts)
                    joined = b" " + joined + b" " if kind == _PHRASE else joined
                    index.setdefault(parts[0], []).append((owner, kind, joined))
        for owner, words in verbs.items():
            for verb in words:
                for part in _words(verb)[:1]:
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


def _words(text: str) -> list[bytes]:
    return text.encode("utf-8", "surrogatepass").lower().translate(_WORD_TABLE).split()


def _task(rule: TaskRule | None) -> _Task | None:
    if rule is None:
        return None
    objects = frozenset(w for o in rule.objects for w in _words(o)[:1])
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
class CompiledClasses:
    """A ``ClassesPolicy`` with its words indexed and its patterns compiled."""

    long_min_tokens: int
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
    model: PromptModel | None = None
    model_rule: ModelRule | None = None
    before: tuple[_Override, ...] = ()
    after: tuple[_Override, ...] = ()
    head_chars: int = 4096
    tail_chars: int = 2048
    max_turns: int = 8
    max_prompts: int = 32

    @classmethod
    def build(cls, policy: ClassesPolicy, base: Path | None = None) -> CompiledClasses:
        """Compile ``policy``; a model's weights path is read relative to ``base`` (the policy
        file's folder), else to the repository. ``PolicyError`` when the weights are unusable."""
        code, math = policy.code, policy.math
        overrides = tuple(_Override.build(o) for o in policy.overrides)
        read = policy.window
        return cls(
            long_min_tokens=policy.long.min_tokens,
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
            model=_load_model(policy.model, base) if policy.model else None,
            model_rule=policy.model,
            before=tuple(o for o in overrides if o.stage == "before"),
            after=tuple(o for o in overrides if o.stage == "after"),
            head_chars=read.head_chars,
            tail_chars=read.tail_chars,
            max_turns=read.max_turns,
            max_prompts=read.max_prompts,
        )

    def window(self, text: str) -> str:
        return window(text, self.head_chars, self.tail_chars)


_REPOSITORY = Path(__file__).resolve().parents[2]


def model_path(weights: str, base: Path | None) -> Path:
    """Where a policy's ``model.weights`` is: absolute, or next to the policy file (``base``),
    or in the repository (the shipped weights, for a policy copied elsewhere)."""
    path = Path(weights)
    if path.is_absolute():
        return path
    for folder in (base, _REPOSITORY / "policies"):
        if folder is not None and (folder / path).is_file():
            return folder / path
    return (base or _REPOSITORY / "policies") / path


def _load_model(rule: ModelRule, base: Path | None) -> PromptModel:
    try:
        return PromptModel.load(model_path(rule.weights, base))
    except ModelError as exc:
        raise PolicyError(f"classes.model.weights: {exc}") from None


@dataclass(frozen=True, slots=True)
class _Override:
    """An operator rule forcing a class (``classes.overrides``), compiled."""

    name: str
    cls: str
    stage: str
    matcher: Matcher | None
    words: frozenset[bytes]
    phrases: tuple[bytes, ...]

    @classmethod
    def build(cls, rule: Override) -> _Override:
        matcher = Matcher.build(rule.name, rule.regex, 1.0) if rule.regex else None
        parts = [_words(k) for k in rule.keywords]
        words = frozenset(p[0] for p in parts if len(p) == 1)
        phrases = tuple(b" " + b" ".join(p) + b" " for p in parts if len(p) > 1)
        return cls(rule.name, rule.cls, rule.stage, matcher, words, phrases)

    def matches(self, text: str) -> bool:
        if self.matcher is not None:
            return self.matcher.search(Scan.of(text))
        spaced = text.encode("utf-8", "surrogatepass").lower().translate(_WORD_TABLE)
        if self.words and not self.words.isdisjoint(spaced.split()):
            return True
        padded = b" " + b" ".join(spaced.split()) + b" " if self.phrases else b""
        return any(phrase in padded for phrase in self.phrases)


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


def classify(
    request_text: str, token_count: int, policy: ClassesPolicy | CompiledClasses
) -> Classification:
    """Classify a prompt (``request_text``) of ``token_count`` tokens under ``policy``."""
    rules = policy if isinstance(policy, CompiledClasses) else CompiledClasses.build(policy)
    if token_count >= rules.long_min_tokens:
        return Classification(LONG, f"long: {token_count} prompt tokens >= {rules.long_min_tokens}")
    raw = request_text.encode("utf-8", "surrogatepass")
    spaced = raw.lower().translate(_WORD_TABLE)
    words = spaced.split()
    keywords, verbs = rules.words.found(words, b" " + spaced + b" ")
    # Patterns see the text between two newlines, so "\n" anchors the first and last lines too.
    scan = Scan.of(request_text, raw)

    code, math = _Score(), _Score()
    if rules.code.fence_weight and rules.fence.search(scan):
        code.add(rules.code.fence_weight, rules.fence.name)
    code.add_keywords(keywords.get(CODE, []), rules.code.keyword_weight)
    code.add_task(rules.code_task, verbs.get(CODE, []), words)
    math.add_keywords(keywords.get(MATH, []), rules.math.keyword_weight)
    math.add_task(rules.math_task, verbs.get(MATH, []), words)
    if rules.math.number_weight and any(digit in scan.marks for digit in DIGITS):
        numbers, count = _count_numbers(raw), max(len(words), 1)
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


def _decided(code: _Score, math: _Score, rules: CompiledClasses) -> bool:
    """Whether the patterns not run yet (worth ``left``) can no longer change the class."""
    code_max, math_max = code.total + code.left, math.total + math.left
    if code.total >= rules.code.threshold and code.total >= math_max:
        return True  # code wins, whatever math still finds (a tie goes to code)
    if math.total >= rules.math.threshold and math.total > code_max:
        return True
    return code_max < rules.code.threshold and math_max < rules.math.threshold


def _verdict(code: _Score, math: _Score, rules: CompiledClasses) -> Classification:
    code_hit = code.total >= rules.code.threshold
    math_hit = math.total >= rules.math.threshold
    if code_hit and (not math_hit or code.total >= math.total):
        reason = f"code {code.total:g} >= {rules.code.threshold:g}: {code.describe()}"
        if math_hit:
            reason += f" (math {math.total:g})"
        return Classification(CODE, _ascii(reason), code.total, math.total)
    if math_hit:
        reason = f"math {math.total:g} >= {rules.math.threshold:g}: {math.describe()}"
        if code_hit:
            reason += f" (code {code.total:g})"
        return Classification(MATH, _ascii(reason), code.total, math.total)
    reason = (
        f"tolerant: code {code.total:g} < {rules.code.threshold:g}{_brief(code)}, "
        f"math {math.total:g} < {rules.math.threshold:g}{_brief(math)}"
    )
    return Classification(TOLERANT, _ascii(reason), code.total, math.total)


def count_numbers(text: str) -> int:
    """Numbers in ``text``: runs of ASCII digits ("." and "," inside a number do not split it)."""
    return _count_numbers(text.encode("utf-8", "surrogatepass"))


def _count_numbers(data: bytes) -> int:
    return len(data.translate(_DIGIT_TABLE, b".,").split())


def _brief(score: _Score) -> str:
    return f" ({score.describe()})" if score.signals else ""


def _ascii(text: str) -> str:
    return text.encode("ascii", "backslashreplace").decode("ascii")


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Parts:
    """What the classifier reads of a request (``request_parts``)."""

    system: tuple[str, ...] = ()  # chat: system and developer messages
    turns: tuple[str, ...] = ()  # chat: user messages, oldest first
    prompts: Sequence[object] = ()  # completions: the prompt, or the list (non-strings skipped)
    chat: bool = False


def request_parts(body: Mapping[str, Any], max_turns: int | None = None) -> Parts:
    """The texts of a chat (system and user messages; assistant and tool messages are the
    model's own words and do not count) or of a completions request (each prompt string).
    With ``max_turns``, a chat is read from its end up to that many user messages (and its
    leading system messages, as many), so a long conversation costs no more than a short one."""
    messages = body.get("messages")
    if isinstance(messages, list):
        limit = len(messages) if max_turns is None else max_turns
        system: list[str] = []
        for message in messages[:limit]:
            if not isinstance(message, Mapping) or message.get("role") not in _SYSTEM:
                break
            text = "\n\n".join(content_texts(message.get("content")))
            if text:
                system.append(text)
        turns: list[str] = []
        for message in reversed(messages):
            if len(turns) >= limit:
                break
            if isinstance(message, Mapping) and message.get("role") == "user":
                text = "\n\n".join(content_texts(message.get("content")))
                if text:
                    turns.append(text)
        return Parts(tuple(system), tuple(reversed(turns)), (), chat=True)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return Parts(prompts=(prompt,))
    if isinstance(prompt, list):
        return Parts(prompts=prompt)  # read within bounds by _read (a list may be huge)
    return Parts()


_SYSTEM = ("system", "developer")


def classify_request(
    body: Mapping[str, Any], token_count: int, rules: CompiledClasses
) -> Classification:
    """The class of a chat or completions request of ``token_count`` prompt tokens (the
    longest prompt's, for a list): ``long`` by tokens, then the policy's overrides and model,
    or its keyword rules. What is read is bounded whatever the request's size: the last
    ``max_turns`` user messages, the first ``max_prompts`` prompts one by one (the rest joined),
    and of each text its window."""
    if token_count >= rules.long_min_tokens:
        return Classification(LONG, f"long: {token_count} prompt tokens >= {rules.long_min_tokens}")
    parts = request_parts(body, rules.max_turns)
    texts = _read(parts, rules)
    windows = [rules.window(t) for t in texts]
    count = len(parts.prompts)
    for override in rules.before:
        if any(override.matches(w) for w in windows):
            return Classification(override.cls, f"{override.cls}: override {override.name}")
    if rules.model is not None and rules.model_rule is not None:
        found = _by_model(parts, texts, count, rules.model, rules.model_rule, rules)
    else:
        found = _by_rules(parts, windows, rules)
    for override in rules.after:
        if any(override.matches(w) for w in windows):
            reason = _ascii(f"{override.cls}: override {override.name} (after {found.reason})")
            return Classification(override.cls, reason, p_precise=found.p_precise)
    return found


def _read(parts: Parts, rules: CompiledClasses) -> list[str]:
    """The texts read (not yet windowed): system messages and the last user turns of a chat,
    or the prompts of a list: the first ``max_prompts - 1`` distinct ones on their own, the rest
    as one text, of which only what its window can show is gathered (the work stays bounded
    for a list of any length)."""
    if parts.chat:
        return [*parts.system, *parts.turns[-rules.max_turns :]]
    most = rules.max_prompts
    first: list[str] = []
    seen: set[str] = set()
    index = 0
    for index, prompt in enumerate(parts.prompts):
        if len(first) == most - 1 or index >= 4 * most:  # duplicates count toward the bound
            break
        if isinstance(prompt, str) and prompt not in seen:
            seen.add(prompt)
            first.append(prompt)
    else:
        return first
    rest = _gather(parts.prompts, index, rules.head_chars, rules.tail_chars)
    return [*first, rest] if rest else first


def _gather(items: Sequence[object], start: int, head: int, tail: int) -> str:
    """``items[start:]`` (strings only) joined by blank lines, cut to what a window of ``head``
    + ``tail`` characters reads: a bounded number of items from each end."""
    front: list[str] = []
    size, i = 0, start
    while i < len(items) and size < head:
        item = items[i]
        if isinstance(item, str):
            front.append(item)
            size += len(item) + 2
        i += 1
    back: list[str] = []
    size, j = 0, len(items) - 1
    while j >= i and size < tail:
        item = items[j]
        if isinstance(item, str):
            back.append(item)
            size += len(item) + 2
        j -= 1
    gap = ["..."] if j >= i else []
    return "\n\n".join([*front, *gap, *reversed(back)])


def _by_rules(parts: Parts, windows: list[str], rules: CompiledClasses) -> Classification:
    """The keyword rules: a chat's texts as one, each prompt of a list on its own (the most
    demanding wins: precise over tolerant, then the higher score)."""
    if parts.chat or len(windows) <= 1:
        return classify("\n\n".join(windows), 0, rules)
    found = [classify(w, 0, rules) for w in windows]
    best = max(
        range(len(found)),
        key=lambda i: (found[i].cls != TOLERANT, max(found[i].code_score, found[i].math_score)),
    )
    choice = found[best]
    reason = f"{choice.reason} (prompt {best + 1} of {len(found)} decides)"
    return Classification(choice.cls, reason, choice.code_score, choice.math_score)


def _by_model(
    parts: Parts,
    texts: list[str],
    count: int,
    model: PromptModel,
    rule: ModelRule,
    rules: CompiledClasses,
) -> Classification:
    """P(precise) from the model (see the module docstring: conversations, lists)."""
    note = ""
    if parts.chat:
        turns = parts.turns[-rules.max_turns :]
        scores = [model.score(t) for t in turns]
        weighted = [(s, rule.history_decay ** (len(scores) - 1 - i)) for i, s in enumerate(scores)]
        if parts.system and rule.system_weight > 0:
            weighted.append((model.score("\n\n".join(parts.system)), rule.system_weight))
        if not weighted:
            return Classification(TOLERANT, "tolerant: no text to classify", p_precise=0.0)
        context = combine((s.precise, w) for s, w in weighted)
        last = scores[-1] if scores else weighted[-1][0]
        if len(weighted) > 1 and context > last.precise:
            # The conversation raises the last turn (context never lowers it).
            logit, code = context, combine((s.code, w) for s, w in weighted)
            decisive = max((s for s, _ in weighted), key=lambda s: s.precise)
            note = (
                f"; conversation ({len(scores)} user turns{', system' * bool(parts.system)}): "
                f"last turn {last.p_precise:.3f}, with context {sigmoid(context):.3f}"
            )
        else:
            logit, decisive = last.precise, last
            code = None
    else:
        if not texts:
            return Classification(TOLERANT, "tolerant: no text to classify", p_precise=0.0)
        scores = [model.score(t) for t in texts]
        best = max(range(len(scores)), key=lambda i: scores[i].precise)
        decisive, logit, code = scores[best], scores[best].precise, None
        if len(scores) > 1:
            note = f"; {count} prompts, #{best + 1} decides"
    return _model_verdict(logit, code, decisive, model, rule, note)


def _model_verdict(
    logit: float,
    code: float | None,
    decisive: TextScore,
    model: PromptModel,
    rule: ModelRule,
    note: str,
) -> Classification:
    p = sigmoid(logit)
    precise = p >= rule.threshold
    top = " ".join(decisive.top(precise, rule.top_features))
    why = f" ({model.label}: {top})" if top else f" ({model.label})"
    if not precise:
        reason = f"tolerant: p(precise) {p:.3f} < {rule.threshold:g}{why}{note}"
        return Classification(TOLERANT, _ascii(reason), p_precise=p)
    code_logit = decisive.code if code is None else code
    cls = CODE if code_logit >= 0 else MATH
    reason = (
        f"{cls}: p(precise) {p:.3f} >= {rule.threshold:g}{why}; "
        f"p(code) {sigmoid(code_logit):.2f}{note}"
    )
    return Classification(cls, _ascii(reason), p_precise=p)


# --------------------------------------------------------------------------- request text


def request_text(body: Mapping[str, Any]) -> str:
    """The text to classify: chat ``messages`` contents or the completions ``prompt``.

    Chat: every message's ``content`` (a string, or a list of parts whose ``text`` parts count),
    joined by blank lines. Completions: the prompt string, or a list of strings joined by blank
    lines; token-id prompts have no text and give ``""``.
    """
    messages = body.get("messages")
    if isinstance(messages, list):
        return "\n\n".join(
            text
            for message in messages
            if isinstance(message, Mapping)
            for text in content_texts(message.get("content"))
        )
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n\n".join(p for p in prompt if isinstance(p, str))
    return ""


def content_texts(content: object) -> list[str]:
    """The text pieces of one message's ``content`` (a string or OpenAI content parts)."""
    if isinstance(content, str):
        return [content] if content else []
    texts: list[str] = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, str) and part:
                texts.append(part)
            elif isinstance(part, Mapping) and part.get("type", "text") == "text":
                text = part.get("text")
                if isinstance(text, str) and text:
                    texts.append(text)
    return texts
