"""What the classifier decides: a request's class and the reason, as plain values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.request.classify.second_stage import BandQuery


@dataclass(frozen=True)
class Classification:
    """The class of a request and why. The keyword rules' scores (for telemetry) add up the
    signals found before the class was decided, so they are lower bounds of the full scores."""

    cls: str
    reason: str
    code_score: float = 0.0
    math_score: float = 0.0
    p_precise: float | None = None  # the model's probability, when a model decided
    band: BandQuery | None = None  # in the first stage's band: the second stage decides


def ascii_text(text: str) -> str:
    """``text`` with anything outside ASCII escaped, so that it can travel as a header."""
    return text.encode("ascii", "backslashreplace").decode("ascii")
