import dataclasses
from pathlib import Path

import pytest

from backends.metrics import (
    MetricsParseError,
    TierMetrics,
    delta,
    parse_metrics,
)

DATA = Path(__file__).parent / "data"


def _fixture(name: str) -> str:
    return (DATA / f"vllm-0.32-{name}.txt").read_text()


def test_real_idle_scrape_is_read_field_by_field() -> None:
    m = parse_metrics(_fixture("cpu-idle"), "m")
    buckets = dict(m.ttft_buckets)
    assert (buckets[0.1], buckets[0.25], buckets[7.5], buckets[float("inf")]) == (0, 2, 5, 5)
    assert len(buckets) == 23
    assert dataclasses.replace(m, ttft_buckets=()) == TierMetrics(
        requests_running=0.0,
        requests_waiting=0.0,
        kv_cache_usage=0.0,
        prefix_cache_queries=811.0,
        prefix_cache_hits=512.0,
        preemptions=0.0,
        prompt_tokens=811.0,
        generation_tokens=204.0,
        requests_finished=5.0,
        ttft_sum=7.716903924942017,
        ttft_count=5.0,
        e2e_latency_sum=18.759276866912842,
        e2e_latency_count=5.0,
        sleep_level=0,
        block_size=128,
        kv_blocks=21,
        prefix_caching_enabled=True,
        missing=(),
    )


def test_real_scrape_with_a_request_in_flight() -> None:
    m = parse_metrics(_fixture("cpu-running"))
    assert m.requests_running == 1.0
    assert m.kv_cache_usage == pytest.approx(1 / 21)  # 1 of 21 usable 128-token blocks
    assert m.generation_tokens == 10.0


def test_sleep_level_is_read_from_engine_sleep_state() -> None:
    assert parse_metrics(_fixture("cpu-sleeping")).sleep_level == 1
    assert parse_metrics(_fixture("cpu-fresh")).sleep_level == 0


def test_reset_moves_no_vllm_metric() -> None:
    # Observed: /reset_prefix_cache changes nothing vLLM exports, hence the client's probe.
    assert parse_metrics(_fixture("cpu-after_reset")) == parse_metrics(_fixture("cpu-idle"))


def test_engines_are_summed_and_kv_usage_averaged() -> None:
    m = parse_metrics(_fixture("two-engines"), "m")
    assert m.requests_running == 3.0
    assert m.requests_waiting == 1.0
    assert m.prefix_cache_queries == 911.0
    assert m.prefix_cache_hits == 576.0
    assert m.preemptions == 3.0
    assert m.prompt_tokens == 911.0
    assert m.generation_tokens == 50.0
    assert m.ttft_count == 7.0
    assert m.kv_cache_usage == pytest.approx((1 / 21 + 0.25) / 2)
    assert m.kv_blocks == 2 * 21  # 22 blocks per engine, one of them the null block


def test_kv_blocks_need_a_numeric_num_gpu_blocks() -> None:
    text = _fixture("cpu-idle").replace('num_gpu_blocks="22"', 'num_gpu_blocks="None"')
    assert parse_metrics(text).kv_blocks is None


def test_model_filter_keeps_only_that_models_samples() -> None:
    text = _fixture("two-engines").replace(
        'engine="1",model_name="m"', 'engine="1",model_name="other"'
    )
    mine, other, both = (parse_metrics(text, name) for name in ("m", "other", None))
    assert (mine.requests_running, other.requests_running, both.requests_running) == (1, 2, 3)
    assert (mine.prefix_cache_hits, other.prefix_cache_hits) == (512.0, 64.0)
    assert other.kv_cache_usage == 0.25
    # cache_config_info has no model_name label: kept whatever the filter.
    assert other.block_size == 128


def test_unknown_model_reports_every_model_family_missing() -> None:
    m = parse_metrics(_fixture("cpu-idle"), "not-served")
    assert m.prefix_cache_queries == 0.0
    assert "vllm:prefix_cache_queries_total" in m.missing
    assert "vllm:num_requests_running" in m.missing
    assert "vllm:cache_config_info" not in m.missing


def test_missing_families_read_zero_and_are_named() -> None:
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
    )
    m = parse_metrics(text)
    assert m.requests_running == 2.0
    assert m.prefix_cache_hits == 0.0
    assert m.block_size is None and m.prefix_caching_enabled is None and m.sleep_level is None
    assert m.kv_blocks is None
    assert "vllm:num_requests_running" not in m.missing
    assert {
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:cache_config_info",
        "vllm:engine_sleep_state",
    } <= set(m.missing)


def test_pre_0_10_gpu_names_are_accepted() -> None:
    text = (
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
        'vllm:gpu_prefix_cache_hits_total{model_name="m"} 7\n'
    )
    m = parse_metrics(text)
    assert (m.kv_cache_usage, m.prefix_cache_hits) == (0.5, 7.0)
    assert "vllm:kv_cache_usage_perc" not in m.missing


def test_prefix_caching_off_is_read_from_cache_config_info() -> None:
    text = _fixture("cpu-idle").replace(
        'enable_prefix_caching="True"', 'enable_prefix_caching="False"'
    )
    assert parse_metrics(text).prefix_caching_enabled is False


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("vllm:num_requests_running 1\nvllm:x{engine=0} 1\n", "line 2: 'vllm:x{engine=0} 1'"),
        ("<html><body>Bad Gateway</body></html>\n", "line 1: '<html>"),
        ("vllm:num_requests_running one\n", "line 1"),
    ],
)
def test_malformed_text_names_the_line(text: str, where: str) -> None:
    with pytest.raises(MetricsParseError, match="malformed /metrics text at " + where) as err:
        parse_metrics(text)
    assert "\n" not in str(err.value)


def test_delta_and_hit_rate_between_real_scrapes() -> None:
    fresh, idle = parse_metrics(_fixture("cpu-fresh")), parse_metrics(_fixture("cpu-idle"))
    d = delta(fresh, idle)
    assert not d.restarted
    assert (d.prefix_cache_queries, d.prefix_cache_hits, d.requests_finished) == (811, 512, 5)
    assert d.ttft_mean == pytest.approx(7.716903924942017 / 5)
    assert delta(fresh, idle).hit_rate == pytest.approx(512 / 811)


def test_no_queries_gives_no_hit_rate() -> None:
    idle = parse_metrics(_fixture("cpu-idle"))
    assert delta(idle, parse_metrics(_fixture("cpu-after_reset"))).hit_rate is None
    assert delta(idle, idle).ttft_mean is None


def test_counters_going_down_mean_a_restart() -> None:
    idle = parse_metrics(_fixture("cpu-idle"))
    restarted = TierMetrics(prefix_cache_queries=10.0, prefix_cache_hits=4.0)
    d = delta(idle, restarted)
    assert d.restarted
    assert (d.prefix_cache_queries, d.prefix_cache_hits) == (10.0, 4.0)
    assert delta(idle, restarted).hit_rate == pytest.approx(0.4)


def test_ttft_buckets_are_parsed_and_summed_across_engines() -> None:
    text = (DATA / "vllm-0.32-cpu-running.txt").read_text()
    buckets = parse_metrics(text).ttft_buckets
    bounds = [bound for bound, _ in buckets]
    assert bounds == sorted(bounds) and bounds[-1] == float("inf")
    counts = [count for _, count in buckets]
    assert counts == sorted(counts)  # cumulative


def test_histogram_quantile_interpolates_inside_the_bucket() -> None:
    from backends.metrics import histogram_quantile

    now = ((0.1, 10.0), (0.5, 50.0), (1.0, 100.0), (float("inf"), 100.0))
    assert histogram_quantile(0.5, now) == pytest.approx(0.5)
    assert histogram_quantile(0.9, now) == pytest.approx(0.5 + 0.5 * (90 - 50) / 50)
    before = ((0.1, 10.0), (0.5, 50.0), (1.0, 50.0), (float("inf"), 50.0))
    # Only the 50 observations since `before`: all between 0.5 and 1.0 s.
    assert 0.5 < histogram_quantile(0.1, now, before) < 0.6  # type: ignore[operator]
    assert histogram_quantile(0.9, before, before) is None  # nothing new
    assert histogram_quantile(0.9, before, now) is None  # a counter went back: restart
    everything_slow = ((1.0, 0.0), (float("inf"), 5.0))
    assert histogram_quantile(0.9, everything_slow) == 1.0  # +Inf: the last finite bound
