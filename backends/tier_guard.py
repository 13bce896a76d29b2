"""A key on every route of a vLLM tier that vLLM's own ``--api-key`` leaves open.

Loaded into each tier's server with ``--middleware backends.tier_guard.TierGuard`` (vLLM adds
it with ``app.add_middleware``); it runs inside the serve environment, so it uses the standard
library only.

Why: vLLM 0.32's key (``--api-key`` / ``VLLM_API_KEY``: ``AuthenticationMiddleware`` in
vllm/entrypoints/serve/middleware/authenticate.py) guards only paths starting with ``/v1``,
``/v2``, ``/inference`` and ``/cohere``. With ``VLLM_SERVER_DEV_MODE=1``, which the tiers need
for ``/reset_prefix_cache``, the same server also serves ``/collective_rpc``, ``/sleep``,
``/wake_up``, ``/server_info``, ``/reset_mm_cache``, ``/pause``, ``/resume``,
``/abort_requests``, ``/update_weights``, ``/init_weight_transfer_engine`` ... at the root,
and ``/start_profile``, ``/tokenize`` and friends without it: no vLLM key covers any of them.

What holds with the guard: every route the server has needs ``Authorization: Bearer
<MO_TIER_API_KEY>`` (the tier's environment, never its command line) except ``/health``,
``/metrics``, ``/version``, ``/tokenize``, ``/detokenize`` (read-only; the admission check and
``eval`` tokenize on the tiers) and the OpenAI API under ``/v1/`` (which vLLM's own key guards
when ``VLLM_API_KEY`` is set, as in compose.yaml); a wrong or missing key answers 401. With no
key configured those routes answer 401 to everyone (fail closed). A path no route matches goes
on to vLLM, which answers 404 as before (so a tier still looks like a tier, not a gateway, to
``bench``'s ``/readyz`` probe).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

KEY_ENV = "MO_TIER_API_KEY"
OPEN_PATHS = frozenset({"/health", "/metrics", "/metrics/", "/version", "/tokenize", "/detokenize"})
OPEN_PREFIX = "/v1/"  # the OpenAI API: vLLM's own key (VLLM_API_KEY) covers it

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def is_open(path: str) -> bool:
    """Whether ``path`` is served without the guard's key."""
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIX)


def served(scope: Scope) -> bool:
    """Whether the app behind the guard (``scope["app"]``, the vLLM FastAPI app) has a route
    for this request, whatever its method; True whenever that cannot be told (fail closed)."""
    routes = getattr(scope.get("app"), "routes", None)
    if routes is None:
        return True
    for route in routes:
        try:
            match, _ = route.matches(scope)
        except Exception:  # a route that cannot say: treat it as a match
            return True
        if getattr(match, "value", 1):  # starlette's Match: NONE 0, PARTIAL 1, FULL 2
            return True
    return False


class TierGuard:
    """Pure ASGI middleware: the bearer key on every path ``is_open`` does not name."""

    def __init__(self, app: ASGIApp, key: str | None = None) -> None:
        self.app = app
        key = key if key is not None else os.environ.get(KEY_ENV, "")
        self._digest = hashlib.sha256(key.encode("utf-8")).digest() if key else None

    def _allowed(self, scope: Scope) -> bool:
        if self._digest is None:
            return False
        for name, value in scope.get("headers", []):
            if name.lower() == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer":
                    digest = hashlib.sha256(token.strip().encode("utf-8")).digest()
                    return hmac.compare_digest(digest, self._digest)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = str(scope["path"]).removeprefix(str(scope.get("root_path", "")))
        if is_open(path) or not served(scope) or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": "Unauthorized"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
