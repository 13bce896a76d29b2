"""loadgen against a stub SSE server on 127.0.0.1."""

import asyncio

import httpx

from backends.process import free_port
from measure.loadgen import Prompt, Recorder, one_request, run_level
from measure.serving_stats import RequestResult
from tests.unit.measure.conftest import MODEL, StubServer


async def _one(url: str, output_len: int = 4) -> RequestResult:
    async with httpx.AsyncClient(trust_env=False) as client:
        return await one_request(client, url, MODEL, Prompt("a b c", 3), output_len)


def test_one_request_times_the_stream_and_takes_the_server_counts(stub: StubServer) -> None:
    stub.gap = 0.02
    result = asyncio.run(_one(stub.url, 4))
    assert result.success, result.error
    assert result.prompt_len == 3 and result.output_tokens == 4
    assert len(result.itl) == 3
    assert result.ttft >= 0.02
    assert result.latency >= result.ttft + sum(result.itl) - 1e-6
    body = stub.bodies[0]
    assert body["ignore_eos"] is True and body["max_tokens"] == 4 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_http_error_is_a_failed_result(stub: StubServer) -> None:
    stub.status = 400
    result = asyncio.run(_one(stub.url))
    assert not result.success
    assert result.error.startswith("HTTP 400")


def test_connection_refused_is_a_failed_result() -> None:
    result = asyncio.run(_one(f"http://127.0.0.1:{free_port()}"))
    assert not result.success
    assert "ConnectError" in result.error


def test_run_level_keeps_to_the_concurrency(stub: StubServer) -> None:
    stub.gap = 0.02
    recorder = Recorder()
    done: list[object] = []
    prompts = [Prompt(f"p{i} x", 2) for i in range(6)]
    asyncio.run(run_level(stub.url, MODEL, prompts, 3, 2, recorder, done.append))
    assert len(recorder.ordered()) == 6 and len(done) == 6
    assert all(r.success for r in recorder.ordered())
    assert stub.most_in_flight == 2
    assert recorder.duration() > 0
