"""The live guard: shadow comparisons (gateway/control/shadow.py) as a guard on routing (pure).

Each finished comparison of a tier's answer with the reference tier's adds one agreement to a
window per (tier, class). When a window holds at least ``min_samples`` comparisons and their
mean agreement is below the class's floor (``shadow.guard.floors`` in the routing policy),
the tier is *withheld* from that class: the router skips it there (``TierBoard``), the gateway
logs one warning and counts it (``gateway_live_guard_trips_total``). A withheld tier comes
back when an operator restores it (``POST /admin/tiers/{tier}/restore``), which is meant
to follow a fresh in-engine check (``model-optimizer check --serving``), or, with the
gateway's own measurements on, when the check the leader runs again on a withheld tier passes
(gateway/control/measurement.py); its window starts empty then.

Escalations feed it too (``escalation.guard`` in the policy; gateway/request/completions/proxy.py):
each watched stream of a tier adds 1 (it finished) or 0 (it degenerated and was escalated) to a
window of its own (``source="escalation"``) with the floor ``1 - max_rate``; a tier that keeps
escalating a class is withheld from it the same way. Those outcomes carry who asked (an API
key's digest prefix, or the client's address without keys): with ``per_who`` set, one asker's
failing samples count at most ``per_who`` in a window (its older ones give way to its newer),
so one tenant asking for degenerate answers on purpose (repetition, ``logit_bias``,
``ignore_eos``) cannot withhold a tier from a class for every tenant.

Agreement here is the shadow metric (the common prefix of two greedy answers over the longer
one, at most ``shadow.max_tokens`` tokens), much stricter than the admission check's
teacher-forced agreement: floors are set on its own scale.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GuardSettings:
    window: int
    min_samples: int
    floors: Mapping[str, float]  # class -> lowest mean agreement; a class not named: unguarded
    per_who: int | None = None  # failing samples of one asker a window counts; None: all


def per_who_cap(max_rate: float, min_samples: int) -> int:
    """The failing samples one asker may hold in a window such that it alone never trips the
    guard: at most ``max_rate`` of the fewest samples a verdict needs (at least one)."""
    return max(1, int(max_rate * min_samples))


@dataclass
class LiveGuard:
    """Windows of recent agreements and the (tier, class) pairs withheld."""

    # (tier, class, source) -> its samples, each with who asked (None: nobody in particular)
    _windows: dict[tuple[str, str, str], deque[tuple[float, str | None]]] = field(
        default_factory=dict
    )
    withheld: dict[str, set[str]] = field(default_factory=dict)

    def record(
        self,
        settings: GuardSettings,
        tier: str,
        cls: str,
        agreement: float,
        source: str = "shadow",
        who: str | None = None,
    ) -> bool:
        """Add one comparison (or, from ``source`` "escalation", one watched stream's outcome,
        asked by ``who``); ``True`` when it withholds ``tier`` from ``cls`` just now."""
        floor = settings.floors.get(cls)
        if floor is None or cls in self.withheld.get(tier, set()):
            return False
        key = (tier, cls, source)
        window = self._windows.get(key)
        if window is None or window.maxlen != settings.window:
            window = deque(window or (), maxlen=settings.window)
            self._windows[key] = window
        if who is not None and settings.per_who is not None and agreement < floor:
            mine = [sample for sample in window if sample[1] == who and sample[0] < floor]
            if len(mine) >= settings.per_who:  # its oldest failing sample gives way
                window.remove(mine[0])
        window.append((agreement, who))
        if len(window) < settings.min_samples or self.mean(tier, cls, source) >= floor:
            return False
        self.withheld.setdefault(tier, set()).add(cls)
        return True

    def mean(self, tier: str, cls: str, source: str = "shadow") -> float:
        window = self._windows.get((tier, cls, source))
        return sum(sample[0] for sample in window) / len(window) if window else 1.0

    def samples(self, tier: str, cls: str, source: str = "shadow") -> int:
        window = self._windows.get((tier, cls, source))
        return len(window) if window else 0

    def restore(self, tier: str) -> list[str]:
        """Put ``tier`` back in every class it was withheld from; its windows start empty."""
        classes = sorted(self.withheld.pop(tier, set()))
        for key in [key for key in self._windows if key[0] == tier and key[1] in classes]:
            del self._windows[key]
        return classes

    def classes_withheld(self, tier: str) -> frozenset[str]:
        return frozenset(self.withheld.get(tier, set()))
