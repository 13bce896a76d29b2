"""The load generator: streamed ``/v1/completions`` requests at a fixed concurrency (async httpx).

Each request asks for exactly ``output_len`` tokens (``ignore_eos``, ``max_tokens``), greedy,
streamed with ``stream_options.include_usage`` so the token counts are the server's own. Times
are taken as chunks arrive, the way ``vllm bench serve`` takes them: TTFT at the first chunk
carrying a choice, one inter-token gap per later such chunk, end-to-end at the last one.

Results land in a ``Recorder`` as requests finish, so a caller interrupted mid-level (Ctrl-C)
still holds every finished request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from gateway.request.events.chunk import read_chunk
from gateway.request.events.sse import aread_payloads
from measure.serving_stats import RequestResult

ERROR_CHARS = 300


@dataclass(frozen=True)
class Prompt:
    text: str
    tokens: int  # its length by the model's tokenizer


@dataclass
class Recorder:
    """Finished requests by the index they were sent in; the level's start and end."""

    results: dict[int, RequestResult] = field(default_factory=dict)
    started: float = 0.0
    ended: float = 0.0

    def ordered(self) -> list[RequestResult]:
        return [self.results[i] for i in sorted(self.results)]

    def duration(self) -> float:
        end = self.ended or time.perf_counter()
        return max(end - self.started, 1e-9)


def request_body(model: str, prompt: str, output_len: int) -> dict[str, object]:
    """The completions request: exactly ``output_len`` greedy tokens, streamed with usage."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def one_request(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    prompt: Prompt,
    output_len: int,
    headers: dict[str, str] | None = None,
) -> RequestResult:
    """Send one request to ``url`` (a base URL) and time its stream; never raises for HTTP or
    connection errors (they become a failed result), only for cancellation."""
    body = request_body(model, prompt.text, output_len)
    start = time.perf_counter()
    first: float | None = None
    last = start
    gaps: list[float] = []
    chunks_with_text = 0
    usage: dict[str, object] = {}
    try:
        async with client.stream(
            "POST", f"{url}/v1/completions", json=body, headers=headers
        ) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                error = f"HTTP {response.status_code}: {' '.join(text.split())}"
                return RequestResult(start, False, prompt.tokens, error=error[:ERROR_CHARS])
            async for data in aread_payloads(response.aiter_bytes()):
                chunk = read_chunk(data, chat=False)
                if chunk.done:
                    break
                if chunk.problem is not None:
                    raise ValueError(f"a chunk that is {chunk.problem}: {data[:80]!r}")
                now = time.perf_counter()
                if chunk.choices:
                    if first is None:
                        first = now
                    else:
                        gaps.append(now - last)
                    last = now
                    if chunk.choices[0].text:
                        chunks_with_text += 1
                if chunk.usage is not None:
                    usage = dict(chunk.usage)
    except (httpx.HTTPError, ValueError) as exc:
        error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        return RequestResult(start, False, prompt.tokens, error=error[:ERROR_CHARS])
    if first is None:
        return RequestResult(start, False, prompt.tokens, error="no chunk with a choice")
    prompt_tokens = usage.get("prompt_tokens")
    output_tokens = usage.get("completion_tokens")
    return RequestResult(
        start_time=start,
        success=True,
        prompt_len=prompt_tokens if isinstance(prompt_tokens, int) else prompt.tokens,
        output_tokens=output_tokens if isinstance(output_tokens, int) else chunks_with_text,
        ttft=first - start,
        itl=tuple(gaps),
        latency=last - start,
    )


async def run_level(
    url: str,
    model: str,
    prompts: Sequence[Prompt],
    output_len: int,
    concurrency: int,
    recorder: Recorder,
    on_done: Callable[[RequestResult], None] = lambda _: None,
    headers: dict[str, str] | None = None,
    timeout: float = 900.0,
) -> None:
    """Send every prompt once, at most ``concurrency`` in flight (no pacing between sends, as
    ``vllm bench serve --max-concurrency`` with an infinite request rate)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout, trust_env=False, limits=limits) as client:

        async def send(index: int, prompt: Prompt) -> None:
            async with gate:
                result = await one_request(client, url, model, prompt, output_len, headers)
            recorder.results[index] = result
            on_done(result)

        recorder.started = time.perf_counter()
        await asyncio.gather(*(send(i, p) for i, p in enumerate(prompts)))
        recorder.ended = time.perf_counter()


async def warm_up(
    url: str,
    model: str,
    prompt: Prompt,
    output_len: int,
    count: int,
    headers: dict[str, str] | None = None,
) -> None:
    """``count`` requests whose results are dropped (first-call costs stay out of the run)."""
    async with httpx.AsyncClient(timeout=900.0, trust_env=False) as client:
        for _ in range(count):
            await one_request(client, url, model, prompt, output_len, headers)
