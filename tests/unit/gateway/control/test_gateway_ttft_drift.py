"""TtftDrift: recent and baseline TTFT p90 from cumulative bucket snapshots."""

from __future__ import annotations

from gateway.control.ttft_drift import TtftDrift

INF = float("inf")


def _buckets(fast: float, slow: float) -> tuple[tuple[float, float], ...]:
    """Cumulative buckets holding ``fast`` observations under 0.1 s and ``slow`` in 1-2 s."""
    return ((0.1, fast), (1.0, fast), (2.0, fast + slow), (INF, fast + slow))


def test_baseline_is_the_first_window_and_recent_follows_the_last_one() -> None:
    drift = TtftDrift(window=60, every=10)
    assert drift.recent_p90_ms("fp16") is None and drift.baseline_p90_ms("fp16") is None
    fast = 0.0
    for t in range(0, 70, 10):  # a first minute of fast answers
        fast += 10
        drift.observe("fp16", float(t), _buckets(fast, 0))
    baseline = drift.baseline_p90_ms("fp16")
    assert baseline is not None and baseline <= 100
    slow = 0.0
    for t in range(70, 200, 10):  # then everything takes 1-2 s
        slow += 10
        drift.observe("fp16", float(t), _buckets(fast, slow))
    recent = drift.recent_p90_ms("fp16")
    assert recent is not None and recent > 1000
    assert drift.baseline_p90_ms("fp16") == baseline  # frozen


def test_a_reset_starts_a_new_baseline() -> None:
    drift = TtftDrift(window=20, every=10)
    for t in range(0, 40, 10):
        drift.observe("int4", float(t), _buckets(0, 10.0 * (t + 10)))
    assert drift.baseline_p90_ms("int4") is not None and drift.baseline_p90_ms("int4") > 1000
    drift.reset_done("int4", 40.0, _buckets(0, 400))
    assert drift.baseline_p90_ms("int4") is None
    for i, t in enumerate(range(50, 80, 10)):
        drift.observe("int4", float(t), _buckets(10.0 * (i + 1), 400))
    assert drift.baseline_p90_ms("int4") is not None and drift.baseline_p90_ms("int4") <= 100


def test_no_buckets_no_figures() -> None:
    drift = TtftDrift()
    drift.observe("int8", 0.0, ())
    assert drift.recent_p90_ms("int8") is None and drift.baseline_p90_ms("int8") is None
