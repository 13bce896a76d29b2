"""A llama-server's KV reset: every slot's cache erased, checked by a probe (its I/O is the
caller's ``Call``; the decisions here are pure).

llama-server keeps each slot's last prompt in its KV cells (``cache_prompt``) and, as
``up`` starts it (``--cache-ram 0``), nothing else. ``POST /slots/{id}?action=erase`` empties a
slot (it needs ``--slot-save-path``; on a busy slot it waits until the slot is idle, so the tier
is drained first, as for vLLM). The probe: a fixed prompt of token ids sent twice before the
reset (the second send must find it cached: ``timings.cache_n`` > 0, else there is nothing to
verify) and once after every slot is erased, when ``cache_n`` must be 0. The probe leaves its
own prompt cached (synthetic tokens, no user data).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

PROBE_TOKENS = 64
_PROBE_FIRST_ID = 1000
_PROBE_SPAN = 97

# (method, path, JSON body or None) → the answer's JSON; raises the caller's error on failure.
Call = Callable[[str, str, Mapping[str, Any] | None], Awaitable[Any]]


def probe_body(tokens: int = PROBE_TOKENS) -> dict[str, Any]:
    """The probe: ``tokens`` token ids (exact for any vocabulary over 1,100), one token back."""
    ids = [_PROBE_FIRST_ID + i % _PROBE_SPAN for i in range(tokens)]
    return {"prompt": ids, "n_predict": 1, "temperature": 0, "cache_prompt": True}


def cached_tokens(answer: object) -> int | None:
    """``timings.cache_n`` of a ``/completion`` answer (``None`` when absent)."""
    timings = answer.get("timings") if isinstance(answer, Mapping) else None
    value = timings.get("cache_n") if isinstance(timings, Mapping) else None
    return value if isinstance(value, int) else None


def slot_ids(slots: object) -> list[int]:
    """The ids of ``GET /slots``'s answer (a list of ``{"id": n, ...}``)."""
    if not isinstance(slots, Sequence) or isinstance(slots, str | bytes):
        return []
    return [s["id"] for s in slots if isinstance(s, Mapping) and isinstance(s.get("id"), int)]


def judge(seeded: int | None, after: int | None, tokens: int) -> tuple[bool, str]:
    """The verdict from the probe's cached tokens before (its second send) and after (pure)."""
    if seeded is None or after is None:
        return False, "cannot verify: /completion gave no timings.cache_n"
    if seeded == 0:
        return False, "cannot verify: the probe was not cached even before the reset"
    if after > 0:
        return False, f"slot_erase left {after} of the {tokens} probe tokens cached"
    return True, (
        f"slot_erase: {tokens}-token probe found 0 cached tokens after the reset "
        f"(sent just before it: {seeded} cached)"
    )


async def erase_all(call: Call, slots: Sequence[int]) -> int:
    """Erase every slot; the tokens erased in all."""
    erased = 0
    for slot in slots:
        answer = await call("POST", f"/slots/{slot}?action=erase", None)
        value = answer.get("n_erased") if isinstance(answer, Mapping) else None
        erased += value if isinstance(value, int) else 0
    return erased


async def reset_slots(call: Call, verify: bool) -> tuple[bool, str]:
    """Erase every slot of the tier (drained beforehand); with ``verify``, prove it by probe."""
    slots = slot_ids(await call("GET", "/slots", None) or [])
    if not slots:
        return False, "GET /slots listed no slot"
    seeded = None
    if verify:
        await call("POST", "/completion", probe_body())
        seeded = cached_tokens(await call("POST", "/completion", probe_body()))
    erased = await erase_all(call, slots)
    if not verify:
        return False, f"not verified (verify=False); {len(slots)} slots, {erased} tokens erased"
    after = cached_tokens(await call("POST", "/completion", probe_body()))
    return judge(seeded, after, PROBE_TOKENS)
