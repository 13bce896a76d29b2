"""Pure quality figures: perplexity, next-token agreement, GSM8K exact match, spreads.

- perplexity of a category: exp of the mean negative log-probability over all its scored
  tokens (token-weighted, as a corpus perplexity);
- next-token agreement: the share of scored positions where a tier's top-1 token equals the
  reference tier's top-1 token (token-weighted over the category);
- sequence agreement (the routing evaluation): two greedy answers' tokens compared position
  by position, over the longer answer's length (a missing token is a disagreement);
- GSM8K: the reference is the number after ``####``; a model's answer is its last number.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_CALCULATOR = re.compile(r"<<[^<>]*>>")


@dataclass(frozen=True)
class Spread:
    """A figure over repeated runs: mean, min, max, population std and the runs' values."""

    mean: float
    min: float
    max: float
    std: float
    runs: tuple[float, ...]


def spread(values: Sequence[float]) -> Spread:
    if not values:
        raise ValueError("no runs to summarize")
    vals = tuple(float(v) for v in values)
    return Spread(statistics.fmean(vals), min(vals), max(vals), statistics.pstdev(vals), vals)


def perplexity(logprobs: Sequence[Sequence[float]]) -> float:
    """Corpus perplexity over texts' token log-probabilities (natural log)."""
    total = sum(len(lp) for lp in logprobs)
    if total == 0:
        raise ValueError("no tokens to score")
    return math.exp(-sum(sum(lp) for lp in logprobs) / total)


def agreement(tier: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]) -> float:
    """Share of positions whose top-1 tokens agree, over texts scored by both."""
    if len(tier) != len(reference):
        raise ValueError(f"{len(tier)} texts against {len(reference)} reference texts")
    same = total = 0
    for ours, theirs in zip(tier, reference, strict=True):
        if len(ours) != len(theirs):
            raise ValueError(f"{len(ours)} positions against {len(theirs)} reference positions")
        same += sum(a == b for a, b in zip(ours, theirs, strict=True))
        total += len(ours)
    if total == 0:
        raise ValueError("no positions to compare")
    return same / total


def sequence_agreement(answer: Sequence[int], reference: Sequence[int]) -> float:
    """Position-by-position agreement of two token sequences over the longer length; two
    empty answers agree fully."""
    longest = max(len(answer), len(reference))
    if longest == 0:
        return 1.0
    return sum(a == b for a, b in zip(answer, reference, strict=False)) / longest


def strip_calculator(text: str) -> str:
    """GSM8K's ``<<48/2=24>>`` calculator annotations removed."""
    return _CALCULATOR.sub("", text)


def gsm8k_reference(answer: str) -> str:
    """The final answer after ``####`` in a GSM8K solution, normalized."""
    if "####" not in answer:
        raise ValueError("a GSM8K solution without '####'")
    found = last_number(answer.rsplit("####", 1)[1])
    if found is None:
        raise ValueError("a GSM8K solution without a number after '####'")
    return found


def last_number(text: str) -> str | None:
    """The last number in ``text``, normalized (no thousands commas, no trailing ``.0``)."""
    numbers = _NUMBER.findall(text)
    if not numbers:
        return None
    raw = numbers[-1].replace(",", "")
    try:
        value = float(raw)
    except ValueError:
        return None
    return str(int(value)) if value.is_integer() else repr(value)


def exact_match(answer: str, reference: str) -> bool:
    """Whether the last number of a model's ``answer`` equals the normalized ``reference``."""
    return last_number(answer) == reference


def mean_or_zero(flags: Sequence[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0
