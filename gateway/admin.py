"""Operators' endpoints under ``/admin`` (the admin key is checked by gateway/auth.py).

- ``GET /admin/policy``: the serving policy, its digest and load time, and the last rejected
  edit's error (a bad edit never replaces a good policy).
- ``POST /admin/policy/reload``: read the policy file now (off the event loop); answers the
  outcome.
- ``GET /admin/routes``: each class's route now, how it came to be (derived, as written,
  pinned and what the measurements say of the pin), the derivation's reasons, its last change
  and why; each tier's calibration figures beside its live figures; the route change history
  (gateway/policy/routes_view.py); with the gateway's own measurements on, when and by which
  replica the figures were measured, per endpoint (gateway/control/measurement.py).
- ``GET /admin/tiers``: each tier's state, last scrape, load and in-flight count (all replicas).
- ``GET /admin/resets``: the reset schedule, the leader, the reset under way and the history.
- ``POST /admin/resets/{tier}``: reset a tier now (queued for the leading replica; the safety
  rules still hold: one tier at a time, never the last ready tier of a class; a refused one
  is asked again for a while, then recorded as ``refused``: gateway/control/resets.py).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.control.measurement import describe
from gateway.control.resets import ResetCoordinator
from gateway.errors import APIError
from gateway.measured import tier_figures
from gateway.policy.routes_view import routes_document
from gateway.policy.store import PolicyStore
from gateway.runtime import get_runtime


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
    outcome = await store.reload_in_thread()
    get_runtime(request).metrics.policy_reload(outcome)
    return JSONResponse({"outcome": outcome, **store.status()})


async def routes(request: Request) -> Response:
    runtime = get_runtime(request)
    config, active = runtime.config, runtime.policies.active
    store = runtime.policies if isinstance(runtime.policies, PolicyStore) else None
    if store is not None:
        figures, reference = store.measured, store.reference
    else:  # no policy file: the configured order, the figures only shown
        admitted = {t.name: t.classes for t in config.tiers}
        figures, reference = tier_figures(config.measured, admitted), config.reference_tier
    document = routes_document(
        active.policy,
        active.derived,
        figures,
        reference,
        store.history if store is not None else None,
        runtime.live.summary(),
        runtime.live.describe_window(),
    )
    measured = describe(getattr(request.app.state, "measurement", None))
    return JSONResponse(document | ({"measurement": measured} if measured is not None else {}))


async def tiers(request: Request) -> Response:
    runtime = get_runtime(request)
    in_flight = await runtime.shared.in_flight()
    described = runtime.board.describe()
    for name, entry in described.items():
        entry["in_flight"] = in_flight.get(name, 0)
    return JSONResponse({"shared_state": runtime.shared.shared, "tiers": described})


def _coordinator(request: Request) -> ResetCoordinator:
    coordinator = getattr(request.app.state, "resets", None)
    if not isinstance(coordinator, ResetCoordinator):
        raise RuntimeError("app.state.resets is not set: the gateway lifespan has not run")
    return coordinator


async def resets(request: Request) -> Response:
    return JSONResponse(await _coordinator(request).describe())


async def reset_now(request: Request) -> Response:
    tier = request.path_params["tier"]
    known = get_runtime(request).board.tiers
    if tier not in known:
        raise APIError(
            404, f"unknown tier {tier!r} (this gateway has {', '.join(known)})", code="unknown_tier"
        )
    await _coordinator(request).request(tier)
    return JSONResponse({"queued": tier}, status_code=202)


async def restore_tier(request: Request) -> Response:
    """Put a tier the live guard withheld back in its classes (after a fresh in-engine check:
    ``model-optimizer check --serving``)."""
    runtime = get_runtime(request)
    tier = request.path_params["tier"]
    if tier not in runtime.board.tiers:
        raise APIError(
            404,
            f"unknown tier {tier!r} (this gateway has {', '.join(runtime.board.tiers)})",
            code="unknown_tier",
        )
    return JSONResponse({"tier": tier, "restored": runtime.board.guard.restore(tier)})


def admin_routes() -> list[Route]:
    return [
        Route("/admin/policy", policy_status, methods=["GET"]),
        Route("/admin/policy/reload", policy_reload, methods=["POST"]),
        Route("/admin/routes", routes, methods=["GET"]),
        Route("/admin/tiers", tiers, methods=["GET"]),
        Route("/admin/tiers/{tier}/restore", restore_tier, methods=["POST"]),
        Route("/admin/resets", resets, methods=["GET"]),
        Route("/admin/resets/{tier}", reset_now, methods=["POST"]),
    ]
