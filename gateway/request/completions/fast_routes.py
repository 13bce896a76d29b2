"""The completion endpoints answered as a pure ASGI app in front of Starlette's router.

``POST /v1/chat/completions`` and ``POST /v1/completions`` are nearly all of a gateway's
traffic, and Starlette's layers between the middleware and an endpoint (its exception
middleware, the router's match over every route, the endpoint wrappers, each wrapping ``send``
again) did nothing for them but cost CPU on every request. ``CompletionRoutes`` calls the same
endpoint functions directly:

- an ``APIError`` becomes the response the app's own handler makes of it
  (gateway/errors.py), as through Starlette;
- any other exception goes on up to Starlette's server-error middleware, which answers 500 in
  OpenAI's shape with the same handler and logs it, as before;
- every other path or method goes on to Starlette's router unchanged (405 for a GET on a
  completion path, 404, the admin routes).

It sits inside the server span and the auth middleware, so both still see every request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import APIError, handle_api_error

Endpoint = Callable[[Request], Awaitable[Response]]


class CompletionRoutes:
    """Pure ASGI middleware: ``POST`` to one of ``endpoints``' paths is answered by its
    endpoint; anything else goes on to ``app``."""

    def __init__(self, app: ASGIApp, endpoints: Mapping[str, Endpoint]) -> None:
        self.app = app
        self.endpoints = dict(endpoints)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = None
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.endpoints.get(scope["path"])
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except APIError as exc:
            response = await handle_api_error(request, exc)
        await response(scope, receive, send)
