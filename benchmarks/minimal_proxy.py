"""The least a Python proxy can do, as a benchmark target: the cost of the hop itself.

    python benchmarks/minimal_proxy.py UPSTREAM_URL PORT

One pure ASGI app on the gateway's own server stack (uvicorn, uvloop, httptools, no access log)
that reads a request's body, sends it to ``UPSTREAM_URL`` with the same path through one
aiohttp session, and answers with the upstream's status, content type and body (whole, or
relayed chunk by chunk when streamed). No routing, limits, state, tracing or error handling:
bench_gateway.py runs it beside the gateway so that the latency an extra process and an
extra loopback connection add on the machine (wake-ups included) is measured apart from what
the gateway's own work adds. Not a product: never serve it.
"""

from __future__ import annotations

import sys
from typing import Any

import aiohttp
import uvicorn

UPSTREAM = ""
SESSION: list[aiohttp.ClientSession] = []


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                SESSION.append(aiohttp.ClientSession(auto_decompress=False))
                await send({"type": "lifespan.startup.complete"})
            else:
                await SESSION[0].close()
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    headers = {"content-type": "application/json"}
    url = UPSTREAM + scope["path"]
    async with SESSION[0].request(scope["method"], url, data=body, headers=headers) as answer:
        kind = answer.headers.get("content-type", "application/json").encode()
        start = {"status": answer.status, "headers": [(b"content-type", kind)]}
        await send({"type": "http.response.start", **start})
        async for chunk in answer.content.iter_any():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


if __name__ == "__main__":
    UPSTREAM, port = sys.argv[1].rstrip("/"), int(sys.argv[2])
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )
