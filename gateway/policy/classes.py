"""The routing policy's ``classes`` section: how the gateway classifies a request
(gateway/request/classify/classes.py), schema only. Part of the policy schema
(gateway/policy/schema.py holds the rest); here so that each module stays one sitting's read.

Every regular expression (keyword-rule patterns, overrides) must compile and pass the
linear-time rule of gateway/policy/linear.py.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from common.operator_yaml import Section
from gateway.policy.linear import superlinear

PositiveInt = Annotated[int, Field(strict=True, gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_name(value: str, what: str) -> str:
    """``value`` when it is a name (letters, digits, ``_``, ``.``, ``-``); else ValueError."""
    if not _NAME.fullmatch(value):
        raise ValueError(f"{what} {value!r} must be letters, digits, '_', '.' or '-'")
    return value


# --------------------------------------------------------------------------- classes


class Pattern(Section):
    """A named regular expression; each pattern that matches adds its ``weight`` once.

    Python ``re`` syntax; flags inline, e.g. ``(?m)`` for ``^``/``$`` at line ends, ``(?i)`` to
    ignore case. The name appears in the classification reason.
    """

    name: str
    regex: str = Field(min_length=1)
    weight: PositiveFloat = 1.0

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "pattern name")

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str) -> str:
        return _linear_regex(value)


def _linear_regex(value: str) -> str:
    """A regular expression that compiles and passes the linear-time rule (policy/linear.py)."""
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"bad regular expression {value!r}: {exc}") from None
    problem = superlinear(value)
    if problem:
        raise ValueError(f"{value!r} may take more than linear time: {problem}")
    return value


def _keywords(value: list[str]) -> list[str]:
    out: list[str] = []
    for keyword in value:
        if not keyword.strip():
            raise ValueError("empty keyword")
        folded = " ".join(keyword.split()).lower()
        if folded in out:
            raise ValueError(f"keyword {keyword!r} is listed twice")
        out.append(folded)
    return out


def _one_word_keywords(value: list[str]) -> list[str]:
    words = _keywords(value)
    for word in words:
        if " " in word:
            raise ValueError(f"{word!r}: give single words here")
    return words


class TaskRule(Section):
    """A request for work: one of ``verbs`` followed within ``window`` words by one of
    ``objects`` ("write a Python function", "implement a binary search"). Adds ``weight`` once."""

    verbs: list[str] = Field(min_length=1)
    objects: list[str] = Field(min_length=1)
    window: PositiveInt = 4
    weight: PositiveFloat = 2.0

    @field_validator("verbs", "objects")
    @classmethod
    def _words(cls, value: list[str]) -> list[str]:
        return _one_word_keywords(value)


class LongRule(Section):
    """``long``: the prompt (chat template applied) has at least ``min_tokens`` tokens."""

    min_tokens: PositiveInt = 1024


class CodeRule(Section):
    """``code``: score = fence_weight if a fenced block (```/~~~) is present
    + keyword_weight per distinct keyword found + the task's weight when it is found
    + each matching pattern's weight once."""

    threshold: PositiveFloat = 2.0
    fence_weight: NonNegativeFloat = 3.0
    keywords: list[str] = Field(default_factory=list)
    keyword_weight: NonNegativeFloat = 1.0
    task: TaskRule | None = None
    patterns: list[Pattern] = Field(default_factory=list)

    @field_validator("keywords")
    @classmethod
    def _fold(cls, value: list[str]) -> list[str]:
        return _keywords(value)


class MathRule(Section):
    """``math``: score = keyword_weight per distinct keyword + the task's weight when found
    + each matching pattern's weight once + number_weight when the text has at least
    ``min_numbers`` numbers and at least ``number_density`` numbers per word."""

    threshold: PositiveFloat = 2.0
    keywords: list[str] = Field(default_factory=list)
    keyword_weight: NonNegativeFloat = 1.0
    task: TaskRule | None = None
    patterns: list[Pattern] = Field(default_factory=list)
    number_density: float = Field(default=0.1, gt=0, le=1)
    min_numbers: PositiveInt = 2
    number_weight: NonNegativeFloat = 1.0

    @field_validator("keywords")
    @classmethod
    def _fold(cls, value: list[str]) -> list[str]:
        return _keywords(value)


class SecondStageRule(Section):
    """The cascade (gateway/request/classify/second_stage.py): the first stage is sure below
    ``sure_tolerant`` (tolerant) and from ``sure_precise`` (precise); between them a second model
    decides (P(precise) at or above ``threshold`` is precise), off the event loop, at most
    ``max_pending`` prompts at a time and ``budget_ms`` each: past either, precise stands. A
    model that cannot be read leaves the first stage serving at ``model.threshold``."""

    weights: str = Field(min_length=1)  # relative to the policy's folder, like model.weights
    # band: gateway/request/classify/band_model.py (pure Python); encoder:
    # gateway/request/classify/encoder_model.py (a sentence encoder under ONNX Runtime,
    # requirements/encoder.txt)
    kind: Literal["band", "encoder"] = "band"
    threshold: float = Field(gt=0, lt=1)
    sure_tolerant: float = Field(gt=0, lt=1)
    sure_precise: float = Field(gt=0, lt=1)
    max_pending: int = Field(default=4, ge=1, le=64)
    budget_ms: float = Field(default=20.0, gt=0, le=1000)


class ModelRule(Section):
    """The trained prompt model (gateway/request/classify/prompt_model.py) decides precise vs
    tolerant: P(precise) at or above ``threshold`` is ``code`` or ``math`` (whichever the model's
    second regression prefers), below it ``tolerant``. Lower thresholds send more to the precise
    routes (sending a precise request to a low-precision tier costs more than the reverse)."""

    weights: str = Field(min_length=1)  # a weights file, relative to the policy's folder
    threshold: float = Field(gt=0, lt=1)
    history_decay: float = Field(default=0.5, gt=0, le=1)
    system_weight: NonNegativeFloat = 0.5
    top_features: int = Field(default=3, ge=0, le=10)
    second_stage: SecondStageRule | None = None
    # [low, high): a chat's last user turn whose own P(precise) lies here, after earlier user
    # turns, takes the class of the conversation before it (None: context only raises it).
    followup_band: tuple[float, float] | None = None

    @model_validator(mode="after")
    def _band(self) -> ModelRule:
        second = self.second_stage
        if second is not None and not second.sure_tolerant < second.sure_precise:
            raise ValueError("second_stage: sure_tolerant must be below sure_precise")
        band = self.followup_band
        if band is not None and not 0 <= band[0] < band[1] <= 1:
            raise ValueError("followup_band: needs 0 <= low < high <= 1")
        return self


class Override(Section):
    """An operator rule that forces a class: a regular expression or a keyword list, checked
    ``before`` the model (a match skips it) or ``after`` it (a match replaces its class)."""

    name: str
    cls: Literal["tolerant", "code", "math"] = Field(alias="class")
    stage: Literal["before", "after"] = "before"
    regex: str | None = None
    keywords: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "override name")

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        return None if value is None else _linear_regex(value)

    @field_validator("keywords")
    @classmethod
    def _fold(cls, value: list[str]) -> list[str]:
        return _keywords(value)

    @model_validator(mode="after")
    def _one_test(self) -> Override:
        if (self.regex is None) == (not self.keywords):
            raise ValueError("give either regex or keywords")
        return self


class WindowRule(Section):
    """What the classifier reads of a request: the last ``max_turns`` user messages of a chat
    (and its system messages), the first ``max_prompts`` prompts of a completions list one by
    one (the rest as one text); of each text, the rules and overrides read the first
    ``head_chars`` and last ``tail_chars`` characters (the model reads the window its weights
    file names)."""

    head_chars: PositiveInt = 4096
    tail_chars: int = Field(default=2048, ge=0)
    max_turns: PositiveInt = 8
    max_prompts: PositiveInt = 32


class ClassesPolicy(Section):
    """The classifier: ``long`` by tokens; then either the trained ``model`` (with operator
    ``overrides``) or the keyword rules ``code`` and ``math``. ``tolerant`` has no rule: it is
    what nothing else claims."""

    long: LongRule = Field(default_factory=LongRule)
    code: CodeRule = Field(default_factory=CodeRule)
    math: MathRule = Field(default_factory=MathRule)
    model: ModelRule | None = None
    overrides: list[Override] = Field(default_factory=list)
    window: WindowRule = Field(default_factory=WindowRule)

    @model_validator(mode="after")
    def _model_or_rules(self) -> ClassesPolicy:
        given = {"code", "math"} & self.model_fields_set
        if self.model is not None and given:
            raise ValueError(
                f"give either model or the keyword rules ({', '.join(sorted(given))}), not both"
            )
        names = [o.name for o in self.overrides]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise ValueError(f"override {name} is listed twice")
        return self
