"""``GET /v1/models``: the served model's entry, asked of the first ready tier that answers."""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from backends.tier_state import TierState
from gateway.errors import SERVER_ERROR, APIError
from gateway.request.completions.proxy import TIER_HEADER, note_detail, saturation_limits
from gateway.request.route.chain import NO_SERVER
from gateway.request.upstream.client import aclose_quietly
from gateway.runtime import get_runtime


async def list_models(request: Request) -> Response:
    """``GET /v1/models``: the served model's entry, from the first ready tier that answers."""
    runtime = get_runtime(request)
    note_detail(request, runtime)
    model_name = runtime.config.model_name
    board = runtime.board
    limits = saturation_limits(runtime.policies.active.policy)
    ready = [s.name for s in board.statuses().values() if s.state == TierState.READY]
    failures: list[str] = []
    for name in ready:
        chain = board.endpoint_chain(name, None, limits)
        if not chain:
            continue
        tier = chain[0]
        try:
            response = await runtime.upstream.send(tier, "GET", "/v1/models", None, request.headers)
        except APIError as exc:
            failures.append(f"{name}: {exc.code}")
            continue
        raw = await runtime.upstream.read(tier, response)
        if response.status_code != 200:
            await aclose_quietly(response)
            failures.append(f"{name}: HTTP {response.status_code}")
            continue
        return _models_answer(name, raw, model_name)
    raise APIError(
        503,
        f"no tier is available ({', '.join(failures) or 'none is ready'}); retry shortly",
        SERVER_ERROR,
        code="no_tier_available",
        headers={"Retry-After": "5"},
        public=NO_SERVER,
    )


def _models_answer(tier: str, raw: bytes, model_name: str) -> Response:
    try:
        payload = json.loads(raw)
        listed = [entry for entry in payload["data"] if isinstance(entry, dict)]
    except (ValueError, KeyError, TypeError) as exc:
        raise APIError(
            502,
            f"tier '{tier}' sent a malformed /v1/models answer",
            SERVER_ERROR,
            code="upstream_error",
            public="the model server sent a malformed model list",
        ) from exc
    served = [entry for entry in listed if entry.get("id") == model_name]
    if not served:
        ids = ", ".join(str(entry.get("id")) for entry in listed) or "nothing"
        raise APIError(
            502,
            f"tier '{tier}' does not serve model '{model_name}' (it lists {ids})",
            SERVER_ERROR,
            code="model_mismatch",
            public=f"the model server does not serve model '{model_name}'",
        )
    return JSONResponse({"object": "list", "data": served}, headers={TIER_HEADER: tier})
