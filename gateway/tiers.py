"""Which tiers may take traffic now: a pure filter over the supervisor's published states.

The backends' supervisor publishes each tier's state (starting, ready, draining, resetting,
down). Only ``ready`` tiers get new requests; with no state source (a gateway in front of tiers
it does not supervise) every configured tier is a candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from gateway.config import TierEndpoint

TierStates = Callable[[], Mapping[str, str]]
READY = "ready"


def available_tiers(
    tiers: Sequence[TierEndpoint], states: Mapping[str, str] | None
) -> list[TierEndpoint]:
    """The tiers, in order, whose state is ready (all of them when states are unknown)."""
    if states is None:
        return list(tiers)
    return [tier for tier in tiers if states.get(tier.name) == READY]
