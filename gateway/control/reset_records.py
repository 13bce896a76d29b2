"""What the reset coordinator (gateway/control/resets.py) keeps in shared state, and how a value
read back from it is checked: an operator's queued "reset now" and the reset records of the
history. Values come from other replicas and operators: read leniently, never an exception."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from pydantic import TypeAdapter

from gateway.control.reset_marks import json_object


@dataclass(frozen=True)
class Forced:
    """An operator's "reset now", as queued in shared state."""

    tier: str
    asked_at: float  # epoch seconds

    def encode(self) -> str:
        return json.dumps({"tier": self.tier, "asked_at": self.asked_at})

    @classmethod
    def decode(cls, raw: str, now: float) -> Forced:
        """Lenient: a bare tier name (an older replica's entry) was asked ``now``; a time
        that is not a number, or is later than ``now`` (another replica's clock), is ``now``."""
        value = json_object(raw)
        if value is None or not isinstance(value.get("tier"), str):
            return cls(raw, now)
        asked = number(value.get("asked_at"))
        return cls(str(value["tier"]), min(asked, now) if math.isfinite(asked) and asked else now)


@dataclass(frozen=True)
class ResetRecord:
    """One reset, as /admin/resets shows it."""

    tier: str
    started_at: float  # epoch seconds
    seconds: float
    outcome: str  # ok | unverified | failed | gave_up | lost_lock | abandoned | refused
    detail: str
    reason: str
    leader: str
    token: int
    preemptions: float = 0.0  # the tier's preemption counter at the reset (for triggers)
    # Seconds per phase (drain, reset, warm_up) of a single-endpoint reset, as far as it got
    # (the last one is where a failed or cut-off reset stopped): where a slow reset spent its
    # time. A pool's rolling reset records none.
    phases: dict[str, float] = field(default_factory=dict)


RECORD = TypeAdapter(ResetRecord)


def int_or(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value)
