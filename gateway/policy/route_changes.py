"""When a class's route changes, and why: the changes between two policies (pure), the bounded
history the policy store keeps of them, and how a change is made visible.

A route changes when an applied policy (the first load, an edit, a reload re-deriving from new
figures, where hysteresis may keep or move an order) serves a class a different list of tiers
than before (the chain and its overflow, in order). Each change is one ``RouteChange``: when,
the class, the old and the new tiers, and why: the policy's digest and, for a derived route,
the derivation's line (each tier's figures, its gain's interval and sample count, or why it
was left out; gateway/policy/derive.py).

``report`` makes the changes visible (the first load is history, not a change): one info log
line per class, an event ``gateway.route.changed`` on the current span (a reload asked through
``POST /admin/policy/reload`` has one; the file watch has none), and the store's ``on_change``
callback, which the app points at the metrics (``gateway_route_changes_total{class}``,
``gateway_route_first_tier{class,tier}``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace

from gateway.policy.derive import DerivedChain
from gateway.policy.schema import CLASS_NAMES, RoutingPolicy

HISTORY = 50  # changes the store keeps (newest last)
SPAN_EVENT = "gateway.route.changed"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RouteChange:
    """One class's route, changed (``old`` ``None``: the policy's first load)."""

    at: float  # wall clock, seconds
    cls: str
    old: tuple[str, ...] | None
    new: tuple[str, ...]
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": iso(self.at),
            "class": self.cls,
            "from": None if self.old is None else list(self.old),
            "to": list(self.new),
            "reason": self.reason,
        }


def served_routes(policy: RoutingPolicy) -> dict[str, tuple[str, ...]]:
    """Each class's tiers as the policy serves them (derived chains already in place)."""
    out: dict[str, tuple[str, ...]] = {}
    for cls in CLASS_NAMES:
        route = policy.routes.for_class(cls)
        if route is not None:
            out[cls] = tuple(route.tiers)
    return out


def first_tiers(policy: RoutingPolicy) -> dict[str, str]:
    """Each class's first tier (what ``gateway_route_first_tier`` shows)."""
    return {cls: tiers[0] for cls, tiers in served_routes(policy).items() if tiers}


def route_changes(
    old: Mapping[str, tuple[str, ...]] | None,
    new: Mapping[str, tuple[str, ...]],
    derived: Mapping[str, DerivedChain],
    digest: str,
    at: float,
    cause: str | None = None,
) -> list[RouteChange]:
    """The classes whose tiers differ from ``old`` (``None``: a first load, every class);
    ``cause``: what made them change when it is not a policy edit (new measured figures)."""
    out = []
    for cls, tiers in new.items():
        before = None if old is None else old.get(cls)
        if old is not None and before == tiers:
            continue
        chain = derived.get(cls)
        why = chain.describe() if chain is not None else "the route as written"
        head = "loaded" if old is None else "applied"
        reason = f"{cause}: {why}" if cause else f"policy sha256 {digest[:12]} {head}: {why}"
        out.append(RouteChange(at, cls, before, tiers, reason))
    return out


class RouteHistory:
    """The last ``HISTORY`` route changes, newest last."""

    def __init__(self, size: int = HISTORY) -> None:
        self._changes: deque[RouteChange] = deque(maxlen=size)

    def extend(self, changes: Iterable[RouteChange]) -> None:
        self._changes.extend(changes)

    def changes(self) -> list[RouteChange]:
        return list(self._changes)

    def last(self, cls: str) -> RouteChange | None:
        """The class's latest change (its first load if it never changed since)."""
        return next((c for c in reversed(self._changes) if c.cls == cls), None)


def report(
    changes: Sequence[RouteChange],
    on_change: Callable[[Sequence[RouteChange]], None] | None,
) -> None:
    """Log, trace and count the changes that are changes (not a first load's routes)."""
    moved = [c for c in changes if c.old is not None]
    if not moved:
        return
    span = trace.get_current_span()
    for change in moved:
        old, new = ",".join(change.old or ()), ",".join(change.new)
        logger.info("route for %s changed: %s -> %s (%s)", change.cls, old, new, change.reason)
        span.add_event(SPAN_EVENT, {"class": change.cls, "from": old, "to": new,
                                    "reason": change.reason})  # fmt: skip
    if on_change is not None:
        try:
            on_change(moved)
        except Exception:  # counting must not undo an applied policy
            logger.exception("route change callback failed")


def iso(timestamp: float) -> str:
    """ISO 8601 UTC, e.g. ``2025-01-31T12:00:00.000Z``."""
    moment = datetime.fromtimestamp(timestamp, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
