"""The measured figures every replica routes on: a typed record, parsed from the shared text.

The leader writes one ``FiguresRecord`` (JSON) to Redis (gateway/shared/fenced.py): per tier
the figures the route derivation takes (``MeasuredTier``: agreement per category, speed, the
per-prompt samples, emulated or not) and the classes the admission check admitted; per endpoint
when it was measured, in which variant, its verdict line and whether it passed;
when the record was written, by which replica and with which fencing token. ``parse_record``
turns text into a record or ``None``: a text that does not parse is logged once (per distinct
text) and the caller keeps the last good record. ``merge`` (pure) folds one run into a record.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.config import MeasuredTier
from gateway.control.measure_due import Measured

logger = logging.getLogger(__name__)
VERSION = 1


class EndpointRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tier: str
    url: str
    at: float  # epoch seconds
    digest: str = ""
    passed: bool = True
    verdict: str = ""  # the admission verdict's line ("" for the reference)

    def measured(self) -> Measured:
        return Measured(self.tier, self.url, self.at, self.digest)


class FiguresRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = VERSION
    written_at: float  # epoch seconds
    replica: str  # the leader that wrote it
    token: int = Field(ge=0)  # its fencing token
    reference: str
    tiers: dict[str, MeasuredTier]
    classes: dict[str, list[str]] = Field(default_factory=dict)  # tier -> admitted classes
    endpoints: list[EndpointRecord] = Field(default_factory=list)
    source: str = "gateway"  # gateway | up (figures handed over at start)

    def last_measured(self) -> dict[tuple[str, str], Measured]:
        return {(e.tier, e.url): e.measured() for e in self.endpoints}

    def same_figures(self, other: FiguresRecord | None) -> bool:
        """Whether routing on ``other`` is routing on these (times and writer aside)."""
        return (
            other is not None
            and other.reference == self.reference
            and other.tiers == self.tiers
            and other.classes == self.classes
        )


class RecordParser:
    """``parse`` text into a record; each distinct bad text is logged once."""

    def __init__(self) -> None:
        self._bad: str | None = None

    def parse(self, text: str | None) -> FiguresRecord | None:
        if text is None:
            return None
        try:
            record = FiguresRecord.model_validate_json(text)
        except (ValidationError, ValueError) as exc:
            if text != self._bad:
                self._bad = text
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                logger.warning(
                    "shared measured figures do not parse (%s; %.60r): the last good ones "
                    "keep serving",
                    first,
                    text,
                )
            return None
        self._bad = None
        return record


def merge(
    current: FiguresRecord | None,
    *,
    reference: str,
    tiers: Mapping[str, MeasuredTier],
    classes: Mapping[str, list[str] | None],
    endpoints: list[EndpointRecord],
    now: float,
    replica: str,
    token: int,
) -> FiguresRecord:
    """``current`` with one run's figures: the run's tiers replace theirs (a run measures
    every tier with a ready endpoint: a pool's tier has the figures and verdict of its endpoint
    measured last), a tier the run could not reach keeps its last figures."""
    keep = current if current is not None and current.reference == reference else None
    out_tiers = dict(keep.tiers) if keep else {}
    out_tiers.update(tiers)
    run_keys = {(e.tier, e.url) for e in endpoints}
    out_endpoints = [e for e in (keep.endpoints if keep else []) if (e.tier, e.url) not in run_keys]
    out_endpoints += endpoints
    out_classes = dict(keep.classes) if keep else {}
    for tier, admitted in classes.items():
        if admitted is None:
            out_classes.pop(tier, None)
        else:
            out_classes[tier] = list(admitted)
    return FiguresRecord(
        written_at=now,
        replica=replica,
        token=token,
        reference=reference,
        tiers=out_tiers,
        classes=out_classes,
        endpoints=out_endpoints,
    )
