"""A stub OpenAI completions server on 127.0.0.1 that streams like vLLM 0.32 (SSE chunks, then
a usage chunk, then ``[DONE]``) and records what it was sent and how many streams overlapped."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.servers import ServerThread

MODEL = "stub-model"


class StubServer:
    """``status``: the completions status; ``gap``: seconds between chunks; ``gateway``: also
    answer /readyz and /metrics like the gateway (``served`` counts per tier)."""

    def __init__(self, gateway: bool = False) -> None:
        self.status = 200
        self.gap = 0.01
        self.gateway = gateway
        self.bodies: list[dict[str, Any]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.served = {"fp16": 0}
        routes = [
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ]
        if gateway:
            routes += [
                Route("/readyz", self._ready, methods=["GET"]),
                Route("/metrics", self._metrics, methods=["GET"]),
            ]
        self.app = Starlette(routes=routes)
        self.url = ""

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _ready(self, request: Request) -> Response:
        return JSONResponse({"ready": True})

    async def _metrics(self, request: Request) -> Response:
        lines = ["# TYPE gateway_requests_total counter"]
        for tier, n in self.served.items():
            lines.append(f'gateway_requests_total{{class="chat",tier="{tier}",status="200"}} {n}')
        return Response("\n".join(lines) + "\n", media_type="text/plain")

    async def _completions(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        if self.status != 200:
            return JSONResponse({"error": {"message": "nope"}}, status_code=self.status)
        tokens = int(body["max_tokens"])
        prompt_tokens = len(str(body["prompt"]).split())

        async def stream() -> AsyncIterator[bytes]:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                for i in range(tokens):
                    await asyncio.sleep(self.gap)
                    chunk = {"choices": [{"index": 0, "text": f" t{i}"}], "usage": None}
                    yield f"data: {json.dumps(chunk)}\n\n".encode()
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens}
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
                yield b"data: [DONE]\n\n"
            finally:
                self.in_flight -= 1
                self.served["fp16"] += 1

        return StreamingResponse(stream(), media_type="text/event-stream")


@pytest.fixture
def stub() -> Iterator[StubServer]:
    server = StubServer()
    thread = ServerThread(server.app)
    thread.start()
    server.url = thread.url
    yield server
    thread.stop()


@pytest.fixture
def stub_gateway() -> Iterator[StubServer]:
    server = StubServer(gateway=True)
    thread = ServerThread(server.app)
    thread.start()
    server.url = thread.url
    yield server
    thread.stop()
