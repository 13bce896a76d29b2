"""What ``GET /admin/routes`` (and ``model-optimizer routes``) shows, and the operator-pin check
(pure).

Per class: the tiers it is served now, how the route came to be (``derived`` from the
measurements, ``as written`` where a derivation found no usable figures, ``pinned``: a route
the policy states without ``derive``), the derivation's reasons (each tier's figures, the
gain's interval and sample count, or why it was left out), and the class's last change and
why (gateway/policy/route_changes.py). Per tier: the calibration's figures (what the routes
are derived from) beside the live figures of real traffic (gateway/control/live_figures.py;
shown, not routed on).

A pinned route is checked against the measurements (``pin_note``): the written tiers derived
as a route with no quality floor of its own (the in-engine check's admitted classes still
hold) and the default goal (latency of a 128-token answer, ``min_gain`` 0.10 cleared by the
gain interval's lower bound; gateway/policy/derive.py). When that derivation would put
another tier first, the note says ``pinned; measurements prefer X (...)`` with X's figures and
gain; when it agrees, ``pinned; measurements agree``. Without figures for the route's tiers
there is no note.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.policy.derive import DerivedChain, Goal, TierFigures, derive_chain
from gateway.policy.route_changes import RouteHistory, served_routes
from gateway.policy.schema import RoutingPolicy

PIN_GOAL = Goal(floor=0.0)


def pin_note(
    cls: str, written: Sequence[str], figures: Mapping[str, TierFigures], reference: str
) -> str | None:
    """What the measurements say of a pinned route (the module docstring); ``None``: nothing."""
    if not written or not any(name in figures for name in written):
        return None
    derived = derive_chain(cls, written, PIN_GOAL, figures, reference)
    if derived.as_written or not derived.chain:
        return None
    preferred, pinned = derived.chain[0], written[0]
    if preferred == pinned:
        return f"pinned; measurements agree ({pinned}: {derived.reasons.get(pinned, '')})"
    note = f"pinned; measurements prefer {preferred} ({derived.reasons.get(preferred, '')})"
    why = derived.reasons.get(pinned)
    return f"{note}; {pinned}: {why}" if why else note


def calibration(tier: TierFigures) -> dict[str, Any]:
    """One tier's calibration figures, as shown."""
    return {
        "ttft_ms": round(tier.ttft_s * 1000, 3),
        "tpot_ms": round(tier.tpot_s * 1000, 3),
        "throughput_tok_s": round(tier.throughput_tok_s, 2),
        "samples": sum(1 for t in tier.ttfts_s if t is not None),
        "emulated": tier.emulated,
    }


def class_entry(
    cls: str,
    tiers: Sequence[str],
    policy: RoutingPolicy,
    derived: DerivedChain | None,
    figures: Mapping[str, TierFigures],
    reference: str,
) -> dict[str, Any]:
    route = policy.routes.for_class(cls)
    entry: dict[str, Any] = {"tiers": list(tiers), "overflow": [], "reasons": {}}
    if route is not None and route.derive is None:
        entry["how"] = "pinned"
        entry["pin"] = pin_note(cls, tiers, figures, reference)
    elif derived is None or derived.as_written:
        entry["how"] = "as written"
    else:
        entry["how"] = "derived"
    if derived is not None:
        entry["overflow"] = list(derived.overflow)
        entry["reasons"] = dict(derived.reasons)
        entry["line"] = derived.describe()
    return entry


def routes_document(
    policy: RoutingPolicy,
    derived: Mapping[str, DerivedChain],
    figures: Mapping[str, TierFigures],
    reference: str | None,
    history: RouteHistory | None,
    live: Mapping[str, Any],
    live_window: Mapping[str, Any],
) -> dict[str, Any]:
    """The ``/admin/routes`` document (the module docstring); JSON-ready."""
    classes = {}
    for cls, served in served_routes(policy).items():
        entry = class_entry(cls, served, policy, derived.get(cls), figures, reference or "")
        last = history.last(cls) if history is not None else None
        entry["last_change"] = last.as_dict() if last is not None else None
        classes[cls] = entry
    names = sorted(set(figures) | set(live))
    tiers = {
        name: {
            "calibration": calibration(figures[name]) if name in figures else None,
            "live": live.get(name),
        }
        for name in names
    }
    return {
        "reference": reference,
        "classes": classes,
        "tiers": tiers,
        "live_window": dict(live_window),
        "history": [c.as_dict() for c in history.changes()] if history is not None else [],
    }
