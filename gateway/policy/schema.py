"""The routing policy (``policies/routing.yaml``): schema, loading and one-line errors.

Schema in code (pydantic v2, unknown fields rejected everywhere), data in the YAML. Every problem
is a ``PolicyError`` whose text is one line, ``<file>:<line>: <dotted.field>: <message>``
(common/operator_yaml.py reads, parses and validates, as for the deployment spec and the recipe).

Sections:
- ``tiers``: the tier names this policy may route to (e.g. fp16, int8, int4). Every tier named
  elsewhere must be one of them, so a typo in a route is an error, not a silently dead route.
  Given ``known_tiers`` (the gateway's), ``parse_policy`` also refuses a tier not among them.
- ``classes`` (schema in gateway/policy/classes.py): the classifier
  (gateway/request/classify/classes.py): ``long`` by prompt tokens; then the
  trained model (``model``: its weights file and the threshold on P(precise)) with operator
  ``overrides``, or the keyword rules (``code`` and ``math`` by weighted signals against a
  threshold); ``tolerant`` is everything else. Every regular expression must pass the
  linear-time rule of gateway/policy/linear.py.
- ``routes``: per class, the tiers to try: an ordered chain, or ``most_free_kv`` over a list.
- ``saturation``: when a tier counts as saturated (skipped) from its scraped metrics.
- ``limits``: prompt and completion token limits and what to do when a request exceeds them;
  bounds on the fields that multiply a request's cost (n, best_of, list prompts, logprobs,
  prompt logprobs, tools; gateway/request/tokens/costs.py).
- ``fields`` (schema in gateway/policy/fields.py): which vLLM extension fields a client may
  send (the others are refused or dropped: gateway/request/completions/fields.py) and the prefix
  cache's salt per API key.
- ``pinning``: whether a request header may pin a tier.
- ``failover``: whether a whole (non-streamed) answer whose tier fails midway is continued on
  the next tier from where it stopped (asked as a stream and assembled,
  gateway/request/stream/assemble.py) or generated again.
- ``errors``: how much a client is told: ``minimal`` (no tier names, addresses or failures in
  error messages, no ``x-route-reason``) or ``full`` (gateway/errors.py).
- ``resets``: when the gateway may drain a tier and reset its KV pool (time-of-day windows, a
  quiet-traffic condition, the least interval between two resets, drift triggers); the
  decision itself is gateway/control/reset_schedule.py. Window and quiet requirements are checked
  only when ``enabled`` (an operator's forced reset needs neither).
- ``shadow``: the share of answers from cheaper tiers compared off the response path with the
  reference tier's (gateway/control/shadow.py); its tiers are checked only when ``fraction`` > 0.
- ``escalation`` (gateway/policy/escalation.py): which tiers' streamed answers are watched for
  loops and script garbage, and continued on the next tier when one degenerates.
"""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, field_validator, model_validator

# CLASS_NAMES is also imported from here by gateway/policy/derive.py (changed in parallel; it
# should import it from common/class_categories.py, and this explicit export then goes).
from common.class_categories import CLASS_NAMES as CLASS_NAMES
from common.operator_yaml import (
    OperatorYamlError,
    Section,
    compose_yaml,
    located,
    read_text,
    validate,
)
from gateway.policy.classes import ClassesPolicy, NonNegativeFloat, PositiveFloat, PositiveInt
from gateway.policy.classes import check_name as _check_name
from gateway.policy.escalation import EscalationPolicy, escalation_problems
from gateway.policy.fields import FieldsPolicy
from gateway.policy.live import LiveRoutesPolicy

Strategy = Literal["ordered", "most_free_kv"]
ResetWhen = Literal["window_and_quiet", "window_or_quiet", "window", "quiet"]
Loc = tuple[str | int, ...]
_HHMM = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")


class PolicyError(OperatorYamlError):
    """A routing policy that cannot be used; ``str()`` is one line naming file, line and field."""


# --------------------------------------------------------------------------- routes


# How much cheaper a less accurate tier must be to go before a more accurate one, by default:
# 10 %: on the shared 2-core AVX2 machine (2026-12-03) fp16 and int4 served from its
# dequantized copy, the same arithmetic, measured 9.8 % apart in one of six calibrations
# (0.5-6 % in the others).
MIN_GAIN = 0.10
# How sure that gain must be, when the calibration kept its per-prompt samples: the lower bound
# of a paired bootstrap interval at this level clears min_gain (gateway/policy/confidence.py).
# 95 %: the usual level; at 8 samples a percentile interval is already a little narrow.
CONFIDENCE = 0.95


class DeriveGoal(Section):
    """What a class needs, for a chain derived from measurements (gateway/policy/derive.py):
    the lowest agreement with the reference tier a tier may have, and the cost to minimise."""

    floor: float = Field(ge=0, le=1)
    minimise: Literal["latency", "throughput"] = "latency"
    answer_tokens: PositiveInt = 128  # the answer length a latency cost assumes
    min_gain: float = Field(default=MIN_GAIN, ge=0, lt=1)
    overflow: bool = True  # dominated tiers after the reference, for overload only
    confidence: float = Field(default=CONFIDENCE, ge=0.5, lt=1)  # the gain interval's level


class Route(Section):
    """Tiers for one class. A bare list in the YAML means ``strategy: ordered``. With
    ``derive``, the gateway orders (and filters) ``tiers`` from the tiers' measured quality and
    speed when it has them; without measurements the route is used as written."""

    strategy: Strategy = "ordered"
    tiers: list[str] = Field(min_length=1)
    derive: DeriveGoal | None = None

    @model_validator(mode="before")
    @classmethod
    def _bare_list(cls, value: object) -> object:
        return {"tiers": value} if isinstance(value, list) else value

    @field_validator("tiers")
    @classmethod
    def _unique(cls, tiers: list[str]) -> list[str]:
        for i, name in enumerate(tiers):
            if name in tiers[:i]:
                raise ValueError(f"tier {name} is listed twice")
        return tiers


class RoutesPolicy(Section):
    tolerant: Route
    code: Route
    math: Route
    long: Route

    def for_class(self, cls: str) -> Route | None:
        """The route of class ``cls`` (``None`` for a name that is not a class)."""
        return getattr(self, cls, None) if cls in CLASS_NAMES else None


# --------------------------------------------------------------------------- the rest


class SaturationPolicy(Section):
    """A tier is saturated (skipped) when a scraped value is ABOVE its threshold."""

    max_requests_waiting: NonNegativeFloat = 4.0
    max_kv_usage: float = Field(default=0.9, ge=0, le=1)


class LimitsPolicy(Section):
    """Token limits; see policies/routing.yaml for the meaning of each field."""

    max_input_tokens: PositiveInt | None = None
    on_input_too_long: Literal["reject", "route_long"] = "reject"
    tier_max_input_tokens: dict[str, PositiveInt] = Field(default_factory=dict)
    max_output_tokens: PositiveInt | None = None
    default_max_tokens: PositiveInt | None = None  # sent when the client gives none
    on_max_tokens_too_large: Literal["clamp", "reject"] = "clamp"
    # Fields that multiply a request's cost (gateway/request/tokens/costs.py).
    max_n: PositiveInt = 4
    max_best_of: PositiveInt = 4
    max_prompts: PositiveInt = 4
    max_logprobs: Annotated[int, Field(strict=True, ge=0)] = 20
    max_prompt_logprobs: Annotated[int, Field(strict=True, ge=0)] = 0
    max_tools: Annotated[int, Field(strict=True, ge=0)] = 128

    def tier_input_cap(self, tier: str | None) -> int | None:
        """The per-tier prompt cap of ``tier`` (``None``: none set)."""
        return self.tier_max_input_tokens.get(tier) if tier is not None else None


class TimeoutsPolicy(Section):
    """How long a tier may take before the chain moves on (see policies/routing.yaml)."""

    first_byte_seconds: PositiveFloat = 120.0  # streamed requests (whole ones asked as streams)


class FailoverPolicy(Section):
    """How an answer whose tier fails midway goes on (see policies/routing.yaml)."""

    whole_answers: Literal["continue", "regenerate"] = "regenerate"

    @property
    def assembles(self) -> bool:
        """Whether whole answers are asked as streams and assembled (request/assemble.py)."""
        return self.whole_answers == "continue"


class ErrorsPolicy(Section):
    """How much a client is told about the gateway's insides (see policies/routing.yaml)."""

    detail: Literal["minimal", "full"] = "minimal"


class PinningPolicy(Section):
    """Whether a request may choose its tier with a header (an operator's tool)."""

    allow: bool = False
    header: str = "x-route-tier"

    @field_validator("header")
    @classmethod
    def _header(cls, value: str) -> str:
        return _check_name(value, "header").lower()


# --------------------------------------------------------------------------- resets


class ResetWindow(Section):
    """A time-of-day window, ``start`` inclusive to ``end`` exclusive, on the wall clock of
    ``timezone`` (an IANA name). ``end`` before ``start`` crosses midnight (23:00-02:00)."""

    start: str
    end: str
    timezone: str = "UTC"

    @field_validator("start", "end", mode="before")
    @classmethod
    def _hhmm(cls, value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 24 * 60:
            # YAML 1.1 reads an unquoted 23:00 as the base-60 number 1380
            shown = f"{value // 60:02d}:{value % 60:02d}"
            raise ValueError(f'write "{shown}" in quotes (unquoted, YAML reads it as {value})')
        if not isinstance(value, str) or not _HHMM.fullmatch(value):
            raise ValueError(f'{value!r} is not a time of day "HH:MM" (00:00 to 23:59)')
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
            raise ValueError(
                f"unknown time zone {value!r} (an IANA name such as UTC or Europe/Paris)"
            ) from None
        return value

    @model_validator(mode="after")
    def _not_empty(self) -> ResetWindow:
        if self.start == self.end:
            raise ValueError(f"start and end are both {self.start}: the window is empty")
        return self

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.timezone)  # zoneinfo caches one instance per name

    @property
    def start_minute(self) -> int:
        return _minute_of_day(self.start)

    @property
    def end_minute(self) -> int:
        return _minute_of_day(self.end)

    def describe(self) -> str:
        return f"{self.start}-{self.end} {self.timezone}"


def _minute_of_day(hhmm: str) -> int:
    hours, minutes = hhmm.split(":")
    return int(hours) * 60 + int(minutes)


class QuietCondition(Section):
    """Traffic across all replicas below ``max_rps`` requests/s for at least ``for_seconds``."""

    max_rps: PositiveFloat = 0.5
    for_seconds: PositiveFloat = 120.0


class ResetTriggers(Section):
    """Drift that makes a tier due before ``min_interval_seconds`` (``None``: trigger off)."""

    preemptions_growth: PositiveFloat | None = None  # vllm:num_preemptions_total growth
    ttft_p90_factor: float | None = Field(default=None, gt=1)  # TTFT p90 > factor x baseline


class ResetsPolicy(Section):
    """KV-pool resets in low-traffic windows; see policies/routing.yaml for each field."""

    enabled: bool = False
    windows: list[ResetWindow] = Field(default_factory=list)
    quiet: QuietCondition | None = None
    when: ResetWhen = "window_and_quiet"
    min_interval_seconds: PositiveFloat = 21600.0
    drain_timeout_seconds: PositiveFloat = 60.0
    triggers: ResetTriggers = Field(default_factory=ResetTriggers)
    lock_ttl_seconds: PositiveFloat = 30.0

    @property
    def needs_window(self) -> bool:
        return self.when != "quiet"

    @property
    def needs_quiet(self) -> bool:
        return self.when != "window"


# --------------------------------------------------------------------------- shadow


class GuardPolicy(Section):
    """The live guard over shadow comparisons (gateway/control/live_guard.py)."""

    window: PositiveInt = 50  # comparisons per (tier, class) kept
    min_samples: PositiveInt = 20  # fewer in the window: no verdict
    floors: dict[str, float] = Field(default_factory=dict)  # class -> mean agreement floor

    @field_validator("floors")
    @classmethod
    def _classes(cls, floors: dict[str, float]) -> dict[str, float]:
        for name, floor in floors.items():
            if name not in CLASS_NAMES:
                raise ValueError(f"unknown class {name} (classes: {', '.join(CLASS_NAMES)})")
            if not 0 <= floor <= 1:
                raise ValueError(f"floor of {name} must be within 0..1, not {floor}")
        return floors


class ShadowPolicy(Section):
    """Shadow sampling; see policies/routing.yaml for each field."""

    fraction: float = Field(default=0.0, ge=0, le=1)
    tiers: list[str] = Field(default_factory=lambda: ["int4", "int8"])
    reference: str = "fp16"
    max_concurrent: PositiveInt = 2
    max_gateway_load: float = Field(default=0.5, gt=0, le=1)
    deviation_threshold: float = Field(default=0.9, ge=0, le=1)
    max_tokens: PositiveInt = 64
    timeout_seconds: PositiveFloat = 60.0
    guard: GuardPolicy = Field(default_factory=GuardPolicy)


class RoutingPolicy(Section):
    """The whole file."""

    tiers: list[str] = Field(min_length=1)
    classes: ClassesPolicy = Field(default_factory=ClassesPolicy)
    routes: RoutesPolicy
    saturation: SaturationPolicy = Field(default_factory=SaturationPolicy)
    limits: LimitsPolicy = Field(default_factory=LimitsPolicy)
    pinning: PinningPolicy = Field(default_factory=PinningPolicy)
    timeouts: TimeoutsPolicy = Field(default_factory=TimeoutsPolicy)
    failover: FailoverPolicy = Field(default_factory=FailoverPolicy)
    errors: ErrorsPolicy = Field(default_factory=ErrorsPolicy)
    fields: FieldsPolicy = Field(default_factory=FieldsPolicy)
    resets: ResetsPolicy = Field(default_factory=ResetsPolicy)
    shadow: ShadowPolicy = Field(default_factory=ShadowPolicy)
    escalation: EscalationPolicy = Field(default_factory=EscalationPolicy)
    live_routes: LiveRoutesPolicy = Field(default_factory=LiveRoutesPolicy)

    @field_validator("tiers")
    @classmethod
    def _tier_names(cls, tiers: list[str]) -> list[str]:
        for i, name in enumerate(tiers):
            _check_name(name, "tier name")
            if name in tiers[:i]:
                raise ValueError(f"tier {name} is listed twice")
        return tiers


# --------------------------------------------------------------------------- loading


def load_policy(path: str | Path) -> RoutingPolicy:
    """Read and validate a policy file; ``PolicyError`` (one line) on any problem."""
    path = Path(path)
    return parse_policy(read_text(path, "routing policy", PolicyError), str(path))


def parse_policy(
    text: str, source: str = "<policy>", known_tiers: Sequence[str] | None = None
) -> RoutingPolicy:
    """Validate policy YAML ``text``; ``source`` is the file named in errors.

    ``known_tiers``: the tiers that exist (the gateway's, or a deployment spec's); every name in
    ``tiers`` must be one of them. ``None`` skips that check (the policy alone is validated).
    """
    root, data = compose_yaml(text, source, PolicyError)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(f"{source}:1: (top level): must be a mapping of sections")
    policy = validate(
        RoutingPolicy, data, root, source, PolicyError, yaml_loc=lambda loc: _yaml_loc(data, loc)
    )
    for loc, message in _problems(policy):
        raise _error(root, data, source, loc, message)
    for loc, message in _unknown_tiers(policy, known_tiers):
        raise _error(root, data, source, loc, message)
    return policy


def _problems(policy: RoutingPolicy) -> Iterator[tuple[Loc, str]]:
    """Checks across sections: every tier named must be declared in ``tiers``."""
    known = set(policy.tiers)
    declared = ", ".join(policy.tiers)
    for cls in CLASS_NAMES:
        route = getattr(policy.routes, cls)
        for i, name in enumerate(route.tiers):
            if name not in known:
                yield ("routes", cls, "tiers", i), f"unknown tier {name} (tiers: {declared})"
    for name in policy.limits.tier_max_input_tokens:
        if name not in known:
            loc: Loc = ("limits", "tier_max_input_tokens", name)
            yield loc, f"unknown tier {name} (tiers: {declared})"
    yield from _reset_problems(policy.resets)
    yield from _shadow_problems(policy.shadow, policy.tiers)
    yield from escalation_problems(policy.escalation, policy.tiers)


def _shadow_problems(shadow: ShadowPolicy, tiers: Sequence[str]) -> Iterator[tuple[Loc, str]]:
    """A sampling ``shadow`` compares declared tiers with another declared tier."""
    if shadow.fraction <= 0:
        return
    declared = ", ".join(tiers)
    for i, name in enumerate(shadow.tiers):
        if name not in tiers:
            yield ("shadow", "tiers", i), f"unknown tier {name} (tiers: {declared})"
        elif name == shadow.reference:
            yield ("shadow", "tiers", i), f"{name} is the reference tier"
    if shadow.reference not in tiers:
        yield ("shadow", "reference"), f"unknown tier {shadow.reference} (tiers: {declared})"


def _reset_problems(resets: ResetsPolicy) -> Iterator[tuple[Loc, str]]:
    """An enabled ``resets`` must have what its ``when`` needs (disabled: not checked)."""
    if not resets.enabled:
        return
    if resets.needs_window and not resets.windows:
        yield ("resets", "windows"), f"give at least one window (when: {resets.when})"
    if resets.needs_quiet and resets.quiet is None:
        yield ("resets", "quiet"), f"required by when: {resets.when}"


def _unknown_tiers(policy: RoutingPolicy, known: Sequence[str] | None) -> Iterator[tuple[Loc, str]]:
    """Tiers the policy declares that do not exist (``known`` is ``None``: not checked)."""
    if known is None:
        return
    have = ", ".join(known) or "no tiers"
    for i, name in enumerate(policy.tiers):
        if name not in known:
            yield ("tiers", i), f"unknown tier {name} (the gateway has {have})"


def _yaml_loc(data: Mapping[str, Any], loc: Loc) -> Loc:
    """``routes.X.tiers[i]`` is ``routes.X[i]`` in the file when the route is a bare list."""
    if len(loc) >= 3 and loc[0] == "routes" and loc[2] == "tiers":
        routes = data.get("routes")
        if isinstance(routes, dict) and isinstance(routes.get(loc[1]), list):
            return (*loc[:2], *loc[3:])
    return loc


def _error(
    root: yaml.Node | None, data: Mapping[str, Any], source: str, loc: Loc, message: str
) -> PolicyError:
    return located(PolicyError, source, root, _yaml_loc(data, loc), message)
