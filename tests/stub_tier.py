"""A vLLM look-alike stub tier: answers chat and completions, /health, /v1/models, /metrics and
records what it saw (the gateway's unit tests, the fuzz test and benchmarks/bench_fuzz.py)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "stub-model"
WAIT = 10.0  # upper bound for any event a test waits on


class StubDied(Exception):
    """Raised inside the stub's stream to drop the connection mid-answer."""


class StubTier:
    """Mimics vLLM's OpenAI server and records what it saw.

    ``mode`` picks the behaviour of the completion endpoints:
    ``normal``; ``slow`` (a long stream, one chunk every 50 ms); ``die`` (two chunks, then the
    connection drops); ``error_event`` (two chunks, then an error event and ``[DONE]``, as vLLM
    ends a stream whose engine failed); ``unavailable`` (503); ``hang`` (no answer until the
    client leaves);
    ``bad_request`` (400 in vLLM's flat error shape); ``server_error`` (500 in that shape, as
    vLLM answers an exception: ``error_message`` is its text); ``cut`` (two chunks, then the stream
    ends cleanly: no finish_reason, no ``[DONE]``); ``no_done`` (the whole stream but its
    ``[DONE]``); ``huge_event`` (two chunks, then one 64 KiB event with no boundary).
    ``whole_delay``: seconds a whole (non-streamed) answer takes, as vLLM sends nothing until
    it is complete.
    """

    def __init__(self, model: str = MODEL) -> None:
        self.model = model
        self.mode = "normal"
        self.health_status = 200
        self.chunks = 3
        self.whole_delay = 0.0
        self.whole_body: Any = None  # a whole answer's JSON when set (else a chat completion)
        self.metrics_text: str | None = None  # served at /metrics when set (else 404)
        self.answer_text = "The capital of France is Paris."  # chat answers
        self.completion_text = " Paris."  # completions answers
        self.answer_id = "cmpl-stub"  # the id and creation time of its answers
        self.created = 1
        self.error_code = 500  # the code of its error event (mode error_event)
        self.error_message = "engine died"  # the message of its error event, its 500's text
        self.role_chunk = False  # a chat stream opens with a role-only delta, as vLLM's does
        self.stream_texts: list[str] | None = None  # a stream's chunks' texts (else w0, w1, ...)
        self.stream_logprobs: list[float] | None = None  # each chat chunk's token logprob
        self.requests: list[dict[str, Any]] = []
        self.stream_started = threading.Event()
        self.stream_finished = threading.Event()
        self.stream_cancelled = threading.Event()
        self.cancelled_at: float | None = None  # when its stream was cancelled (monotonic)
        self.request_aborted = threading.Event()
        self.url = ""
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._completions, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/health", self._health, methods=["GET"]),
                Route("/metrics", self._metrics, methods=["GET"]),
            ]
        )

    @property
    def last_request(self) -> dict[str, Any]:
        assert self.requests, "the stub received no request"
        return self.requests[-1]

    async def _chat(self, request: Request) -> Response:
        return await self._answer(request, chat=True)

    async def _completions(self, request: Request) -> Response:
        return await self._answer(request, chat=False)

    async def _answer(self, request: Request, chat: bool) -> Response:
        body = await request.json()
        self.requests.append(
            {
                "path": request.url.path,
                "headers": dict(request.headers),
                "body": body,
                "at": time.monotonic(),
            }
        )
        if self.mode == "unavailable":
            return JSONResponse({"error": {"message": "busy"}}, status_code=503)
        if self.mode == "bad_request":
            flat = {"object": "error", "message": "bad max_tokens", "type": "BadRequestError"}
            return JSONResponse({**flat, "param": "max_tokens", "code": 400}, status_code=400)
        if self.mode == "server_error":
            flat = {"object": "error", "message": self.error_message, "type": "InternalError"}
            return JSONResponse({**flat, "param": None, "code": 500}, status_code=500)
        if self.mode == "hang":
            with anyio.move_on_after(WAIT):
                while (await request.receive())["type"] != "http.disconnect":
                    pass
                self.request_aborted.set()
            return JSONResponse({"error": {"message": "too late"}}, status_code=500)
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(self._stream(chat, usage), media_type="text/event-stream")
        await asyncio.sleep(self.whole_delay)
        return JSONResponse(self._whole(chat) if self.whole_body is None else self.whole_body)

    def _whole(self, chat: bool) -> dict[str, Any]:
        usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
        if chat:
            message = {"role": "assistant", "content": self.answer_text}
            choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
            kind = "chat.completion"
        else:
            text = self.completion_text
            choice = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}
            kind = "text_completion"
        return {
            "id": "cmpl-stub",
            "object": kind,
            "created": 1,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }

    def _chunk(self, chat: bool, index: int, last: bool) -> bytes:
        finish = "stop" if last else None
        texts = self.stream_texts
        word = "" if last else (f"w{index} " if texts is None else texts[index])
        if chat:
            delta = {} if last else {"content": word}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            if self.stream_logprobs is not None and not last:
                entry = {"token": word, "logprob": self.stream_logprobs[index]}
                choice["logprobs"] = {"content": [entry]}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": "" if last else word, "finish_reason": finish}
            kind = "text_completion"
        chunk = {"id": self.answer_id, "object": kind, "created": self.created, "model": self.model}
        return f"data: {json.dumps({**chunk, 'choices': [choice]})}\n\n".encode()

    def _role_chunk(self) -> bytes:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        chunk = {"id": self.answer_id, "object": "chat.completion.chunk", "created": self.created}
        return (
            f"data: {json.dumps({**chunk, 'model': self.model, 'choices': [choice]})}\n\n".encode()
        )

    async def _stream(self, chat: bool, usage: bool = False) -> AsyncIterator[bytes]:
        self.stream_started.set()
        count = 400 if self.mode == "slow" else self.chunks
        if self.stream_texts is not None:
            count = len(self.stream_texts)
        try:
            if chat and self.role_chunk:
                yield self._role_chunk()
            for index in range(count):
                if self.mode == "slow":
                    await asyncio.sleep(0.05)
                if self.mode == "die" and index == 2:
                    raise StubDied("stub tier dropped the connection")
                if self.mode == "cut" and index == 2:
                    return
                if self.mode == "huge_event" and index == 2:  # one event that never ends
                    yield b'data: {"choices": [{"index": 0, "delta": {"content": "'
                    for _ in range(64):
                        yield b"x" * 1024
                    return
                if self.mode == "error_event" and index == 2:
                    error = {
                        "message": self.error_message,
                        "type": "Error",
                        "code": self.error_code,
                    }
                    yield f"data: {json.dumps({'error': error})}\n\ndata: [DONE]\n\n".encode()
                    return
                yield self._chunk(chat, index, last=False)
            yield self._chunk(chat, count, last=True)
            if usage:  # as vLLM sends it when asked: no choices, the counts
                tokens = {"prompt_tokens": 5, "completion_tokens": count, "total_tokens": 5 + count}
                event = {
                    "id": self.answer_id,
                    "created": self.created,
                    "choices": [],
                    "usage": tokens,
                }
                yield f"data: {json.dumps(event)}\n\n".encode()
            if self.mode != "no_done":
                yield b"data: [DONE]\n\n"
            self.stream_finished.set()
        except (GeneratorExit, asyncio.CancelledError):
            self.cancelled_at = time.monotonic()
            self.stream_cancelled.set()
            raise

    async def _models(self, request: Request) -> Response:
        entry = {"id": self.model, "object": "model", "created": 1, "owned_by": "vllm"}
        return JSONResponse({"object": "list", "data": [entry]})

    async def _health(self, request: Request) -> Response:
        return Response(status_code=self.health_status)

    async def _metrics(self, request: Request) -> Response:
        if self.metrics_text is None:
            return Response(status_code=404)
        return Response(self.metrics_text, media_type="text/plain")
