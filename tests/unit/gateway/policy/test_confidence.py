"""The paired bootstrap interval on a tier's gain (gateway/policy/confidence.py, pure)."""

from __future__ import annotations

import math

import pytest

from gateway.policy.confidence import MIN_PAIRS, answer_costs, paired_gain

REF = [4.9, 5.3, 4.7, 6.1, 5.0, 4.8, 7.2, 5.1]  # a busy machine: the load moves every prompt


def test_a_constant_ratio_gives_that_gain_and_no_width() -> None:
    tier = [0.6 * c for c in REF]
    interval = paired_gain(tier, REF, 0.95)
    assert interval is not None
    assert interval.gain == pytest.approx(0.4)
    assert interval.low == pytest.approx(0.4) and interval.high == pytest.approx(0.4)
    assert interval.n == len(REF) and interval.level == 0.95
    assert interval.describe("fp16") == "gain 0.40 [0.40, 0.40] over fp16, n=8"


def test_pairing_cancels_the_machine_load_that_two_medians_would_not() -> None:
    """Each prompt's costs move together (the same load): the paired gain stays narrow."""
    tier = [
        c * r for c, r in zip(REF, [0.62, 0.58, 0.60, 0.61, 0.59, 0.60, 0.63, 0.57], strict=True)
    ]
    interval = paired_gain(tier, REF, 0.95)
    assert interval is not None
    assert 0.35 < interval.low <= interval.gain <= interval.high < 0.45


def test_noisy_ratios_give_an_interval_around_the_gain_wider_at_a_higher_level() -> None:
    ratios = [0.80, 1.05, 0.70, 0.95, 0.85, 1.10, 0.75, 0.90]
    tier = [c * r for c, r in zip(REF, ratios, strict=True)]
    at95, at80 = paired_gain(tier, REF, 0.95), paired_gain(tier, REF, 0.80)
    assert at95 is not None and at80 is not None
    expected = 1 - math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    assert at95.gain == pytest.approx(expected)
    assert at95.low < at80.low < at95.gain < at80.high < at95.high
    assert at95.low < 0.10 < at95.gain  # the point clears a 10 % margin, the interval does not
    assert paired_gain(tier, REF, 0.95) == at95  # seeded: the same samples, the same interval
    assert paired_gain(tier, REF, 0.95, seed=1) != at95


def test_failed_requests_are_left_out_pair_by_pair_and_too_few_pairs_give_none() -> None:
    tier: list[float | None] = [0.5 * c for c in REF]
    tier[0] = None
    ref: list[float | None] = list(REF)
    ref[1] = None
    interval = paired_gain(tier, ref, 0.95)
    assert interval is not None and interval.n == len(REF) - 2
    assert paired_gain(tier[: MIN_PAIRS + 1], ref[: MIN_PAIRS + 1], 0.95) is None
    assert paired_gain([], [], 0.95) is None
    with pytest.raises(ValueError):
        paired_gain(tier, ref, 1.0)


def test_answer_costs_are_ttft_plus_tokens_times_tpot_per_prompt() -> None:
    costs = answer_costs([0.2, None, 0.3], [0.03, 0.03, None], 100)
    assert costs[0] == pytest.approx(3.2)
    assert costs[1:] == (None, None)
    assert answer_costs([0.2, 0.1], [0.01], 10) == (pytest.approx(0.3), None)
