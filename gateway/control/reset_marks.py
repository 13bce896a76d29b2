"""The shared reset marks: which tier, or which endpoint of a tier's pool, a reset holds out
of routing. The leading replica (gateway/control/resets.py) writes them to shared state through
its ``MarksPublisher``; every replica's board follows them after each scrape
(``apply_shared_marks``).

One value, rewritten while the reset lasts (it expires ``lock_ttl_seconds`` after the last
write, so a leader that dies cannot keep anything out): ``{tier: state, "token": n}`` for a
whole tier, ``{"endpoints": {tier: {url: state}}, "token": n}`` for one endpoint of a pool
(gateway/control/pool_resets.py). Values read back are validated: anything that is not a mark
is dropped, never an exception (Redis is shared with other replicas and operators).

A replica follows only marks a leader could have written (``marks_refusal``): the value must
expire, within ``MAX_TTL_FACTOR`` x the policy's ``resets.lock_ttl_seconds`` (a leader writes
exactly that lease), and must leave every class that has a ready tier without them a ready tier
that serves it (the leader checks as much before it marks). Anything else, a ``SET`` without an
expiry by anyone who can reach that Redis included, is refused: routing goes on as if no tier
were marked, with one warning line per refused value. A leader's own marks meet the same rule
when read back, so if tiers go down during a reset until the marked one is a class's last, every
replica routes to it again rather than answer 503s.

Order is the whole contract. The publisher writes the leader's own latest value, one write at a
time, and writes it again on every renewal: a write that Redis missed (a timeout on a loaded
machine sends that replica's shared state local for a while) is repaired at the next renewal,
and nothing read back from Redis is ever written again (that brought back marks that had moved
on). A replica's scrape applies what it read only if no mark was set on its board directly
while the read was on its way (the leader's own marks, set at once, are never undone by an
older read; one that read Redis before a missed write was repaired is corrected by the next
scrape after the renewal).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

import anyio

from backends.tier_state import TierState
from common.class_categories import CLASS_NAMES
from gateway.control.tier_status import EndpointMarks, Marks, TierBoard
from gateway.policy.schema import RoutingPolicy
from gateway.shared.records import SharedRecords

MARKS = "reset:marks"
MAX_TTL_FACTOR = 2.0  # a marks value may expire at most this many leases from now
ENDPOINTS = "endpoints"  # the key of endpoint marks in the marks value
_STATES = {state.value: state for state in TierState}  # a mark's JSON value -> its state

logger = logging.getLogger(__name__)


def json_object(raw: str) -> dict[str, object] | None:
    """The JSON object ``raw`` holds; ``None`` when it is not JSON or not an object."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def parse_marks(raw: str | None) -> dict[str, TierState]:
    """``{tier: state}`` from the shared marks value (the fencing token, and any value that
    is not a tier state, dropped)."""
    value = json_object(raw) if raw else None
    if value is None:
        return {}
    return {
        k: _STATES[v]
        for k, v in value.items()
        if k != "token" and isinstance(v, str) and v in _STATES
    }


def endpoint_marks_value(tier: str, url: str, state: TierState | None, token: int) -> str | None:
    """The shared marks value marking one endpoint of ``tier`` (``None``: no mark)."""
    if state is None:
        return None
    return json.dumps({ENDPOINTS: {tier: {url: state.value}}, "token": token})


def parse_endpoint_marks(raw: str | None) -> dict[tuple[str, str], TierState]:
    """``{(tier, url): state}`` from the shared marks value; anything else is dropped."""
    value = json_object(raw) if raw else None
    pools = value.get(ENDPOINTS) if value is not None else None
    if not isinstance(pools, dict):
        return {}
    out: dict[tuple[str, str], TierState] = {}
    for tier, marks in pools.items():
        if isinstance(tier, str) and isinstance(marks, dict):
            for url, state in marks.items():
                if isinstance(state, str) and state in _STATES:
                    out[(tier, url)] = _STATES[state]
    return out


def apply_endpoint_marks(board: TierBoard, marks: Mapping[tuple[str, str], TierState]) -> None:
    """Make the board's endpoint marks be exactly ``marks``."""
    for name in board.tiers:
        for url in board.pool(name):
            board.set_endpoint_state(name, url, marks.get((name, url)))


async def apply_shared_marks(
    board: TierBoard, records: SharedRecords, policy: RoutingPolicy
) -> None:
    """Make this replica's board follow the leader's marks (called after each scrape); a read
    overtaken by a mark set directly on the board meanwhile is dropped (the next scrape reads
    again); a value ``marks_refusal`` refuses is taken for no marks."""
    version = board.marks_version
    raw, seconds_left = await records.get_leased(MARKS)
    if board.marks_version != version:
        return
    refusal = marks_refusal(board, raw, seconds_left, policy)
    refused = f"{refusal}: {raw}" if refusal is not None else None
    if refused is not None and refused != board.marks_refused:  # one line per value and reason
        logger.warning(
            "shared reset marks %.200r refused (%s): routing as if no tier were marked",
            raw,
            refusal,
        )
    board.marks_refused = refused
    apply_marks(board, None if refusal is not None else raw)


def marks_refusal(
    board: TierBoard, raw: str | None, seconds_left: float | None, policy: RoutingPolicy
) -> str | None:
    """Why the shared marks value ``raw``, with ``seconds_left`` before it expires (``None``:
    never), is not to be followed; ``None`` when it is (a value that marks nothing always is)."""
    marks, endpoint_marks = parse_marks(raw), parse_endpoint_marks(raw)
    if not marks and not endpoint_marks:
        return None
    lease = policy.resets.lock_ttl_seconds
    if seconds_left is None:
        return "it has no expiry; a leader's marks expire after resets.lock_ttl_seconds"
    if seconds_left > MAX_TTL_FACTOR * lease:
        return (
            f"it expires in more than {MAX_TTL_FACTOR:g} x resets.lock_ttl_seconds"
            f" ({MAX_TTL_FACTOR * lease:g} s)"
        )
    stranded = stranded_class(board, marks, endpoint_marks, policy)
    if stranded is not None:
        return f"it leaves class {stranded} no ready tier"
    return None


def stranded_class(
    board: TierBoard, marks: Marks, endpoint_marks: EndpointMarks, policy: RoutingPolicy
) -> str | None:
    """The first class that has a ready tier serving it without any mark and none under
    ``marks`` and ``endpoint_marks``; ``None`` when there is none."""
    unmarked, marked = board.states_under({}, {}), board.states_under(marks, endpoint_marks)
    for cls in CLASS_NAMES:
        route = policy.routes.for_class(cls)
        if route is None:
            continue
        serving = [t for t in route.tiers if _admits(board, t, cls)]
        if any(unmarked.get(t) == TierState.READY for t in serving) and not any(
            marked.get(t) == TierState.READY for t in serving
        ):
            return cls
    return None


def _admits(board: TierBoard, tier: str, cls: str) -> bool:
    if tier not in board.tiers:
        return False
    classes = board.classes(tier)
    return classes is None or cls in classes


def apply_marks(board: TierBoard, raw: str | None) -> None:
    """Make the board's tier and endpoint marks be exactly those of the marks value ``raw``."""
    marks = parse_marks(raw)
    for name in board.tiers:
        board.set_state(name, marks.get(name))
    apply_endpoint_marks(board, parse_endpoint_marks(raw))


class MarksPublisher:
    """The leader's side of the marks: its latest value, written in order and again on every
    ``renew`` (see the module docstring)."""

    def __init__(self, records: SharedRecords) -> None:
        self._records = records
        self._value: str | None = None
        self._stale = False  # the last write stayed local: Redis may hold an older value
        self._lock = anyio.Lock()  # one write at a time: a slow one is never overtaken

    async def publish(self, value: str | None, ttl: float) -> None:
        """Make ``value`` the marks (``None``: no mark) for ``ttl`` seconds."""
        async with self._lock:
            self._value = value
            await self._write(ttl)

    async def renew(self, ttl: float) -> None:
        """Write the latest value again for ``ttl`` seconds (a mark's lease, and the repair of
        a write Redis missed)."""
        async with self._lock:  # the value is read under the lock: never one overtaken
            await self._write(ttl)

    async def repair(self, ttl: float) -> None:
        """Write the latest value again only if its last write stayed local (after a reset:
        a lifted mark that Redis missed would hold the tier out until it expired)."""
        async with self._lock:
            if self._stale:
                await self._write(ttl)

    async def _write(self, ttl: float) -> None:
        self._stale = not await self._records.put(MARKS, self._value, ttl)
