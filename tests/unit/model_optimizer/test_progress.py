"""progress: the optimizer's step lines and the tier starts, as lines for a log or one bar."""

from __future__ import annotations

import io

import pytest

from model_optimizer.progress import StepRelay, TierStarts, is_terminal


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def steps(variant: str, total: int) -> list[str]:
    return [
        f"optimize: [{variant}] quantize {i}/{total} model.layers.{i}.q_proj\n"
        for i in range(1, total + 1)
    ]


def test_a_log_gets_quarters_and_a_done_line_instead_of_every_layer() -> None:
    out, clock = io.StringIO(), Clock()
    relay = StepRelay(out, terminal=False, clock=clock)
    relay.feed("optimize: [int4] calibrate: 64 samples x 512 tokens; quantize 210 layers\n")
    for line in steps("int4", 210):
        clock.now += 0.2
        relay.feed(line)
    relay.feed("optimize: [int4] write: /tmp/v/int4\n")
    relay.close()
    assert out.getvalue().splitlines() == [
        "optimize: [int4] calibrate: 64 samples x 512 tokens; quantize 210 layers",
        "optimize: [int4] quantize 53/210 (25%) after 11s",
        "optimize: [int4] quantize 105/210 (50%) after 21s",
        "optimize: [int4] quantize 158/210 (75%) after 32s",
        "optimize: [int4] quantize 210/210 done in 42s",
        "optimize: [int4] write: /tmp/v/int4",
    ]


def test_small_stages_and_other_lines() -> None:
    out = io.StringIO()
    relay = StepRelay(out, terminal=False, clock=Clock())
    for line in steps("int8", 2):
        relay.feed(line)
    relay.feed("model-optimizer: error: boom\n")
    relay.feed("optimize: [int8] quantize 1/3 a\n")  # cut short: no done line
    relay.close()
    assert out.getvalue().splitlines() == [
        "optimize: [int8] quantize 1/2 (50%) after 0s",
        "optimize: [int8] quantize 2/2 done in 0s",
        "model-optimizer: error: boom",
        "optimize: [int8] quantize 1/3 (33%) after 0s",
    ]


def test_a_terminal_gets_one_bar_per_stage() -> None:
    out = io.StringIO()
    relay = StepRelay(out, terminal=True)
    for line in steps("int4", 20):
        relay.feed(line)
    relay.feed("optimize: [int4] write: /tmp/v/int4\n")
    text = out.getvalue()
    assert "\r" in text and "20/20" in text and "layer" in text
    assert "quantize 1/20 model" not in text  # no line per layer
    assert text.endswith("optimize: [int4] write: /tmp/v/int4\n")


def test_tier_starts_in_a_log_read_as_lines() -> None:
    out, clock = io.StringIO(), Clock()
    with TierStarts(out, total=2, terminal=False, clock=clock) as starts:
        for second in range(3):
            clock.now += 1
            starts.tick("fp16", float(second))
        clock.now += 40
        starts.tick("int4", 0.2)
        clock.now += 7
    assert out.getvalue().splitlines() == [
        "up: tier fp16 starting",
        "up: tier fp16 ready in 42s",
        "up: tier int4 starting",
        "up: tier int4 ready in 7s",
    ]


def test_a_failed_start_claims_no_readiness() -> None:
    out = io.StringIO()
    with pytest.raises(RuntimeError), TierStarts(out, total=1, terminal=False) as starts:
        starts.tick("fp16", 0.0)
        raise RuntimeError("tier fp16 exited during start")
    assert out.getvalue() == "up: tier fp16 starting\n"


def test_tier_starts_on_a_terminal_are_one_bar() -> None:
    out = io.StringIO()
    with TierStarts(out, total=2, terminal=True) as starts:
        starts.tick("fp16", 0.0)
        starts.tick("int4", 0.0)
    text = out.getvalue()
    assert "up: tier int4 starting" in text and "up: tiers ready" in text and "2/2" in text
    assert "ready in" not in text


def test_only_a_terminal_counts_as_one() -> None:
    assert not is_terminal(io.StringIO())
