"""Exchange bookkeeping under cancellation, and SSECounter's reading of a relayed stream."""

from __future__ import annotations

import anyio
import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.config import TierEndpoint
from gateway.errors import APIError
from gateway.metrics import GatewayMetrics
from gateway.request.events.sse_counter import SSECounter
from gateway.request.exchange import Exchange
from gateway.request.stream.relay import Reply, whole_response
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
    exchange = Exchange(tracer, metrics, shared, "/v1/chat/completions")
    return exchange, shared, exporter, metrics


def test_a_slot_taken_while_cancelled_is_still_released() -> None:
    exchange, shared, _, _ = _exchange()

    async def main() -> None:
        async with exchange:
            with anyio.move_on_after(0.05):  # the client leaves during begin's round trip
                await exchange.acquire("int4")
            assert await shared.in_flight() == {"int4": 1}
            exchange.set_outcome(499)
        assert await shared.in_flight() == {"int4": 0}

    anyio.run(main)


def test_finish_inside_a_cancelled_scope_completes() -> None:
    exchange, shared, exporter, metrics = _exchange()

    async def main() -> None:
        await exchange.acquire("fp16")
        with anyio.CancelScope() as scope:
            scope.cancel()  # as when the client's disconnect cancels the exchange task
            async with exchange:
                exchange.set_outcome(200)

    anyio.run(main)
    assert shared.ended == ["fp16"]
    assert [span.name for span in exporter.get_finished_spans()] == ["gateway.request"]
    rendered = metrics.render(None)[0].decode()
    assert 'gateway_requests_total{class="none",status="200",tier="fp16"} 1.0' in rendered


def test_finish_happens_once() -> None:
    exchange, shared, exporter, _ = _exchange()

    async def main() -> None:
        async with exchange:
            await exchange.acquire("int8")
            exchange.set_outcome(200)
        await exchange.stream_ended(500, 3)

    anyio.run(main)
    assert shared.ended == ["int8"]
    assert len(exporter.get_finished_spans()) == 1


def test_an_exception_leaving_the_block_is_the_outcome() -> None:
    exchange, _, exporter, metrics = _exchange()
    other, _, _, _ = _exchange()

    async def main() -> None:
        with pytest.raises(APIError):
            async with exchange:
                raise APIError(429, "slow down", code="rate_limited")
        with pytest.raises(RuntimeError):
            async with other:
                other.set_outcome(200)  # an answer was on its way, then something broke
                raise RuntimeError("boom")

    anyio.run(main)
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None and span.attributes["http.response.status_code"] == 429
    assert other.finished and (other.status, other.error) == (500, "internal_error")
    assert 'gateway_rejections_total{reason="rate_limited"} 1.0' in metrics.render(None)[0].decode()


def test_a_stream_it_was_handed_to_finishes_it_with_its_children() -> None:
    exchange, shared, exporter, metrics = _exchange()

    async def main() -> None:
        async with exchange:
            upstream = exchange.child("upstream")
            await exchange.acquire("int4")
            exchange.hand_to_stream()
        assert not exchange.finished and await shared.in_flight() == {"int4": 1}
        assert upstream.is_recording()
        with anyio.CancelScope() as scope:
            scope.cancel()  # the client left mid-stream
            await exchange.stream_ended(499, 7)

    anyio.run(main)
    assert shared.ended == ["int4"]
    child, request = exporter.get_finished_spans()  # the child ends first
    assert (child.name, request.name) == ("upstream", "gateway.request")
    assert child.parent is not None and child.parent.span_id == request.context.span_id
    assert child.attributes is not None and child.attributes["gateway.route.tier"] == "int4"
    assert request.attributes is not None and request.attributes["gen_ai.usage.output_tokens"] == 7
    rendered = metrics.render(None)[0].decode()
    assert 'gateway_requests_total{class="none",status="499",tier="int4"} 1.0' in rendered


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


@pytest.mark.parametrize("send_fails", [False, True], ids=["sent", "send failed"])
def test_a_whole_answer_finishes_its_exchange_once_sent(send_fails: bool) -> None:
    """Handed to a whole answer, the exchange is still open while the answer's bytes go out
    and finished (span ended, request counted, slot released) right after, however the
    sending ended; its ``async with`` block leaves it open."""
    exchange, shared, exporter, metrics = _exchange()
    tier = TierEndpoint(name="fp16", base_url="http://127.0.0.1:9")
    seen_while_sending: list[bool] = []

    async def send(message: dict[str, object]) -> None:
        seen_while_sending.append(exchange.finished)
        if send_fails and message["type"] == "http.response.body":
            raise OSError("client went away")

    async def receive() -> dict[str, object]:
        return {"type": "http.disconnect"}

    async def main() -> None:
        await exchange.acquire("fp16")
        async with exchange:
            exchange.set_outcome(200)
            upstream = httpx.Response(200, headers={"content-type": "application/json"})
            reply = Reply({"x-route-tier": "fp16"}, exchange, True)
            answer = whole_response(tier, upstream, b'{"ok":1}', reply)
        assert not exchange.finished  # the block left it to the answer
        scope = {"type": "http", "asgi": {"spec_version": "2.3"}}
        if send_fails:
            with pytest.raises(OSError):
                await answer(scope, receive, send)
        else:
            await answer(scope, receive, send)

    anyio.run(main)
    assert seen_while_sending and not any(seen_while_sending)
    assert exchange.finished and shared.ended == ["fp16"]
    assert [s.name for s in exporter.get_finished_spans()] == ["gateway.request"]
    text = metrics.render(None)[0].decode()
    assert 'gateway_requests_total{class="none",status="200",tier="fp16"} 1.0' in text


def test_the_slot_is_released_even_when_the_bookkeeping_fails() -> None:
    exchange, shared, _, metrics = _exchange()

    def broken(*args: object) -> None:
        raise RuntimeError("a metrics bug")

    metrics.observe_request = broken  # type: ignore[method-assign]

    async def main() -> None:
        await exchange.acquire("int4")
        with pytest.raises(RuntimeError, match="a metrics bug"):
            async with exchange:
                exchange.set_outcome(200)
        assert await shared.in_flight() == {"int4": 0}

    anyio.run(main)


def test_a_server_span_handed_over_is_annotated_and_left_to_its_owner() -> None:
    """The exchange writes the route onto the server span it is handed and does not end it
    (the server span's middleware does); its children are still its own. The HTTP status the
    server span recorded stays; the outcome of a stream that failed after its 200 is beside it."""
    exporter = InMemorySpanExporter()
    tracer = build_tracer_provider(exporter).get_tracer("test")
    server = tracer.start_span("POST /v1/chat/completions")
    server.set_attribute("http.response.status_code", 200)
    shared, metrics = SlowShared(), GatewayMetrics()
    exchange = Exchange(tracer, metrics, shared, "/v1/chat/completions", span=server)
    assert not exchange.owns_span and exchange.span is server

    async def main() -> None:
        async with exchange:
            exchange.child("upstream")
            exchange.cls = "code"
            await exchange.acquire("fp16")
            exchange.hand_to_stream()
        await exchange.stream_ended(502, 3)

    anyio.run(main)
    assert exchange.finished and server.is_recording()  # not ended by the exchange
    assert [s.name for s in exporter.get_finished_spans()] == ["upstream"]
    server.end()
    child, request = exporter.get_finished_spans()
    assert child.parent is not None and child.parent.span_id == request.context.span_id
    attributes = dict(request.attributes or {})
    assert attributes["gateway.route.class"] == "code"
    assert attributes["gateway.route.tier"] == "fp16"
    assert attributes["http.response.status_code"] == 200
    assert attributes["gateway.response.status_code"] == 502
    assert request.status.status_code.name == "ERROR"


def test_a_prompt_planned_on_its_bound_is_counted_exactly_when_the_exchange_finishes() -> None:
    """The plan took a bound for the prompt (gateway/request/tokens/prompt_bound.py): the span and
    the metrics get the exact count, taken once, after the answer."""
    exchange, _, exporter, metrics = _exchange()
    counted: list[int] = []

    def count() -> int:
        counted.append(12)
        return 12

    async def main() -> None:
        async with exchange:
            exchange.cls, exchange.tier, exchange.input_tokens = "tolerant", "int4", 60  # a bound
            exchange.count_input = count
            assert counted == []  # not on the request's path
            await exchange.stream_ended(200, 3)
            await exchange.stream_ended(200, 3)  # finishing twice counts once

    anyio.run(main)
    assert counted == [12]
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None and span.attributes["gen_ai.usage.input_tokens"] == 12
    text = metrics.render(None)[0].decode()
    assert 'gateway_tokens_total{class="tolerant",direction="input",tier="int4"} 12.0' in text


def test_a_failing_late_count_leaves_the_request_recorded_without_its_tokens() -> None:
    exchange, _, exporter, metrics = _exchange()

    def count() -> int:
        raise TypeError("TextInputSequence must be str")  # what the tokenizer says

    async def main() -> None:
        async with exchange:
            exchange.cls, exchange.tier, exchange.input_tokens = "tolerant", "int4", 60
            exchange.count_input = count
            await exchange.stream_ended(200, 3)

    anyio.run(main)
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None and "gen_ai.usage.input_tokens" not in span.attributes
    text = metrics.render(None)[0].decode()
    assert 'gateway_requests_total{class="tolerant",status="200",tier="int4"} 1.0' in text
