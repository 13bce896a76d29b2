"""Router inputs for tests: the three tiers ready, unloaded, 2048 tokens long, unless changed."""

from __future__ import annotations

from typing import Any

from backends.tier_state import TierState
from gateway.request.route.router import TierStatus

TIERS = ["fp16", "int8", "int4"]


def tier_statuses(**changes: dict[str, Any]) -> dict[str, TierStatus]:
    out = {}
    for name in TIERS:
        values: dict[str, Any] = {
            "state": "ready",
            "requests_waiting": 0.0,
            "kv_usage": 0.1,
            "max_model_len": 2048,
        }
        values.update(changes.get(name, {}))
        values["state"] = TierState(values["state"])  # tests name states by their strings
        out[name] = TierStatus(name=name, **values)
    return out
