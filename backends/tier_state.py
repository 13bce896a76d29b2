"""The states a tier can be in: the one vocabulary of the supervisor and the gateway.

The supervisor (backends/supervisor.py) moves a tier between ``starting``, ``ready`` and
``down``; the gateway's reset coordinator marks a tier ``draining`` and then ``resetting``, and
its scrapes find a tier ``down``; the gateway routes only to ``ready`` tiers. A ``StrEnum``:
each member is its value as a string, so JSON, Redis values, log lines and ``f"{state}"`` read
``ready``, never ``TierState.READY``. Nothing here imports the gateway.
"""

from __future__ import annotations

import enum


class TierState(enum.StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    RESETTING = "resetting"
    DOWN = "down"
