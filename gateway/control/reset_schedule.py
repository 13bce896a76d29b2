"""Which tier, if any, to reset now: a pure function of plain values (no I/O, no clock).

``choose_reset(now, policy, tiers, quiet_for, force=None)`` applies the policy's ``resets``
section (policies/routing.yaml) to the tiers' states; ``now`` is epoch seconds and ``quiet_for``
the seconds the cross-replica request rate has stayed below ``quiet.max_rps`` (the caller
tracks both). Rules, in order:

1. ``force`` (an operator's "reset now") names a tier: it is reset whatever ``enabled``, the
   windows, the traffic and the interval say, but never against the safety rules (3, 5, 6).
2. Nothing when ``resets.enabled`` is false, or when the ``when`` condition is not met
   (``conditions_met``: time-of-day windows, quiet traffic, or both or either).
3. One at a time: nothing while any tier is ``draining`` or ``resetting``.
4. A tier is due when ``min_interval_seconds`` have passed since its last reset (never reset:
   due), or when a trigger fires: ``vllm:num_preemptions_total`` grew by at least
   ``preemptions_growth`` since its last reset (a counter that went back, the tier having
   restarted, counts from 0), or its TTFT p90 is above ``ttft_p90_factor`` x its baseline.
5. Only ``ready`` tiers are reset.
6. A tier is kept when some class's route names it and no other tier the route names is ready
   (``last_ready_for_a_class``): resetting it would leave that class with nowhere to go.
7. Of the due tiers, the one reset longest ago (never reset first; ties: the policy's ``tiers``
   order) is chosen. Tiers the policy does not declare are ignored.

Every decision carries a reason: one ASCII line, what was chosen and why, or why nothing was.
Windows are on the wall clock of their time zone, start inclusive, end exclusive; a window
whose end is before its start crosses midnight.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from backends.tier_state import TierState
from gateway.policy.schema import (
    CLASS_NAMES,
    ResetsPolicy,
    ResetWindow,
    RoutesPolicy,
    RoutingPolicy,
)

BUSY = (TierState.DRAINING, TierState.RESETTING)


@dataclass(frozen=True)
class TierResetState:
    """What the decision needs to know about one tier."""

    name: str
    state: TierState
    last_reset_at: float | None  # epoch seconds of the last successful reset (None: never)
    preemptions: float  # vllm:num_preemptions_total now
    preemptions_at_last_reset: float
    ttft_p90_ms: float | None  # recent TTFT p90 (None: unknown)
    ttft_baseline_p90_ms: float | None
    classes: frozenset[str] | None = None  # classes the admission check let it serve (None: all)


@dataclass(frozen=True)
class ResetDecision:
    """The one tier to reset now (``None``: none), and why."""

    tier: str | None
    reason: str


class _HasState(Protocol):
    @property
    def state(self) -> TierState: ...


def window_open(now: float, windows: Sequence[ResetWindow]) -> bool:
    """True when ``now`` (epoch seconds) is inside one of ``windows``."""
    return any(_inside(now, window) for window in windows)


def _inside(now: float, window: ResetWindow) -> bool:
    local = datetime.fromtimestamp(now, window.zone)
    minute = local.hour * 60 + local.minute
    start, end = window.start_minute, window.end_minute
    return start <= minute < end if start < end else minute >= start or minute < end


def _window_text(now: float, windows: Sequence[ResetWindow], is_open: bool) -> str:
    """E.g. ``window closed (02:00-05:00 UTC, now 13:05)``."""
    shown = [f"{w.describe()}, now {datetime.fromtimestamp(now, w.zone):%H:%M}" for w in windows]
    head = ("windows" if len(windows) > 1 else "window") + (" open" if is_open else " closed")
    return f"{head} ({'; '.join(shown) or 'none configured'})"


def conditions_met(
    now: float, policy: ResetsPolicy, quiet_for: float, *, rps: float | None = None
) -> tuple[bool, str]:
    """Whether ``policy.when`` allows a reset now, and why (or why not), as one line.

    ``rps`` (optional) is the current cross-replica request rate, used only in the reason.
    """
    is_open = window_open(now, policy.windows)
    window = _window_text(now, policy.windows, is_open)
    quiet, traffic = _quiet(policy, quiet_for, rps)
    if policy.when == "window":
        return is_open, window
    if policy.when == "quiet":
        return quiet, traffic
    if policy.when == "window_and_quiet":
        failed = [text for ok, text in ((is_open, window), (quiet, traffic)) if not ok]
        return not failed, " and ".join(failed or [window, traffic])
    passed = [text for ok, text in ((is_open, window), (quiet, traffic)) if ok]
    return bool(passed), " and ".join(passed or [window, traffic])


def _quiet(policy: ResetsPolicy, quiet_for: float, rps: float | None) -> tuple[bool, str]:
    quiet = policy.quiet
    if quiet is None:
        return False, "no quiet condition configured"
    limit = f"{quiet.max_rps:g} rps"
    if quiet_for >= quiet.for_seconds:
        return True, f"traffic below {limit} for {_span(quiet_for)}"
    if quiet_for > 0:
        return False, f"traffic below {limit} for {_span(quiet_for)} < {_span(quiet.for_seconds)}"
    if rps is not None:
        return False, f"traffic {rps:.1f} rps >= {quiet.max_rps:g}"
    return False, f"traffic not below {limit}"


def last_ready_for_a_class(
    tier: str, states: Mapping[str, TierState | _HasState], routes: RoutesPolicy
) -> str | None:
    """The first class whose route names ``tier`` and no other tier that is ready, or ``None``.

    ``states`` maps tier names to a ``TierState`` or anything with a ``state`` (e.g. a
    ``TierStatus`` or a ``TierResetState``); a tier missing from it is not ready.
    """
    for cls in CLASS_NAMES:
        route = routes.for_class(cls)
        if route is None or tier not in route.tiers:
            continue
        others = [states.get(other) for other in route.tiers if other != tier]
        if not any(_state(o) == TierState.READY and _admits(o, cls) for o in others):
            return cls
    return None


def _admits(value: TierState | _HasState | None, cls: str) -> bool:
    """Whether the tier may serve ``cls`` (a plain state admits every class)."""
    classes = getattr(value, "classes", None)
    return classes is None or cls in classes


def _state(value: TierState | _HasState | None) -> str | None:
    return value if value is None or isinstance(value, str) else value.state


def choose_reset(
    now: float,
    policy: RoutingPolicy,
    tiers: Sequence[TierResetState],
    quiet_for: float,
    force: str | None = None,
    *,
    rps: float | None = None,
) -> ResetDecision:
    """The one tier to reset now, or none, with the reason (see the module docstring)."""
    known = {t.name: t for t in tiers if t.name in policy.tiers}
    if force is not None:
        return _forced(force, known, policy)
    resets = policy.resets
    if not resets.enabled:
        return ResetDecision(None, "resets are disabled")
    busy = _busy(known.values())
    if busy:
        return ResetDecision(None, busy)
    met, why = conditions_met(now, resets, quiet_for, rps=rps)
    if not met:
        return ResetDecision(None, why)
    order = {name: i for i, name in enumerate(policy.tiers)}
    due: list[tuple[TierResetState, str]] = []
    skipped: list[str] = []
    for tier in sorted(known.values(), key=lambda t: order[t.name]):
        is_due, because = _due(now, resets, tier)
        refusal = _not_ready(tier) or (None if is_due else because) or _unsafe(tier, known, policy)
        if refusal is None:
            due.append((tier, because))
        else:
            skipped.append(refusal)
    if not due:
        return ResetDecision(None, "no tier to reset: " + ("; ".join(skipped) or "no tiers"))
    # never reset first, then the oldest reset; min keeps the first of equals (policy order)
    tier, because = min(
        due, key=lambda d: (d[0].last_reset_at is not None, d[0].last_reset_at or 0)
    )
    return ResetDecision(tier.name, f"reset {tier.name}: {because}; {why}")


def _forced(
    force: str, known: Mapping[str, TierResetState], policy: RoutingPolicy
) -> ResetDecision:
    shown = _ascii(force)
    if force not in known:
        return ResetDecision(None, f"forced reset refused: unknown tier {shown}")
    tier = known[force]
    refusal = _busy(known.values()) or _not_ready(tier) or _unsafe(tier, known, policy)
    if refusal:
        return ResetDecision(None, f"forced reset of {shown} refused: {refusal}")
    return ResetDecision(force, f"reset {shown}: forced by an operator")


def _busy(tiers: Iterable[TierResetState]) -> str | None:
    for tier in tiers:
        if tier.state in BUSY:
            return f"{tier.name} is {tier.state} (one reset at a time)"
    return None


def _not_ready(tier: TierResetState) -> str | None:
    return None if tier.state == TierState.READY else f"{tier.name} is {_ascii(tier.state)}"


def _unsafe(
    tier: TierResetState, known: Mapping[str, TierResetState], policy: RoutingPolicy
) -> str | None:
    """Why taking ``tier`` out would strand a class (its route's last ready tier), or ``None``."""
    cls = last_ready_for_a_class(tier.name, known, policy.routes)
    return f"{tier.name} is the last ready tier of {cls}" if cls else None


def _due(now: float, resets: ResetsPolicy, tier: TierResetState) -> tuple[bool, str]:
    """Whether ``tier`` is due for a reset, and why (or why not)."""
    if tier.last_reset_at is None:
        return True, "never reset"
    age = max(0.0, now - tier.last_reset_at)
    if age >= resets.min_interval_seconds:
        return True, f"last reset {_span(age)} ago"
    triggers = resets.triggers
    growth = _growth(tier.preemptions, tier.preemptions_at_last_reset)
    if triggers.preemptions_growth is not None and growth >= triggers.preemptions_growth:
        limit = triggers.preemptions_growth
        return True, f"preemptions +{growth:g} since the last reset >= {limit:g}"
    p90, base, factor = tier.ttft_p90_ms, tier.ttft_baseline_p90_ms, triggers.ttft_p90_factor
    if factor is not None and p90 is not None and base is not None and p90 > factor * base > 0:
        return True, f"TTFT p90 {p90:.0f} ms > {factor:g} x baseline {base:.0f} ms"
    return False, f"{tier.name} reset {_span(age)} ago < {_span(resets.min_interval_seconds)}"


def _growth(now: float, then: float) -> float:
    """Growth of a counter; one that went back (its process restarted) counts from 0."""
    return now if now < then else now - then


def _span(seconds: float) -> str:
    """A duration for people: 45 s, 12 min, 2 h, 2.5 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f}".removesuffix(".0") + " h"


def _ascii(text: str) -> str:
    return text.encode("ascii", "backslashreplace").decode("ascii")
