"""The completion endpoints through a real gateway and real stub tiers (all on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx
import pytest
from starlette.requests import ClientDisconnect
from starlette.types import Message

from gateway.config import TierEndpoint
from gateway.errors import APIError
from gateway.request.completions.body import (
    MAX_JSON_DEPTH,
    check_model,
    check_shape,
    parse_json_object,
    wants_stream,
)
from gateway.request.completions.proxy import offer_shadow
from gateway.request.stream.relay import UpstreamStreamingResponse
from gateway.request.upstream.client import Opened, Upstream

MODEL = "stub-model"  # what the stub tier serves (conftest.StubTier)
WAIT = 10.0
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Capital of France?"}]}


def assert_error_shape(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str)
    assert "\n" not in body["error"]["message"]
    return dict(body["error"])


def sse_events(lines: Iterator[str]) -> list[str]:
    return [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]


# --- pure helpers -------------------------------------------------------------------------


def test_parse_json_object_rejects_malformed_json_with_position() -> None:
    with pytest.raises(APIError) as caught:
        parse_json_object(b'{"model": ')
    assert caught.value.status == 400
    assert "not valid JSON" in caught.value.message
    assert "line 1 column" in caught.value.message


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"3"])
def test_parse_json_object_rejects_non_objects(raw: bytes) -> None:
    with pytest.raises(APIError) as caught:
        parse_json_object(raw)
    assert caught.value.status == 400
    assert "must be a JSON object" in caught.value.message


def test_parse_json_object_rejects_undecodable_bytes() -> None:
    with pytest.raises(APIError) as caught:
        parse_json_object(b"\xff\xfe\xfa")
    assert caught.value.status == 400


@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"a": ' * 100_000])
def test_parse_json_object_refuses_nesting_too_deep_for_the_decoder(raw: bytes) -> None:
    with pytest.raises(APIError) as caught:  # RecursionError escaped: a 500
        parse_json_object(raw)
    assert caught.value.status == 400
    assert "nested too deeply" in caught.value.message


def test_parse_json_object_refuses_valid_json_nested_past_the_limit() -> None:
    # Valid, but deep enough to make later encoders and walkers recurse: refused up front.
    raw = b'{"model": "m", "x": ' + b'{"a": ' * 200 + b"1" + b"}" * 200 + b"}"
    with pytest.raises(APIError) as caught:
        parse_json_object(raw)
    assert caught.value.status == 400
    assert f"more than {MAX_JSON_DEPTH} levels" in caught.value.message
    shallow = b'{"x": ' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}"
    assert "x" in parse_json_object(shallow)


def nested_deeper_than(raw: bytes, limit: int) -> bool:
    """Whether ``check_shape`` finds ``raw`` nested deeper than ``limit`` levels."""
    try:
        check_shape(raw, limit, len(raw) + 2)  # more values than any body holds: depth only
    except APIError:
        return True
    return False


def test_nesting_is_measured_outside_strings_only() -> None:
    deep = b"[" * 65 + b"]" * 65
    assert nested_deeper_than(deep, 64) and not nested_deeper_than(deep, 65)
    brackets_in_text = json.dumps({"prompt": "[" * 500 + '\\"{' * 100, "n": [[1]] * 500})
    assert not nested_deeper_than(brackets_in_text.encode(), 64)
    assert json.loads(brackets_in_text)  # the strings held escapes and brackets, the body is flat


def test_check_model_defaults_missing_model_and_rejects_others() -> None:
    assert check_model({"prompt": "x"}, MODEL) == {"prompt": "x", "model": MODEL}
    assert check_model({"model": MODEL}, MODEL) == {"model": MODEL}
    with pytest.raises(APIError) as caught:
        check_model({"model": "gpt-4"}, MODEL)
    assert (caught.value.status, caught.value.code, caught.value.param) == (
        404,
        "model_not_found",
        "model",
    )
    with pytest.raises(APIError) as caught:
        check_model({"model": 7}, MODEL)
    assert caught.value.status == 400


def test_wants_stream_only_for_true() -> None:
    assert wants_stream({"stream": True})
    assert not wants_stream({"stream": "yes"})
    assert not wants_stream({})


# --- relay --------------------------------------------------------------------------------


def test_relays_non_streaming_chat(stub: Any, start_gateway: Any, client: httpx.Client) -> None:
    gateway = start_gateway(stub.url)
    response = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert response.headers["x-route-tier"] == "t0"
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == "The capital of France is Paris."
    assert stub.last_request["path"] == "/v1/chat/completions"
    assert stub.last_request["body"] == CHAT


def test_missing_model_is_filled_in(stub: Any, start_gateway: Any, client: httpx.Client) -> None:
    gateway = start_gateway(stub.url)
    response = client.post(f"{gateway}/v1/completions", json={"prompt": "The capital is"})
    assert response.status_code == 200
    assert response.json()["object"] == "text_completion"
    assert stub.last_request["body"] == {"prompt": "The capital is", "model": MODEL}


def test_relays_stream_chunk_by_chunk(stub: Any, start_gateway: Any, client: httpx.Client) -> None:
    stub.chunks = 5
    gateway = start_gateway(stub.url)
    with client.stream(
        "POST", f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-route-tier"] == "t0"
        events = sse_events(response.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert len(chunks) == 6
    assert [c["choices"][0]["delta"].get("content") for c in chunks[:5]] == [
        f"w{i} " for i in range(5)
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_stream_is_not_buffered(stub: Any, start_gateway: Any, client: httpx.Client) -> None:
    stub.mode = "slow"  # 400 chunks, 50 ms apart: 20 s in total
    gateway = start_gateway(stub.url)
    started = time.monotonic()
    with client.stream(
        "POST", f"{gateway}/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True}
    ) as response:
        first = next(line for line in response.iter_lines() if line.startswith("data: "))
        assert json.loads(first.removeprefix("data: "))["choices"][0]["text"] == "w0 "
        assert not stub.stream_finished.is_set()
    assert time.monotonic() - started < 5


def test_relays_upstream_client_error_in_openai_shape(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    stub.mode = "bad_request"  # vLLM's flat error body
    gateway = start_gateway(stub.url)
    response = client.post(f"{gateway}/v1/chat/completions", json={**CHAT, "max_tokens": 5})
    error = assert_error_shape(response, 400)  # the tier's text is its own (errors.detail)
    assert error["message"] == "the model server rejected the request"
    assert error["param"] == "max_tokens" and error["code"] == "upstream_rejected"
    assert response.headers["x-route-tier"] == "t0"


def test_authorization_is_not_forwarded_but_tracing_is(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(stub.url)
    headers = {
        "authorization": "Bearer secret",
        "cookie": "a=b",
        "x-request-id": "req-1",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    }
    response = client.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 200
    seen = stub.last_request["headers"]
    assert "authorization" not in seen
    assert "cookie" not in seen
    assert "x-request-id" not in seen  # vLLM would take it as its request id
    # The tier sees the client's trace, continued by the gateway's own upstream span.
    version, trace_id, parent, flags = seen["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", "0af7651916cd43dd8448eb211c80319c", "01")
    assert parent != "b7ad6b7169203331"


# --- request errors -----------------------------------------------------------------------


def test_malformed_json_is_400(stub: Any, start_gateway: Any, client: httpx.Client) -> None:
    gateway = start_gateway(stub.url)
    response = client.post(
        f"{gateway}/v1/chat/completions",
        content=b'{"model": "stub-model", ',
        headers={"content-type": "application/json"},
    )
    error = assert_error_shape(response, 400)
    assert error["type"] == "invalid_request_error"
    assert "not valid JSON" in error["message"]
    assert stub.requests == []


def test_a_body_of_brackets_is_400_not_500(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(stub.url)
    response = client.post(
        f"{gateway}/v1/chat/completions",
        content=b"[" * 100_000,
        headers={"content-type": "application/json"},
    )
    error = assert_error_shape(response, 400)
    assert "nested too deeply" in error["message"]
    assert stub.requests == []


def test_non_object_json_is_400(stub: Any, start_gateway: Any, client: httpx.Client) -> None:
    gateway = start_gateway(stub.url)
    response = client.post(f"{gateway}/v1/completions", json=["not", "an", "object"])
    error = assert_error_shape(response, 400)
    assert "JSON object" in error["message"]


def test_declared_body_over_limit_is_413(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(stub.url, max_body_bytes=1000)
    response = client.post(f"{gateway}/v1/completions", json={"model": MODEL, "prompt": "x" * 2000})
    error = assert_error_shape(response, 413)
    assert "1000 bytes" in error["message"]
    assert stub.requests == []


def test_chunked_body_over_limit_is_413(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(stub.url, max_body_bytes=1000)

    def body() -> Iterator[bytes]:  # no content-length: the limit applies while reading
        yield b'{"model": "stub-model", "prompt": "'
        yield b"x" * 2000
        yield b'"}'

    response = client.post(f"{gateway}/v1/completions", content=body())
    assert_error_shape(response, 413)
    assert stub.requests == []


def test_body_at_limit_is_accepted(stub: Any, start_gateway: Any, client: httpx.Client) -> None:
    payload = json.dumps({"model": MODEL, "prompt": "x"}).encode()
    gateway = start_gateway(stub.url, max_body_bytes=len(payload))
    response = client.post(
        f"{gateway}/v1/completions", content=payload, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200


def test_unknown_model_is_404(stub: Any, start_gateway: Any, client: httpx.Client) -> None:
    gateway = start_gateway(stub.url)
    response = client.post(f"{gateway}/v1/chat/completions", json={**CHAT, "model": "gpt-4"})
    error = assert_error_shape(response, 404)
    assert error["code"] == "model_not_found"
    assert error["param"] == "model"
    assert "gpt-4" in error["message"]
    assert stub.requests == []


# --- failover -----------------------------------------------------------------------------


def test_unreachable_first_tier_falls_over_to_second(
    refused_url: str, stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(refused_url, stub.url)
    response = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert response.headers["x-route-tier"] == "t1"
    with client.stream(
        "POST", f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}
    ) as streamed:
        assert streamed.headers["x-route-tier"] == "t1"
        assert sse_events(streamed.iter_lines())[-1] == "[DONE]"


def test_tier_answering_503_falls_over_to_next(
    make_stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    busy, healthy = make_stub(), make_stub()
    busy.mode = "unavailable"
    gateway = start_gateway(busy.url, healthy.url)
    response = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert response.headers["x-route-tier"] == "t1"
    assert len(busy.requests) == 1
    assert len(healthy.requests) == 1


def test_all_tiers_unreachable_is_503_promptly(
    refused_url: str, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(refused_url, refused_url)
    started = time.monotonic()
    response = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert time.monotonic() - started < 2
    error = assert_error_shape(response, 503)
    assert error["code"] == "no_tier_available"
    # Which tier was down is the operators' to know (errors.detail: test_gateway_errors.py).
    assert error["message"] == "no model server can take this request now; retry shortly"
    assert response.headers["retry-after"] == "5"


def test_timeout_is_504_and_not_retried(
    make_stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    slow, spare = make_stub(), make_stub()
    slow.mode = "hang"
    gateway = start_gateway(slow.url, spare.url, read_timeout=0.5)
    response = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    error = assert_error_shape(response, 504)
    assert error["code"] == "upstream_timeout"
    assert spare.requests == []  # the request reached a tier: never sent twice
    assert slow.request_aborted.wait(WAIT)


# --- disconnects and broken streams ---------------------------------------------------------


def test_client_disconnect_mid_stream_cancels_upstream(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    stub.mode = "slow"
    gateway = start_gateway(stub.url)
    with client.stream(
        "POST", f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}
    ) as response:
        assert next(response.iter_lines()).startswith("data: ")
        assert stub.stream_started.is_set()
    # Leaving the block closes the connection to the gateway mid-stream.
    assert stub.stream_cancelled.wait(WAIT), "the stub tier kept streaming"
    assert not stub.stream_finished.is_set()


def test_client_disconnect_during_non_streaming_request_closes_upstream(
    stub: Any, start_gateway: Any
) -> None:
    stub.mode = "hang"
    gateway = start_gateway(stub.url)
    impatient = httpx.Client(trust_env=False, timeout=0.5)  # gives up, closing the connection
    with impatient, pytest.raises(httpx.ReadTimeout):
        impatient.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert stub.request_aborted.wait(WAIT), "the gateway kept the upstream request open"


def test_upstream_dying_mid_stream_ends_with_sse_error(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    stub.mode = "die"
    gateway = start_gateway(stub.url)
    with client.stream(
        "POST", f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}
    ) as response:
        assert response.status_code == 200
        events = sse_events(response.iter_lines())
    assert events[-1] == "[DONE]"
    assert [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:2]] == [
        "w0 ",
        "w1 ",
    ]
    error = json.loads(events[2])["error"]
    assert error["code"] == "upstream_error"
    assert error["message"] == "the model server failed"  # the tier's name stays inside
    assert len(events) == 4  # two chunks, the error, [DONE]: never a second answer


class RecordingStream(httpx.AsyncByteStream):
    """An endless upstream SSE body that records whether it was closed."""

    def __init__(self) -> None:
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for index in range(1000):
            yield f"data: {index}\n\n".encode()
            await anyio.sleep(0)

    async def aclose(self) -> None:
        self.closed = True


async def _relay_until(scope: dict[str, Any], fail_on_send: int | None) -> RecordingStream:
    stream = RecordingStream()
    request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    upstream_response = httpx.Response(200, stream=stream, request=request)
    tier = TierEndpoint(name="t0", base_url="http://127.0.0.1:9")
    async with httpx.AsyncClient(trust_env=False) as http:
        relay = UpstreamStreamingResponse(Opened(Upstream(http), tier, upstream_response))
        sent: list[Message] = []
        first_chunk_sent = anyio.Event()

        async def send(message: Message) -> None:
            sent.append(message)
            if len(sent) == 2:
                first_chunk_sent.set()
            if fail_on_send is not None and len(sent) == fail_on_send:
                raise OSError("client went away")

        async def receive() -> Message:
            await first_chunk_sent.wait()
            if fail_on_send is not None:
                await anyio.sleep_forever()
            return {"type": "http.disconnect"}

        if fail_on_send is None:
            await relay(scope, receive, send)
        else:
            with pytest.raises(ClientDisconnect):
                await relay(scope, receive, send)
        # `relay` still references its generator here, so only an explicit close counts.
        assert sent[0]["headers"]
        return stream


def test_streaming_response_closes_upstream_when_a_send_fails() -> None:
    scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
    assert asyncio.run(_relay_until(scope, fail_on_send=3)).closed


def test_streaming_response_closes_upstream_on_disconnect_message() -> None:
    scope = {"type": "http", "asgi": {"spec_version": "2.3"}}
    assert asyncio.run(_relay_until(scope, fail_on_send=None)).closed


def test_a_stream_silent_past_the_policy_timeout_is_given_up_for_the_next(
    make_stub: Any, start_gateway: Any, client: httpx.Client, two_tier_policy: Any
) -> None:
    slow, spare = make_stub(), make_stub()
    slow.mode = "hang"  # never scheduled: no response headers
    policy = two_tier_policy(timeouts="{first_byte_seconds: 0.5}")
    gateway = start_gateway(slow.url, spare.url, policy_path=policy, watch_policy=False)
    started = time.monotonic()
    with client.stream(
        "POST", f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}
    ) as response:
        assert response.status_code == 200
        assert response.headers["x-route-tier"] == "t1"
        assert sse_events(response.iter_lines())[-1] == "[DONE]"
    assert time.monotonic() - started < 5
    assert slow.request_aborted.wait(WAIT)  # the silent tier's request was closed
    metrics = client.get(f"{gateway}/metrics").text
    assert 'gateway_upstream_fallbacks_total{reason="timeout",tier="t0"} 1.0' in metrics


def test_an_unknown_model_name_is_shown_on_one_line() -> None:
    with pytest.raises(APIError) as caught:
        check_model({"model": "evil\nname" + "x" * 300}, MODEL)
    assert "\n" not in caught.value.message
    assert "evil\\nname" in caught.value.message
    assert len(caught.value.message) < 200


def test_past_max_in_flight_new_requests_are_shed_with_retry_after(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    stub.mode = "slow"
    gateway = start_gateway(stub.url, max_in_flight=1)
    with client.stream(
        "POST", f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}
    ) as held:
        lines = held.iter_lines()
        assert next(lines).startswith("data: ")
        shed = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
        error = assert_error_shape(shed, 503)
        assert error["code"] == "overloaded"
        assert shed.headers["retry-after"] == "1"
    stub.mode = "normal"
    deadline = time.monotonic() + WAIT
    while (answer := client.post(f"{gateway}/v1/chat/completions", json=CHAT)).status_code != 200:
        assert time.monotonic() < deadline, answer.text  # the slot comes back once it ends
        time.sleep(0.05)
    metrics = client.get(f"{gateway}/metrics").text
    assert 'gateway_rejections_total{reason="overloaded"}' in metrics


def _trickle(gateway: str, body_sent: bytes, declared: int) -> socket.socket:
    """A raw connection that sends a request's headers and part of its body, then waits."""
    host, port = gateway.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=WAIT)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {declared}\r\n\r\n".encode()
        + body_sent
    )
    return sock


def _read_all(sock: socket.socket) -> bytes:
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_a_slow_body_holds_no_admission_slot_and_is_cut_off_at_its_deadline(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    # The slot was taken before the body was read, and nothing timed the read out: a few
    # trickling connections denied every completion, without credentials when no keys are set.
    gateway = start_gateway(stub.url, max_in_flight=1, body_timeout=1.0)
    sock = _trickle(gateway, b'{"messages": ', declared=1000)
    with sock:
        time.sleep(0.2)  # the gateway is reading that body now
        started = time.monotonic()
        assert client.post(f"{gateway}/v1/chat/completions", json=CHAT).status_code == 200
        answer = _read_all(sock)  # the server closes the connection after its answer
        waited = time.monotonic() - started
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    assert b"connection: close" in head.lower()
    assert json.loads(payload)["error"]["code"] == "request_timeout"
    assert waited < 3


def test_a_whole_answer_longer_than_the_first_byte_timeout_is_not_generated_twice(
    make_stub: Any, start_gateway: Any, client: httpx.Client, two_tier_policy: Any
) -> None:
    # vLLM sends a whole answer's headers only once it is complete: first_byte_seconds gave up
    # on every long non-streamed answer and had the next tier generate it again.
    first, spare = make_stub(), make_stub()
    first.whole_delay = 1.0
    policy = two_tier_policy(timeouts="{first_byte_seconds: 0.3}")
    gateway = start_gateway(first.url, spare.url, policy_path=policy, watch_policy=False)
    response = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert response.status_code == 200, response.text
    assert response.headers["x-route-tier"] == "t0"
    assert len(first.requests) == 1 and spare.requests == []


def test_a_shadow_sample_that_cannot_start_costs_the_answer_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The sampler raising (its task group closed at shutdown) is logged; the caller, about to
    send the tier's answer, goes on."""
    from types import SimpleNamespace

    def closed(*args: object) -> str:
        raise RuntimeError("this task group is not active")

    runtime = SimpleNamespace(
        policies=SimpleNamespace(active=SimpleNamespace(policy=SimpleNamespace(shadow=None))),
        shadow=SimpleNamespace(offer=closed),
        admission=SimpleNamespace(current=1, limit=8),
    )
    job = SimpleNamespace(tier="int4")
    offer_shadow(runtime, job)  # type: ignore[arg-type]
    assert "shadow sampling could not take a int4 answer" in caplog.text
