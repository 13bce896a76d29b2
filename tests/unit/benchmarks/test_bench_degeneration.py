"""The token-level signal benchmarks/bench_degeneration.py reports (pure parts)."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_degeneration import lowest_window_mean, token_logprobs


def test_the_lowest_window_mean_finds_the_worst_run_of_tokens() -> None:
    values = [-0.1, -0.1, -5.0, -5.0, -0.1, -0.1]
    assert lowest_window_mean(values, 2) == pytest.approx(-5.0)
    assert lowest_window_mean(values, 3) == pytest.approx(-10.1 / 3)
    assert lowest_window_mean(values, 16) == pytest.approx(sum(values) / 6)  # fewer tokens
    assert lowest_window_mean([], 4) is None


def test_token_logprobs_are_read_from_chat_stream_events() -> None:
    def event(*logprobs: float) -> bytes:
        content = [{"token": "t", "logprob": lp} for lp in logprobs]
        choice = {"index": 0, "delta": {"content": "t"}, "logprobs": {"content": content}}
        return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"

    opening = b'data: {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}\n\n'
    events = opening + event(-0.5) + event(-1.0, -2.0) + b"data: [DONE]\n\n"
    assert token_logprobs(events) == [-0.5, -1.0, -2.0]
