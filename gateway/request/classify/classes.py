"""The request classifier: a request → ``tolerant`` | ``code`` | ``math`` | ``long``, with a reason.

Pure and deterministic. ``classify_request`` is the entry point (gateway/request/route/plan.py calls
it); the policy's ``classes`` section (gateway/policy/schema.py) decides, in this order:

1. ``long`` when the prompt has at least ``long.min_tokens`` tokens;
2. ``overrides`` with ``stage: before``: the first whose regex or keywords match forces its class;
3. the trained model (``classes.model``, gateway/request/classify/prompt_model.py): P(precise) at or
   above the threshold is ``code`` or ``math`` (its code-vs-math regression tells which), below it
   ``tolerant``; a chat's user turns are scored one by one and weighted toward the last, the
   system messages count too, and the context can raise the last turn's probability, never lower
   it; each prompt of a completions list is scored and the most precise decides;
   or, in a policy without a model, the keyword rules (``classify`` below);
4. ``overrides`` with ``stage: after``: a match replaces the class found.

What is read is bounded whatever the request's size (``classes.window``): the last
``max_turns`` user messages and the leading system messages of a chat, the first ``max_prompts``
prompts of a list (the rest as one text), and of each text a window of its first and last
characters. The reason is ASCII (anything else is escaped) so it can travel as a header:
``code: p(precise) 1.000 >= 0.12 (prompt-model v3: +that +write +program); p(code) 1.00``.

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
  literal pre-filter: gateway/request/classify/prefilter.py); every pattern is linear-time
  (gateway/policy/linear.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.class_categories import CODE, LONG, MATH, TOLERANT
from common.env_paths import ROOT
from common.prompt_features import window
from gateway.policy.classes import ClassesPolicy, ModelRule, Override
from gateway.policy.schema import PolicyError
from gateway.request.classify.classification import Classification, ascii_text
from gateway.request.classify.keyword_rules import WORD_TABLE, KeywordRules, classify_text, words_of
from gateway.request.classify.prefilter import Matcher, Scan
from gateway.request.classify.prompt_model import (
    ModelError,
    PromptModel,
    TextScore,
    combine,
    sigmoid,
)
from gateway.request.classify.second_stage import BandQuery, SecondStage, band_reason
from gateway.request.tokens.prompt_text import Parts, read_texts, request_parts

# --------------------------------------------------------------------------- compiled rules


@dataclass(frozen=True, slots=True)
class CompiledClasses:
    """A ``ClassesPolicy`` compiled: its keyword rules, its model loaded, its overrides."""

    long_min_tokens: int
    keywords: KeywordRules
    model: PromptModel | None = None
    model_rule: ModelRule | None = None
    before: tuple[_Override, ...] = ()
    after: tuple[_Override, ...] = ()
    head_chars: int = 4096
    tail_chars: int = 2048
    max_turns: int = 8
    max_prompts: int = 32
    second: SecondStage | None = None  # the cascade's second stage, when the policy names one

    @classmethod
    def build(cls, policy: ClassesPolicy, base: Path | None = None) -> CompiledClasses:
        """Compile ``policy``; a model's weights path is read relative to ``base`` (the policy
        file's folder), else to the repository. ``PolicyError`` when the weights are unusable."""
        overrides = tuple(_Override.build(o) for o in policy.overrides)
        read = policy.window
        return cls(
            long_min_tokens=policy.long.min_tokens,
            keywords=KeywordRules.build(policy),
            model=_load_model(policy.model, base) if policy.model else None,
            model_rule=policy.model,
            before=tuple(o for o in overrides if o.stage == "before"),
            after=tuple(o for o in overrides if o.stage == "after"),
            head_chars=read.head_chars,
            tail_chars=read.tail_chars,
            max_turns=read.max_turns,
            max_prompts=read.max_prompts,
            second=_load_second(policy.model, base) if policy.model else None,
        )

    def window(self, text: str) -> str:
        return window(text, self.head_chars, self.tail_chars)


_REPOSITORY = ROOT  # the repository (common/env_paths.py)


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


def _load_second(rule: ModelRule, base: Path | None) -> SecondStage | None:
    second = rule.second_stage
    return None if second is None else SecondStage.load(second, model_path(second.weights, base))


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
        parts = [words_of(k) for k in rule.keywords]
        words = frozenset(p[0] for p in parts if len(p) == 1)
        phrases = tuple(b" " + b" ".join(p) + b" " for p in parts if len(p) > 1)
        return cls(rule.name, rule.cls, rule.stage, matcher, words, phrases)

    def matches(self, text: str) -> bool:
        if self.matcher is not None:
            return self.matcher.search(Scan.of(text))
        spaced = text.encode("utf-8", "surrogatepass").lower().translate(WORD_TABLE)
        if self.words and not self.words.isdisjoint(spaced.split()):
            return True
        padded = b" " + b" ".join(spaced.split()) + b" " if self.phrases else b""
        return any(phrase in padded for phrase in self.phrases)


# --------------------------------------------------------------------------- requests


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
    texts = read_texts(
        parts, rules.max_turns, rules.max_prompts, rules.head_chars, rules.tail_chars
    )
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
            reason = ascii_text(f"{override.cls}: override {override.name} (after {found.reason})")
            return Classification(override.cls, reason, p_precise=found.p_precise)
    return found


def _by_rules(parts: Parts, windows: list[str], rules: CompiledClasses) -> Classification:
    """The keyword rules: a chat's texts as one, each prompt of a list on its own (the most
    demanding wins: precise over tolerant, then the higher score)."""
    if parts.chat or len(windows) <= 1:
        return classify_text("\n\n".join(windows), rules.keywords)
    found = [classify_text(w, rules.keywords) for w in windows]
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
        read = list(turns)
        if parts.system and rule.system_weight > 0:
            read.append("\n\n".join(parts.system))
            weighted.append((model.score(read[-1]), rule.system_weight))
        if not weighted:
            return Classification(TOLERANT, "tolerant: no text to classify", p_precise=0.0)
        context = combine((s.precise, w) for s, w in weighted)
        last = scores[-1] if scores else weighted[-1][0]
        band = rule.followup_band
        if band is not None and len(scores) > 1 and band[0] <= last.p_precise < band[1]:
            # An unsure follow-up ("make it funnier", "now faster") keeps the class its
            # conversation earned: the turns before it (and the system) decide, either way.
            earlier = weighted[: len(scores) - 1] + weighted[len(scores) :]
            logit, code = (
                combine((s.precise, w) for s, w in earlier),
                combine((s.code, w) for s, w in earlier),
            )
            most = max(range(len(earlier)), key=lambda i: earlier[i][0].precise)
            decisive, text = earlier[most][0], (read[: len(scores) - 1] + read[len(scores) :])[most]
            note = (
                f"; follow-up (last turn {last.p_precise:.3f}, unsure: "
                f"[{band[0]:g}, {band[1]:g})): the conversation before it {sigmoid(logit):.3f}"
            )
        elif len(weighted) > 1 and context > last.precise:
            # The conversation raises the last turn (context never lowers it).
            logit, code = context, combine((s.code, w) for s, w in weighted)
            most = max(range(len(weighted)), key=lambda i: weighted[i][0].precise)
            decisive, text = weighted[most][0], read[most]
            note = (
                f"; conversation ({len(scores)} user turns{', system' * bool(parts.system)}): "
                f"last turn {last.p_precise:.3f}, with context {sigmoid(context):.3f}"
            )
        else:
            logit, decisive, text = last.precise, last, read[len(scores) - 1 if scores else -1]
            code = None
    else:
        if not texts:
            return Classification(TOLERANT, "tolerant: no text to classify", p_precise=0.0)
        scores = [model.score(t) for t in texts]
        best = max(range(len(scores)), key=lambda i: scores[i].precise)
        decisive, logit, code, text = scores[best], scores[best].precise, None, texts[best]
        if len(scores) > 1:
            note = f"; {count} prompts, #{best + 1} decides"
    if rules.second is not None:
        return _cascade(logit, code, decisive, text, model, rules.second, rule, note)
    return _model_verdict(logit, code, decisive, model, rule, note)


def _cascade(
    logit: float,
    code: float | None,
    decisive: TextScore,
    text: str,
    model: PromptModel,
    second: SecondStage,
    rule: ModelRule,
    note: str,
) -> Classification:
    """The first stage of the cascade (gateway/request/classify/second_stage.py): sure of the
    prompt, it decides; in its band, its cautious answer (precise) comes with the query for the
    second."""
    p, band = sigmoid(logit), second.rule
    code_logit = decisive.code if code is None else code
    if second.in_band(p):
        why = _why(decisive, model, rule, True)
        first = band_reason(p, band, why)
        cls = CODE if code_logit >= 0 else MATH
        reason = ascii_text(f"{cls}: {first}; p(code) {sigmoid(code_logit):.2f}{note}")
        query = BandQuery(second, text, p, code_logit, ascii_text(first), ascii_text(note))
        return Classification(cls, reason, p_precise=p, band=query)
    precise = p >= band.sure_precise
    why = _why(decisive, model, rule, precise)
    if not precise:
        reason = f"tolerant: stage 1 p(precise) {p:.3f} < {band.sure_tolerant:g} sure{why}{note}"
        return Classification(TOLERANT, ascii_text(reason), p_precise=p)
    cls = CODE if code_logit >= 0 else MATH
    reason = (
        f"{cls}: stage 1 p(precise) {p:.3f} >= {band.sure_precise:g} sure{why}; "
        f"p(code) {sigmoid(code_logit):.2f}{note}"
    )
    return Classification(cls, ascii_text(reason), p_precise=p)


def _why(decisive: TextScore, model: PromptModel, rule: ModelRule, precise: bool) -> str:
    top = " ".join(decisive.top(precise, rule.top_features))
    return f" ({model.label}: {top})" if top else f" ({model.label})"


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
        return Classification(TOLERANT, ascii_text(reason), p_precise=p)
    code_logit = decisive.code if code is None else code
    cls = CODE if code_logit >= 0 else MATH
    reason = (
        f"{cls}: p(precise) {p:.3f} >= {rule.threshold:g}{why}; "
        f"p(code) {sigmoid(code_logit):.2f}{note}"
    )
    return Classification(cls, ascii_text(reason), p_precise=p)
