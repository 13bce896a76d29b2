"""What the reset coordinator (gateway/control/resets.py) keeps in shared state, and how a value
read back from it is checked: an operator's queued "reset now" and the reset records of the
history. Values come from other replicas and operators: read leniently, never an exception."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Container
from dataclasses import dataclass, field

from pydantic import TypeAdapter

from gateway.control.reset_marks import json_object
from gateway.shared.records import SharedRecords

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Forced:
    """An operator's "reset now", as queued in shared state."""

    tier: str
    asked_at: float  # epoch seconds
    refused_at: float | None = None  # first refused by the safety rules (the patience's start)
    bare: bool = False  # queued by an older replica: a bare tier name under the older key

    def encode(self) -> str:
        if self.bare:  # left as an older replica wrote it
            return self.tier
        value: dict[str, object] = {"tier": self.tier, "asked_at": self.asked_at}
        if self.refused_at is not None:
            value["refused_at"] = self.refused_at
        return json.dumps(value)

    @classmethod
    def decode(cls, raw: str, now: float) -> Forced:
        """Lenient: a bare tier name (an older replica's entry) was asked ``now``; a time
        that is not a number, or is later than ``now`` (another replica's clock), is ``now``."""
        value = json_object(raw)
        if value is None or not isinstance(value.get("tier"), str):
            return cls(raw, now, bare=True)
        refused = value.get("refused_at")
        return cls(
            str(value["tier"]),
            _past(number(value.get("asked_at")), now),
            None if refused is None else _past(number(refused), now),
        )


# Older replicas queue bare tier names under OLDER_REQUESTS and drop anything else they find
# there: the two formats never share a key.
REQUESTS, OLDER_REQUESTS = "reset:queue:v2", "reset:queue"


class ForcedQueue:
    """Operators' "reset now" requests in shared state, for whichever replica leads."""

    def __init__(self, records: SharedRecords) -> None:
        self.records = records

    async def ask(self, tier: str, now: float) -> None:
        """Queue ``tier`` (once: asking again while it waits adds nothing)."""
        waiting = [*await self.records.items(REQUESTS), *await self.records.items(OLDER_REQUESTS)]
        if not any(Forced.decode(raw, now).tier == tier for raw in waiting):
            await self.records.push(REQUESTS, Forced(tier, now).encode())

    async def next(self, known: Container[str], now: float) -> Forced | None:
        """The oldest request (new format first); one for a tier not in ``known`` is dropped."""
        raw = await self.records.pop(REQUESTS) or await self.records.pop(OLDER_REQUESTS)
        if raw is None:
            return None
        queued = Forced.decode(raw, now)
        if queued.tier not in known:
            logger.warning("queued reset of an unknown tier dropped: %.60r", raw)
            return None
        return queued

    async def put_back(self, queued: Forced) -> None:
        """Queue ``queued`` again, under the key and in the form it came in."""
        await self.records.push(OLDER_REQUESTS if queued.bare else REQUESTS, queued.encode())


def _past(when: float, now: float) -> float:
    return min(when, now) if math.isfinite(when) and when else now


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
