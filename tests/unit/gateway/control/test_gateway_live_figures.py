"""Live figures: which answers count, how they are normalised, the window and the summary."""

from __future__ import annotations

import anyio
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.control.live_figures import (
    LOAD_LEVELS,
    Answered,
    LiveFigures,
    Sample,
    bucket,
    median_stat,
    sample_of,
    summarise,
)
from gateway.metrics import GatewayMetrics
from gateway.request.exchange import Exchange
from gateway.shared.state import SharedState
from gateway.telemetry import build_tracer_provider


def _answer(**overrides: object) -> Answered:
    base: dict[str, object] = {
        "tier": "int4", "status": 200, "duration": 1.1, "ttft": 0.2, "sent": 0.1,
        "input_tokens": 100, "output_tokens": 11, "load": 1,
    }  # fmt: skip
    base.update(overrides)
    return Answered(**base)  # type: ignore[arg-type]


def test_a_stream_gives_ttft_and_tpot_from_its_send_to_the_tier() -> None:
    sample = sample_of(_answer(), at=5.0)
    assert sample is not None
    assert sample.ttft == 0.1  # 0.2 from arrival, sent at 0.1
    assert abs((sample.tpot or 0) - 0.09) < 1e-9  # (1.0 - 0.1) / (11 - 1)
    assert sample.whole_per_token is None and sample.at == 5.0


def test_a_whole_answer_counts_per_token_with_its_prefill() -> None:
    sample = sample_of(_answer(ttft=None, output_tokens=4), at=0.0)
    assert sample is not None and sample.ttft is None and sample.tpot is None
    assert sample.whole_per_token == 0.25


def test_one_token_streams_give_ttft_but_no_tpot() -> None:
    sample = sample_of(_answer(output_tokens=1), at=0.0)
    assert sample is not None and sample.tpot is None and sample.ttft is not None


def test_answers_mixing_tiers_or_failing_do_not_count() -> None:
    for bad in (
        {"status": 502},
        {"acquisitions": 2},  # continued on another tier
        {"fallbacks": 1},
        {"output_tokens": 0},
        {"output_tokens": None},
        {"duration": 0.1},  # nothing after its send
    ):
        assert sample_of(_answer(**bad), at=0.0) is None, bad


def test_median_interval_from_order_statistics() -> None:
    assert median_stat([]) is None
    few = median_stat([3.0, 1.0, 2.0])
    assert few is not None and few.median == 2.0 and few.low is None
    stat = median_stat([float(i) for i in range(1, 101)])
    assert stat is not None and stat.median == 50.5
    # ranks 40 and 61 of 100 (n/2 -+ 1.96 sqrt(n)/2, the upper one past the middle)
    assert (stat.low, stat.high) == (40.0, 61.0)


def test_load_levels() -> None:
    assert [bucket(n, LOAD_LEVELS) for n in (1, 2, 4, 5, 40)] == ["1", "2-4", "2-4", "5+", "5+"]


def _sample(ttft: float | None, tpot: float | None, *, load: int = 1, prompt: int = 100,
            endpoint: str | None = None, whole: float | None = None) -> Sample:  # fmt: skip
    return Sample(0.0, endpoint, load, prompt, ttft, tpot, whole)


def test_summary_buckets_ttft_by_prompt_and_tpot_by_load() -> None:
    samples = [_sample(0.1, 0.02) for _ in range(6)] + [_sample(0.9, 0.05, load=6, prompt=4000)]
    samples.append(_sample(None, None, whole=0.03))
    out = summarise(samples)
    assert (out["n"], out["streams"], out["whole"]) == (8, 7, 1)
    assert out["ttft_ms_by_prompt_tokens"]["<=256"]["median_ms"] == 100.0
    assert out["ttft_ms_by_prompt_tokens"][">2048"] == {"n": 1, "median_ms": 900.0}
    assert out["tpot_by_load"]["1"]["tpot_ms"]["interval_ms"] == [20.0, 20.0]
    assert out["tpot_by_load"]["5+"]["tpot_ms"]["median_ms"] == 50.0
    assert "2-4" not in out["tpot_by_load"]
    assert out["whole_ms_per_token"]["median_ms"] == 30.0
    assert "endpoints" not in out  # one endpoint (or none known): no split


def test_summary_splits_a_pool_by_endpoint() -> None:
    out = summarise(
        [_sample(0.1, 0.02, endpoint="http://a"), _sample(0.1, 0.04, endpoint="http://b")]
    )
    assert out["endpoints"]["http://b"] == {"n": 1, "tpot_ms": {"n": 1, "median_ms": 40.0}}


def test_the_window_keeps_the_last_answers_of_the_last_seconds() -> None:
    now = [0.0]
    live = LiveFigures(max_answers=3, window_seconds=10.0, clock=lambda: now[0])
    for t in (0.0, 1.0, 2.0, 3.0):
        now[0] = t
        live.observe(_answer())
    live.observe(_answer(status=500))
    assert live.summary()["int4"]["n"] == 3  # the first fell out of the deque
    now[0] = 11.5  # the samples of 0..1 s are older than 10 s
    assert live.summary()["int4"]["n"] == 2
    now[0] = 100.0
    assert live.summary()["int4"]["n"] == 0


def test_the_exchange_hands_its_answer_to_the_observer() -> None:
    seen: list[Answered] = []
    ticks = iter([0.0, 0.5, 0.7, 2.0, 2.0])  # started, sent, first byte, finish

    async def main() -> None:
        tracer = build_tracer_provider(InMemorySpanExporter()).get_tracer("test")
        shared = SharedState(None)
        await shared.begin("int4")  # another request already on the tier
        exchange = Exchange(tracer, GatewayMetrics(), shared, "/v1/chat/completions",
                            clock=lambda: next(ticks), observer=seen.append)  # fmt: skip
        async with exchange:
            await exchange.acquire("int4")
            exchange.endpoint = "http://a"
            exchange.first_byte()
            exchange.hand_to_stream()
        exchange.input_tokens = 30  # the tier's count, taken as resume.use_tier_count does
        await exchange.stream_ended(200, 5)

    anyio.run(main)
    assert seen == [
        Answered("int4", 200, 2.0, 0.7, 0.5, 30, 5, 2, 1, 0, "http://a"),
    ]
    sample = sample_of(seen[0], 0.0)
    assert sample is not None and abs((sample.ttft or 0) - 0.2) < 1e-9
