"""serving_stats: hand-computed figures for a few requests."""

import math

import pytest

from measure.serving_stats import RequestResult, compute_stats, percentile, summary_ms

VLLM_FIELDS = [
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
] + [
    f"{stat}_{metric}_ms"
    for metric in ("ttft", "tpot", "itl", "e2el")
    for stat in ("mean", "median", "std", "p50", "p90", "p99")
]


def test_percentile_interpolates_like_numpy() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile(values, 100) == 4.0
    assert percentile([5.0], 99) == 5.0
    with pytest.raises(ValueError):
        percentile([], 50)
    assert math.isnan(percentile([], 50, empty=math.nan))
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_summary_uses_population_std_in_ms() -> None:
    out = summary_ms([1.0, 3.0])
    assert out["mean"] == pytest.approx(2000)
    assert out["median"] == pytest.approx(2000)
    assert out["std"] == pytest.approx(1000)
    assert summary_ms([]) == dict.fromkeys(["mean", "median", "std", "p50", "p90", "p99"])


def _two_ok_one_failed() -> list[RequestResult]:
    return [
        RequestResult(0.0, True, 10, 3, ttft=0.1, itl=(0.2, 0.2), latency=0.5),
        RequestResult(0.1, True, 10, 2, ttft=0.3, itl=(0.3,), latency=0.6),
        RequestResult(0.2, False, 10, error="HTTP 500: boom"),
    ]


def test_compute_stats_by_hand() -> None:
    s = compute_stats(_two_ok_one_failed(), duration=1.0)
    assert (s.completed, s.failed) == (2, 1)
    assert (s.total_input_tokens, s.total_output_tokens) == (20, 5)
    assert s.request_throughput == 2.0
    assert s.output_throughput == 5.0
    assert s.total_token_throughput == 25.0
    assert s.mean_ttft_ms == pytest.approx(200)
    # TPOT: (0.5 - 0.1) / 2 = 0.2 and (0.6 - 0.3) / 1 = 0.3
    assert s.median_tpot_ms == pytest.approx(250)
    assert s.p90_tpot_ms == pytest.approx(290)
    # ITL pooled: 0.2, 0.2, 0.3
    assert s.median_itl_ms == pytest.approx(200)
    assert s.mean_itl_ms == pytest.approx(700 / 3)
    assert s.p50_e2el_ms == pytest.approx(550)
    # Every token lands within the first second; both requests run in it.
    assert s.max_output_tokens_per_s == 5.0
    assert s.max_concurrent_requests == 2
    assert s.errors == ["", "", "HTTP 500: boom"]
    assert s.output_lens == [3, 2, 0]


def test_every_vllm_field_is_there_and_percentiles_are_ordered() -> None:
    s = compute_stats(_two_ok_one_failed(), duration=1.0)
    for name in VLLM_FIELDS:
        assert getattr(s, name) is not None, name
    for metric in ("ttft", "tpot", "itl", "e2el"):
        p50, p90, p99 = (getattr(s, f"p{p}_{metric}_ms") for p in (50, 90, 99))
        assert p50 <= p90 <= p99


def test_all_failed_has_no_latencies_rather_than_zero() -> None:
    s = compute_stats([RequestResult(0.0, False, 10, error="x")], duration=2.0)
    assert (s.completed, s.failed, s.output_throughput) == (1 - 1, 1, 0.0)
    assert s.mean_ttft_ms is None and s.p99_e2el_ms is None
    assert s.max_concurrent_requests == 0


def test_one_token_answers_have_no_tpot() -> None:
    s = compute_stats([RequestResult(0.0, True, 4, 1, ttft=0.2, latency=0.2)], duration=1.0)
    assert s.mean_tpot_ms is None
    assert s.mean_ttft_ms == pytest.approx(200)


def test_duration_must_be_positive() -> None:
    with pytest.raises(ValueError):
        compute_stats([], duration=0.0)
