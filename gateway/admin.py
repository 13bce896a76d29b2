"""Operators' endpoints under ``/admin`` (the admin key is checked by gateway/auth.py).

- ``GET /admin/policy``: the serving policy, its digest and load time, and the last rejected
  edit's error (a bad edit never replaces a good policy).
- ``POST /admin/policy/reload``: read the policy file now; answers the outcome.
- ``GET /admin/tiers``: each tier's state, last scrape, load and in-flight count (all replicas).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.errors import APIError
from gateway.policy_store import PolicyStore
from gateway.state import get_runtime


def _store(request: Request) -> PolicyStore:
    policies = get_runtime(request).policies
    if not isinstance(policies, PolicyStore):
        raise APIError(
            404, "this gateway has no policy file (it routes in configured order)", code="no_policy"
        )
    return policies


async def policy_status(request: Request) -> Response:
    return JSONResponse(_store(request).status())


async def policy_reload(request: Request) -> Response:
    store = _store(request)
    outcome = store.reload()
    get_runtime(request).metrics.policy_reload(outcome)
    return JSONResponse({"outcome": outcome, **store.status()})


async def tiers(request: Request) -> Response:
    runtime = get_runtime(request)
    in_flight = await runtime.shared.in_flight()
    described = runtime.board.describe()
    for name, entry in described.items():
        entry["in_flight"] = in_flight.get(name, 0)
    return JSONResponse({"shared_state": runtime.shared.shared, "tiers": described})


def admin_routes() -> list[Route]:
    return [
        Route("/admin/policy", policy_status, methods=["GET"]),
        Route("/admin/policy/reload", policy_reload, methods=["POST"]),
        Route("/admin/tiers", tiers, methods=["GET"]),
    ]
