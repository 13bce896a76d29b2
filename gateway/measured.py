"""What ``up`` measured on this machine, in a file the offline tools read.

``up`` hands its gateway the tiers' measured figures (``GatewayConfig.measured``) and also
writes them to ``<cache>/measured/gateway-<port>.json`` (``measured_path``): each tier's
agreement with the reference per category (the in-engine admission check), its speed (the
calibration of measure/speed.py: TTFT and TPOT alone, with the per-prompt samples behind them,
output tokens/s under a little load; whether it was served emulated),
the classes the admission check let it serve, its URL and the admission floors. Written whole
each time ``up`` starts its gateway; it stays after ``up`` stops (the figures describe this
machine and these variants, not the process), and ``written_at`` says when.

Read by ``model-optimizer policy check`` (static chains that contradict the figures) and
``model-optimizer eval routing`` (the frontier's cost axis). A file is simpler and more honest
than asking a running gateway: it needs no admin key, and it exists only where ``up`` measured.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.env_paths import cache_root
from gateway.config import MeasuredTier
from gateway.policy.derive import TierFigures


class MeasuredError(ValueError):
    """A measurement file that cannot be used; ``str()`` is one line naming it."""


class MeasuredStack(BaseModel):
    """The file's content (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = 1
    written_at: str  # ISO 8601 UTC
    gateway_port: int = Field(gt=0)
    reference: str  # the tier the quality figures are measured against
    tiers: dict[str, MeasuredTier]  # tier -> quality per category, ttft_s, tpot_s, tok/s
    tier_urls: dict[str, str] = Field(default_factory=dict)
    # tier -> the classes the admission check let it serve; a tier not listed serves all
    classes: dict[str, list[str]] = Field(default_factory=dict)
    floors: dict[str, float] = Field(default_factory=dict)  # admission floors per category
    speed: str = ""  # how the speeds were measured, one phrase

    def figures(self) -> dict[str, TierFigures]:
        """The tiers as the route derivation and the chain check take them."""
        return tier_figures(self.tiers, self.classes)


def tier_figures(
    measured: Mapping[str, MeasuredTier], classes: Mapping[str, list[str] | None]
) -> dict[str, TierFigures]:
    """``measured`` with each tier's admitted classes (absent or ``None``: every class)."""
    out = {}
    for name, m in measured.items():
        admitted = classes.get(name)
        out[name] = TierFigures(
            name,
            dict(m.quality),
            m.ttft_s,
            m.tpot_s,
            m.throughput_tok_s,
            frozenset(admitted) if admitted is not None else None,
            tuple(m.ttfts_s),
            tuple(m.tpots_s),
            m.emulated,
            m.concurrency,
        )
    return out


def measured_path(port: int) -> Path:
    """Where ``up`` writes the figures of the stack whose gateway listens on ``port``."""
    return cache_root() / "measured" / f"gateway-{port}.json"


def write_measured(path: Path, stack: MeasuredStack) -> None:
    """Written whole (a temporary file renamed): a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(stack.model_dump_json(indent=1))
    tmp.replace(path)


def read_measured(path: Path) -> MeasuredStack | None:
    """The file's figures; ``None`` when there is no file; ``MeasuredError`` when it is bad."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise MeasuredError(f"{path}: cannot read the measurements: {exc}") from None
    try:
        return MeasuredStack.model_validate(json.loads(text))
    except (ValueError, ValidationError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise MeasuredError(f"{path}: not a measurement file written by up: {first}") from None
