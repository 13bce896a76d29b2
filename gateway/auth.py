"""API keys and per-key rate limits, as pure ASGI middleware (streaming passes through).

- ``/v1/...``: when ``api_key_hashes`` is set, a request needs ``Authorization: Bearer <key>``
  whose sha256 is one of them (401 ``invalid_api_key`` otherwise; an admin key opens ``/v1``
  only if it is listed as an API key too). A request sending an admin key is told everything
  in errors and route headers (gateway/errors.py).
  With a per-minute rate limit, each key (or each client address when no keys are set) gets
  that many units per 60 s across all replicas (gateway/shared/state.py); over it: 429 with
  ``Retry-After``. A request takes one unit here; a completion that generates several
  sequences (``n``, ``best_of``, list prompts) takes the rest once its body is read, through
  the ``rate_charge`` the middleware leaves in the request's state
  (gateway/request/completions/proxy.py); one costing more than the whole limit is a 400. The
  matched key's digest prefix is left in the request's state (``KEY_ID``) for what counts per key
  (the live guard).
- ``/admin/...``: always needs an admin key (``admin_key_hashes``); none configured means the
  admin API is off (403).
- Failed keys: each client address gets ``admin_rate_limit_per_minute`` requests without a
  valid key per 60 s, one budget for ``/admin`` (any request without the admin key) and
  ``/v1`` (a wrong key sent), across replicas (gateway/key_guesses.py); once spent, both
  answer 429 without looking at the key until the window frees. Requests with a valid key are
  not counted.
- Everything else (``/healthz``, ``/readyz``, ``/metrics``) is open, as probes expect.
Keys are compared as digests in constant time and never logged; the rate limiter sees only a
12-character prefix of the digest. Paths are compared as the router sees them, without the
app's ``root_path``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import DETAIL, FULL_DETAIL, INVALID_REQUEST, APIError, api_error_response
from gateway.key_guesses import GuessBudget
from gateway.shared.state import SharedState

KEY_ID = "key_id"  # the request state's key: the matched API key's digest prefix

RATE_WINDOW = 60.0
KEY_DIGEST = "key_digest"  # the request state's key: the matched API key's sha256 digest


class AuthMiddleware:
    """Checks keys and rate limits before the app sees the request."""

    def __init__(
        self,
        app: ASGIApp,
        api_key_hashes: Sequence[str],
        admin_key_hashes: Sequence[str],
        rate_limit_per_minute: int | None,
        shared: Callable[[], SharedState | None],
        on_reject: Callable[[str], None] | None = None,
        admin_rate_limit_per_minute: int | None = None,
    ) -> None:
        self.app = app
        self.api_keys = tuple(api_key_hashes)
        self.admin_keys = tuple(admin_key_hashes)
        self.rate_limit = rate_limit_per_minute
        self.shared = shared
        self.on_reject = on_reject
        self.guesses = GuessBudget(admin_rate_limit_per_minute, shared)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            await self._check(scope)
        except APIError as exc:
            if self.on_reject is not None:
                self.on_reject(exc.code or "unauthorized")
            await api_error_response(exc)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _check(self, scope: Scope) -> None:
        path = route_path(scope)
        if path == "/admin" or path.startswith("/admin/"):
            if not self.admin_keys:
                raise APIError(
                    403, "the admin API is off: set MO_GATEWAY_ADMIN_KEYS", code="admin_disabled"
                )
            address = client_address(scope)
            self._refuse_if_spent(address)
            if matches(bearer(scope), self.admin_keys):
                return
            # Guessing is what must be bounded: only requests without a valid admin key count
            # (an operator's dashboards and scripts are never counted).
            await self._count_failure(address)
            raise _unauthorized("admin")
        if not (path == "/v1" or path.startswith("/v1/")):
            return
        key = bearer(scope)
        digest = None
        if self.api_keys:
            address = client_address(scope)
            self._refuse_if_spent(address)
            digest = matches(key, self.api_keys)
            if digest is None:
                if key is not None:  # a key sent and wrong is a guess; none sent reveals nothing
                    await self._count_failure(address)
                raise _unauthorized("API")
            state = scope.setdefault("state", {})
            state[KEY_DIGEST] = digest
            state[KEY_ID] = digest[:12]  # who asked (the live guard)
        if self.admin_keys and matches(key, self.admin_keys) is not None:
            scope.setdefault("state", {})[DETAIL] = FULL_DETAIL
        shared = self.shared()
        if self.rate_limit is not None and shared is not None:
            who = f"key:{digest[:12]}" if digest else f"addr:{client_address(scope)}"
            limit = self.rate_limit
            decision = await shared.rate_limit(who, limit, RATE_WINDOW)
            if not decision.allowed:
                raise _rate_limited(limit, decision.retry_after)

            async def charge(more: int) -> None:
                """Take ``more`` units for this request (it generates ``1 + more`` sequences)."""
                if more < 1:
                    return
                if 1 + more > limit:
                    raise APIError(
                        400,
                        f"this request generates {1 + more} sequences (prompts x n or "
                        f"best_of); the rate limit allows {limit} per minute",
                        code="request_costs_more_than_the_rate_limit",
                    )
                decision = await shared.rate_limit(who, limit, RATE_WINDOW, cost=more)
                if not decision.allowed:
                    raise _rate_limited(limit, decision.retry_after)

            scope.setdefault("state", {})["rate_charge"] = charge

    def _refuse_if_spent(self, address: str) -> None:
        """429 without looking at the key while ``address`` has no failed attempt left."""
        wait = self.guesses.refused_for(address)
        if wait is not None:
            raise _too_many_failures(wait)

    async def _count_failure(self, address: str) -> None:
        wait = await self.guesses.failed(address)
        if wait is not None:
            raise _too_many_failures(wait)


def client_address(scope: Scope) -> str:
    client = scope.get("client") or ("unknown", 0)
    return str(client[0])


def route_path(scope: Scope) -> str:
    """The path the router matches: ``scope["path"]`` without the app's ``root_path`` (which
    uvicorn's ``--root-path`` and mounts put in front of it), as Starlette strips it."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and (path == root or path.startswith(root.rstrip("/") + "/")):
        return path[len(root.rstrip("/")) :] or "/"
    return path


def bearer(scope: Scope) -> str | None:
    """The key of ``Authorization: Bearer <key>`` (or ``api-key: <key>``), if any."""
    headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
    for name, value in headers:
        text = value.decode("latin-1").strip()
        if name == b"authorization":
            scheme, _, key = text.partition(" ")
            if scheme.lower() == "bearer" and key.strip():
                return key.strip()
        elif name == b"api-key" and text:
            return text
    return None


def matches(key: str | None, digests: Sequence[str]) -> str | None:
    """The stored digest ``key`` hashes to, compared in constant time; ``None`` if none."""
    if key is None:
        return None
    digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()
    found = None
    for stored in digests:
        if hmac.compare_digest(digest, stored):
            found = stored
    return found


def _rate_limited(limit: int, retry_after: float) -> APIError:
    return _too_many(f"rate limit reached: {limit} requests per minute", retry_after)


def _too_many_failures(retry_after: float) -> APIError:
    return _too_many("too many requests with a wrong or missing key from this address", retry_after)


def _too_many(what: str, retry_after: float) -> APIError:
    """429 ``rate_limit_exceeded`` saying ``what`` and when to retry (whole seconds, >= 1)."""
    wait = max(1, round(retry_after + 0.5))
    return APIError(
        429,
        f"{what}; retry in {wait} s",
        "requests",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(wait)},
    )


def _unauthorized(kind: str) -> APIError:
    return APIError(
        401,
        f"Incorrect or missing {kind} key: send 'Authorization: Bearer <key>'",
        INVALID_REQUEST,
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )
