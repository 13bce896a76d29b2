"""``create_app(config)``: the gateway's Starlette app, and ``serve`` to run it with uvicorn.

Building the app does no I/O. Its lifespan loads the routing policy and the tokenizer, opens
the one shared ``httpx.AsyncClient`` and the shared state (Redis), scrapes every tier once, then
keeps scraping and watching the policy file in the background until shutdown. Each background
loop runs under ``keep_running``: an exception is logged, counted and the loop starts again, so
no bad value or bug in one of them can end the lifespan (and with it the runtime).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial

import anyio
import httpx
import uvicorn
from opentelemetry.sdk.trace.export import SpanExporter
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from backends.tier_state import TierState
from gateway.admin import admin_routes
from gateway.auth import AuthMiddleware
from gateway.config import GatewayConfig
from gateway.control.live_routes import LiveRoutes
from gateway.control.measurement import Measurement
from gateway.control.reset_marks import apply_shared_marks
from gateway.control.resets import ResetCoordinator
from gateway.control.shadow import ShadowSampler, encoder
from gateway.control.tier_dns import resolve_forever, resolve_pools
from gateway.control.tier_memory import TierMemory, TierPids
from gateway.control.tier_signals import derive_signals
from gateway.control.tier_status import SupervisorStates, TierBoard, scrape_pools
from gateway.errors import exception_handlers
from gateway.health import healthz, readyz
from gateway.measured import tier_figures
from gateway.metrics import GatewayMetrics
from gateway.openapi import openapi_document
from gateway.policy.derive import TierFigures
from gateway.policy.route_changes import RouteChange, first_tiers
from gateway.policy.store import ActivePolicy, PolicyStore
from gateway.request.classify.classes import CompiledClasses
from gateway.request.completions.fast_routes import CompletionRoutes
from gateway.request.completions.models import list_models
from gateway.request.completions.proxy import chat_completions, completions
from gateway.request.tokens.limits import TokenCounter
from gateway.request.tokens.prompt_count import ByteCounter, PromptCounter
from gateway.request.upstream.aiohttp_transport import AiohttpTransport
from gateway.request.upstream.client import Upstream
from gateway.request_log import RequestLog
from gateway.runtime import (
    Admission,
    FixedPolicy,
    PolicySource,
    Runtime,
    default_policy,
    get_runtime,
)
from gateway.server import log_config, server_options
from gateway.serving import serving_state
from gateway.shared.leader import LeaderLock
from gateway.shared.records import SharedRecords
from gateway.shared.state import SharedState
from gateway.telemetry import build_tracer_provider, instrument_asgi, shutdown

logger = logging.getLogger(__name__)
MAX_RESTART_DELAY = 30.0  # seconds: the longest wait before a failing background loop restarts


def create_app(
    config: GatewayConfig,
    supervisor_states: SupervisorStates | None = None,
    *,
    span_exporter: SpanExporter | None = None,
    tier_pids: TierPids | None = None,
) -> Starlette:
    """Build the app (no I/O until its lifespan runs).

    ``supervisor_states`` returns each tier's ``TierState`` as its supervisor sees it; without
    it, tiers are judged by their scrapes alone. ``tier_pids`` returns each tier's root process
    (the supervisor's); without it, loopback tiers are found by port
    (gateway/control/tier_memory.py).
    ``span_exporter`` replaces the ``OTEL_*``-configured exporters (tests pass an in-memory one).
    """
    provider = build_tracer_provider(span_exporter)
    metrics = GatewayMetrics()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        metrics.serving.state = serving_state()
        policies = load_policies(config)
        counter = load_counter(config)
        shared = SharedState(
            config.redis_url,
            prefix=config.redis_prefix,
            flush_delay=config.shared_flush_interval,
        )
        timeout = httpx.Timeout(config.read_timeout, connect=config.connect_timeout)
        transport = upstream_transport(config)
        client = httpx.AsyncClient(timeout=timeout, transport=transport, trust_env=False)
        async with client:  # the one client to the tiers; closing it closes the transport
            await shared.start()
            upstream = Upstream(client, transport, config.max_answer_bytes)
            board = TierBoard(config.tiers, supervisor_states)
            tracer = provider.get_tracer("model_optimizer.gateway")
            runtime = Runtime(
                config=config,
                upstream=upstream,
                policies=policies,
                counter=counter,
                board=board,
                shared=shared,
                metrics=metrics,
                tracer=tracer,
                admission=Admission(config.max_in_flight),
                memory=TierMemory(config.tiers, tier_pids),
                shadow=ShadowSampler(upstream, board, metrics, tracer, encoder(counter)),
                request_log=RequestLog(config.request_log_sample),
            )
            count_route_changes(policies, metrics)
            ttl = policies.active.policy.resets.lock_ttl_seconds
            # A call on the lock may take a tenth of the lease (it renews every third): off the
            # request path, a loaded machine's pause past 0.5 s must not end a reset midway
            # (seen in CI on 2 cores: "lost_lock" after one renewal's read timed out).
            lock = LeaderLock(
                config.redis_url,
                f"{config.redis_prefix}:resets:leader",
                ttl=ttl,
                op_timeout=max(0.5, ttl / 10),
            )
            await lock.start()
            coordinator = ResetCoordinator(runtime, lock)
            # The gateway's own measurements, led through the same lock (one leader).
            measurement = Measurement(runtime, lock) if config.measurement.enabled else None
            with anyio.move_on_after(config.connect_timeout):  # a slow resolver: the loop retries
                await resolve_pools(board)
            await scrape_all(runtime)
            app.state.runtime, app.state.resets = runtime, coordinator
            app.state.measurement = measurement
            try:
                async with anyio.create_task_group() as group:
                    group.start_soon(
                        partial(keep_running, delay=config.metrics_interval),
                        "scrape",
                        partial(scrape_forever, runtime),
                        metrics,
                    )
                    group.start_soon(keep_running, "resets", coordinator.run, metrics)
                    if measurement is not None:
                        group.start_soon(keep_running, "measurement", measurement.run, metrics)
                    group.start_soon(keep_running, "live_routes", LiveRoutes(runtime).run, metrics)
                    if any(tier.dns for tier in config.tiers):
                        pools = partial(resolve_forever, board, config.dns_interval)
                        group.start_soon(keep_running, "dns", pools, metrics)
                    if isinstance(policies, PolicyStore) and config.watch_policy:
                        watch = partial(policies.watch, metrics.policy_reload)
                        group.start_soon(keep_running, "policy_watch", watch, metrics)
                    runtime.shadow.attach(group)  # comparisons end with the lifespan
                    try:
                        yield
                    finally:
                        runtime.shadow.attach(None)
                        group.cancel_scope.cancel()
            finally:
                del app.state.runtime, app.state.resets, app.state.measurement
                await lock.aclose()
                await shared.aclose()
                shutdown(provider)

    def current_shared() -> SharedState | None:
        runtime = getattr(app.state, "runtime", None)
        return runtime.shared if isinstance(runtime, Runtime) else None

    completion_endpoints = {
        "/v1/chat/completions": chat_completions,
        "/v1/completions": completions,
    }
    routes = [
        *(Route(path, call, methods=["POST"]) for path, call in completion_endpoints.items()),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/openapi.json", openapi_endpoint, methods=["GET"]),
        *admin_routes(),
    ]
    middleware = [
        # outermost: rejections are traced too
        Middleware(instrument_asgi, provider=provider, routes=[r.path for r in routes]),
        Middleware(
            AuthMiddleware,
            api_key_hashes=config.api_key_hashes,
            admin_key_hashes=config.admin_key_hashes,
            rate_limit_per_minute=config.rate_limit_per_minute,
            admin_rate_limit_per_minute=config.admin_rate_limit_per_minute,
            shared=current_shared,
            on_reject=metrics.reject,
        ),
        # innermost: the completion paths skip Starlette's router
        # (gateway/request/completions/fast_routes.py)
        Middleware(CompletionRoutes, endpoints=completion_endpoints),
    ]
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers=exception_handlers(),
        lifespan=lifespan,
    )
    app.state.config = config
    return app


def upstream_transport(config: GatewayConfig) -> httpx.AsyncBaseTransport:
    """The transport to the tiers: aiohttp's or httpx's own; no pool cap: admission control
    belongs to the router, not to a hidden pool limit."""
    if config.upstream_transport == "aiohttp":
        return AiohttpTransport(keepalive=5.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=20)
    return httpx.AsyncHTTPTransport(limits=limits, trust_env=False)


def load_policies(config: GatewayConfig) -> PolicySource:
    """The policy file's store (loaded; ``PolicyError`` if bad) or the default fixed policy."""
    names = [tier.name for tier in config.tiers]
    if config.policy_path is None:
        policy = default_policy(names)
        rules = CompiledClasses.build(policy.classes)
        return FixedPolicy(ActivePolicy(policy, rules, "default", 0.0, "<configured order>"))
    store = PolicyStore(
        config.policy_path,
        known_tiers=[*names, *config.policy_extra_tiers],
        measured=measured_figures(config),
        reference=config.reference_tier,
    )
    store.load()
    return store


def count_route_changes(policies: PolicySource, metrics: GatewayMetrics) -> None:
    """The routes' first tiers in the metrics now, and each later route change counted."""
    metrics.routes_changed((), first_tiers(policies.active.policy))
    if isinstance(policies, PolicyStore):
        store = policies

        def changed(changes: Sequence[RouteChange]) -> None:
            metrics.routes_changed([c.cls for c in changes], first_tiers(store.active.policy))

        store.on_change = changed


def measured_figures(config: GatewayConfig) -> dict[str, TierFigures]:
    """The config's measured tiers as the route derivation takes them."""
    return tier_figures(config.measured, {t.name: t.classes for t in config.tiers})


def load_counter(config: GatewayConfig) -> PromptCounter:
    """The model's tokenizer, or the UTF-8 byte bound when none is configured."""
    if config.tokenizer_dir is None:
        return ByteCounter()
    return TokenCounter.from_model_dir(config.tokenizer_dir)


async def scrape_all(runtime: Runtime) -> None:
    """Scrape every endpoint of every tier once (concurrently), apply the marks other replicas
    shared, and log each tier whose state changed."""
    config, board = runtime.config, runtime.board
    before = {name: board.state(name) for name in board.tiers}
    await scrape_pools(
        runtime.upstream, board, board.tiers, config.model_name, config.connect_timeout
    )
    policy = runtime.policies.active.policy
    await apply_shared_marks(runtime.board, SharedRecords(runtime.shared), policy)
    await runtime.memory.sample()
    states = {name: status.state for name, status in runtime.board.statuses().items()}
    for name, state in states.items():
        if state != before[name]:
            log = logger.warning if state == TierState.DOWN else logger.info
            log("tier %s: %s -> %s", name, before[name], state)


async def keep_running(
    name: str,
    loop: Callable[[], Awaitable[None]],
    metrics: GatewayMetrics,
    *,
    delay: float = 1.0,
) -> None:
    """Run a background ``loop`` until cancelled, whatever it raises: each exception is logged
    with its traceback, counted in ``gateway_background_errors_total{loop=name}``, and the loop
    starts again after ``delay`` seconds (doubled after each failure in a row, at most
    ``MAX_RESTART_DELAY``; back to ``delay`` once it has run that long without failing)."""
    wait = delay
    while True:
        started = anyio.current_time()
        try:
            await loop()
            logger.warning("background loop %s returned; starting it again", name)
        except Exception:
            metrics.background_error(name)
            logger.exception("background loop %s failed; starting it again in %.2g s", name, wait)
        if anyio.current_time() - started >= MAX_RESTART_DELAY:
            wait = delay
        await anyio.sleep(wait)
        wait = min(wait * 2, MAX_RESTART_DELAY)


async def scrape_forever(runtime: Runtime) -> None:
    """Scrape every ``metrics_interval`` seconds until cancelled."""
    while True:
        await anyio.sleep(runtime.config.metrics_interval)
        await scrape_all(runtime)


async def metrics_endpoint(request: Request) -> Response:
    """``GET /metrics``: the gateway's Prometheus series (tier gauges refreshed first)."""
    runtime = get_runtime(request)
    in_flight = await runtime.shared.in_flight()
    for name, status in runtime.board.statuses().items():
        runtime.metrics.set_tier(name, in_flight.get(name, 0), status.state == TierState.READY)
    board, memory = runtime.board, runtime.memory
    runtime.metrics.tier_signals.publish(
        {
            name: derive_signals(board.metrics(name), memory.latest(name), memory.peak(name))
            for name in board.tiers
        }
    )
    runtime.metrics.endpoints.publish({name: board.endpoint_statuses(name) for name in board.tiers})
    body, content_type = runtime.metrics.render(request.headers.get("accept"))
    return Response(body, media_type=content_type)


async def openapi_endpoint(request: Request) -> Response:
    """``GET /openapi.json``: the routed endpoints' OpenAPI document."""
    runtime = getattr(request.app.state, "runtime", None)
    policy = runtime.policies.active.policy if runtime else None
    return JSONResponse(
        openapi_document(
            request.app.state.config.model_name,
            policy.limits if policy else None,
            policy.fields if policy else None,
        )
    )


def serve(
    config: GatewayConfig, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info"
) -> None:
    """Run the gateway with uvicorn until interrupted (binds loopback unless told otherwise),
    with the gateway's connection limits (gateway/server.py)."""
    uvicorn.run(
        create_app(config),
        host=host,
        port=port,
        log_level=log_level,
        log_config=log_config(log_level.upper()),
        lifespan="on",
        **server_options(config),
    )
