"""Exchange bookkeeping under cancellation, and SSECounter's reading of a relayed stream."""

from __future__ import annotations

import anyio
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.metrics import GatewayMetrics
from gateway.request.exchange import Exchange, SSECounter, usage_tokens
from gateway.shared.state import SharedState
from gateway.telemetry import build_tracer_provider


class SlowShared(SharedState):
    """Local state whose begin/end wait like a slow Redis round trip after counting."""

    def __init__(self) -> None:
        super().__init__(None)
        self.ended: list[str] = []

    async def begin(self, tier: str) -> None:
        self._local.inflight[tier] = self._local.inflight.get(tier, 0) + 1
        await anyio.sleep(0.2)

    async def end(self, tier: str) -> None:
        self._local.inflight[tier] = max(0, self._local.inflight.get(tier, 0) - 1)
        await anyio.sleep(0.2)
        self.ended.append(tier)


def _exchange() -> tuple[Exchange, SlowShared, InMemorySpanExporter, GatewayMetrics]:
    exporter = InMemorySpanExporter()
    tracer = build_tracer_provider(exporter).get_tracer("test")
    shared, metrics = SlowShared(), GatewayMetrics()
    return (
        Exchange(metrics, shared, tracer.start_span("gateway.request")),
        shared,
        exporter,
        metrics,
    )


def test_a_slot_taken_while_cancelled_is_still_released() -> None:
    exchange, shared, _, _ = _exchange()

    async def main() -> None:
        with anyio.move_on_after(0.05):  # the client leaves during begin's round trip
            await exchange.acquire("int4")
        assert await shared.in_flight() == {"int4": 1}
        await exchange.finish(499)
        assert await shared.in_flight() == {"int4": 0}

    anyio.run(main)


def test_finish_inside_a_cancelled_scope_completes() -> None:
    exchange, shared, exporter, metrics = _exchange()

    async def main() -> None:
        await exchange.acquire("fp16")
        with anyio.CancelScope() as scope:
            scope.cancel()  # as when the client's disconnect cancels the exchange task
            await exchange.finish(200)

    anyio.run(main)
    assert shared.ended == ["fp16"]
    assert [span.name for span in exporter.get_finished_spans()] == ["gateway.request"]
    rendered = metrics.render(None)[0].decode()
    assert 'gateway_requests_total{class="none",status="200",tier="fp16"} 1.0' in rendered


def test_finish_happens_once() -> None:
    exchange, shared, exporter, _ = _exchange()

    async def main() -> None:
        await exchange.acquire("int8")
        await exchange.finish(200)
        await exchange.finish(500, "internal_error")

    anyio.run(main)
    assert shared.ended == ["int8"]
    assert len(exporter.get_finished_spans()) == 1


def test_sse_counter_reads_usage_or_counts_events_and_knows_the_outcome() -> None:
    counter = SSECounter()
    assert counter.status == 499  # nothing finished it yet: the client left
    counter.feed(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: {"choi')
    counter.feed(b'ces":[{"delta":{"content":"b"}}]}\n\ndata: {"choices":[{"delta":{}}]}\n\n')
    assert counter.tokens == 2  # three choice events, the last one empty
    counter.feed(b'data: {"choices":[],"usage":{"completion_tokens":7}}\n\ndata: [DONE]\n\n')
    assert counter.tokens == 7
    counter.completed = True
    assert counter.status == 200
    counter.failure = 502
    assert counter.status == 502


def test_usage_tokens_of_a_whole_answer() -> None:
    assert usage_tokens(b'{"usage": {"prompt_tokens": 5, "completion_tokens": 9}}') == (5, 9)
    assert usage_tokens(b"not json") == (None, None)
    assert usage_tokens(b'{"usage": null}') == (None, None)
