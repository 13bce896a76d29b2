"""What the gateway knows about each tier: its state and its last scraped load.

``TierBoard`` merges two sources into the router's ``TierStatus`` values:
- the supervisor's ``TierState`` (backends/tier_state.py) when the gateway runs beside it
  (``supervisor_states``), or a reset's ``draining``/``resetting`` mark (``set_state``);
- the tier's own ``/metrics`` (vLLM's Prometheus text, parsed by backends/metrics.py; a
  llama-server's by backends/llama_metrics.py): queue
  depth and KV-cache usage for saturation, scraped every ``metrics_interval`` seconds. A tier
  without ``/metrics`` is probed at ``/health``; a tier that answers neither is ``down``.

A tier is a pool of endpoints (gateway/config.py): each endpoint is scraped and judged on its
own, and the tier is ready when any endpoint is (its load: its least loaded ready endpoint's).
``scrape_tier`` does the I/O for one endpoint; ``TierBoard.record`` and ``statuses`` are pure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import anyio

from backends.llama_metrics import parse_llama_metrics
from backends.metrics import (
    KV_CACHE_USAGE,
    PREEMPTIONS,
    MetricsParseError,
    TierMetrics,
    parse_metrics,
)
from backends.tier_state import TierState
from common.class_categories import CLASS_NAMES
from gateway.config import TierEndpoint
from gateway.control.live_guard import LiveGuard
from gateway.errors import APIError
from gateway.request.route.endpoint_choice import (
    EndpointStatus,
    Saturation,
    choose_endpoints,
    endpoint_id,
    load_key,
    saturated,
)
from gateway.request.route.router import TierStatus
from gateway.request.upstream.client import Upstream, aclose_quietly

# Each tier's state as its supervisor sees it (backends/supervisor.py ``Supervisor.states``).
SupervisorStates = Callable[[], Mapping[str, TierState]]
Marks = Mapping[str, TierState]  # a reset's marks of whole tiers
EndpointMarks = Mapping[tuple[str, str], TierState]  # and of endpoints: (tier, url) -> state


@dataclass(frozen=True)
class Scrape:
    """One look at a tier: did it answer, and its metrics when it has them."""

    healthy: bool
    metrics: TierMetrics | None
    at: float
    error: str | None = None


class TierBoard:
    """The latest known status of each configured tier and of each endpoint of its pool.

    A tier's pool starts as its configured endpoints (``TierEndpoint.pool``); a ``dns`` tier's
    is replaced by ``set_pool`` each time its name is resolved (gateway/control/tier_dns.py).
    Scrapes and endpoint marks are kept per (tier, endpoint URL); an endpoint that leaves the
    pool takes them along.
    """

    def __init__(
        self,
        tiers: Sequence[TierEndpoint],
        supervisor_states: SupervisorStates | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tiers = {tier.name: tier for tier in tiers}
        self._pools = {tier.name: tier.pool() for tier in tiers}
        self._supervisor_states = supervisor_states
        self._clock = clock
        self._scrapes: dict[tuple[str, str], Scrape] = {}
        self._marks: dict[str, TierState] = {}  # the reset coordinator's, e.g. draining
        self._endpoint_marks: dict[tuple[str, str], TierState] = {}
        # Counts mark changes: a read of the shared marks that began before a change is older
        # than the board (gateway/control/reset_marks.py drops it).
        self.marks_version = 0
        self.marks_refused: str | None = None  # why and which shared marks were refused last
        self._endpoints: dict[tuple[str, str], TierEndpoint] = {}  # endpoint()'s, made once
        self.guard = LiveGuard()  # classes shadow comparisons withheld from a tier
        # The gateway's own admission verdicts (gateway/control/measurement.py) over the
        # configured ``classes``: tier -> admitted classes (None: every class).
        self._admitted: dict[str, frozenset[str] | None] = {}
        self._turns: dict[str, int] = {}  # per tier, requests ordered: whose turn a tie is

    # ------------------------------------------------------------------ pools

    def pool(self, name: str) -> list[str]:
        """The endpoint URLs of tier ``name`` now."""
        return list(self._pools[name])

    def set_pool(self, name: str, urls: Sequence[str]) -> bool:
        """Replace a tier's endpoints (what its DNS name resolves to now); what the board knew
        of an endpoint that left is dropped. Returns whether the pool changed."""
        urls = list(dict.fromkeys(urls))
        if urls == self._pools[name]:
            return False
        self._pools[name] = urls
        kept = set(urls)
        for key in [k for k in self._scrapes if k[0] == name and k[1] not in kept]:
            del self._scrapes[key]
        for key in [k for k in self._endpoint_marks if k[0] == name and k[1] not in kept]:
            del self._endpoint_marks[key]
        for key in [k for k in self._endpoints if k[0] == name and k[1] not in kept]:
            del self._endpoints[key]
        return True

    def endpoint(self, name: str, url: str) -> TierEndpoint:
        """The tier as one of its endpoints sees it (what ``Upstream.send`` takes); made once
        per endpoint (a frozen model: every request of the endpoint shares it)."""
        found = self._endpoints.get((name, url))
        if found is None:
            found = self.tiers[name].model_copy(update={"base_url": url})
            if url in self._pools[name]:  # one that left its pool is not remembered
                self._endpoints[(name, url)] = found
        return found

    # ------------------------------------------------------------------ what is known

    def record(self, name: str, scrape: Scrape, endpoint: str | None = None) -> None:
        """One scrape of ``endpoint`` of tier ``name`` (None: the tier's ``base_url``)."""
        url = endpoint if endpoint is not None else self.tiers[name].base_url
        if url in self._pools[name]:
            self._scrapes[(name, url)] = scrape

    def set_state(self, name: str, state: TierState | None) -> None:
        """Override a tier's state (``draining``, ``resetting``); ``None`` lifts it."""
        self.marks_version += 1
        if state is None:
            self._marks.pop(name, None)
        else:
            self._marks[name] = state

    def set_endpoint_state(self, name: str, url: str, state: TierState | None) -> None:
        """Override one endpoint's state (a reset rolling through a pool); ``None`` lifts it."""
        self.marks_version += 1
        if state is None:
            self._endpoint_marks.pop((name, url), None)
        elif url in self._pools[name]:
            self._endpoint_marks[(name, url)] = state

    def endpoint_state(self, name: str, url: str) -> TierState:
        """A tier mark wins, then the endpoint's mark, then a supervisor state other than
        ready, then the endpoint's last scrape (never scraped: ready)."""
        return self._endpoint_state(name, url, self._marks, self._endpoint_marks)

    def state(self, name: str) -> TierState:
        """Ready when any endpoint is; else the first endpoint's state (down: no endpoint)."""
        return self._state(name, self._marks, self._endpoint_marks)

    def states_under(self, marks: Marks, endpoint_marks: EndpointMarks) -> dict[str, TierState]:
        """Each tier's state were the board's marks exactly these (the board is left alone)."""
        return {name: self._state(name, marks, endpoint_marks) for name in self.tiers}

    def _state(self, name: str, marks: Marks, endpoint_marks: EndpointMarks) -> TierState:
        if name in marks:
            return marks[name]
        states = [
            self._endpoint_state(name, url, marks, endpoint_marks) for url in self._pools[name]
        ]
        if TierState.READY in states:
            return TierState.READY
        return states[0] if states else TierState.DOWN

    def _endpoint_state(
        self, name: str, url: str, marks: Marks, endpoint_marks: EndpointMarks
    ) -> TierState:
        if name in marks:
            return marks[name]
        if (name, url) in endpoint_marks:
            return endpoint_marks[(name, url)]
        if self._supervisor_states is not None:
            supervised = self._supervisor_states().get(name, TierState.DOWN)
            if supervised != TierState.READY:
                return supervised
        scrape = self._scrapes.get((name, url))
        return TierState.READY if scrape is None or scrape.healthy else TierState.DOWN

    def endpoint_statuses(self, name: str) -> list[EndpointStatus]:
        """Each endpoint of tier ``name`` with its state and last scraped load."""
        out = []
        for url in self._pools[name]:
            scrape = self._scrapes.get((name, url))
            metrics = scrape.metrics if scrape is not None else None
            out.append(
                EndpointStatus(
                    url,
                    self.endpoint_state(name, url),
                    metrics.requests_waiting if metrics else 0.0,
                    metrics.kv_cache_usage if metrics else 0.0,
                    metrics.requests_running if metrics else 0.0,
                )
            )
        return out

    def endpoint_chain(
        self, name: str, session: str | None, limits: Saturation
    ) -> list[TierEndpoint]:
        """The endpoints of tier ``name`` to try for a request, in order
        (gateway/request/route/endpoint_choice.py)."""
        turn = self._turns[name] = self._turns.get(name, -1) + 1
        choice = choose_endpoints(self.endpoint_statuses(name), session, limits, turn)
        return [self.endpoint(name, url) for url in choice.order]

    def metrics(self, name: str) -> TierMetrics | None:
        """The last scraped metrics of the tier's first endpoint that has some (``None``: none
        yet); a pool's tier-wide signals are its first endpoint's."""
        for url in self._pools[name]:
            scrape = self._scrapes.get((name, url))
            if scrape is not None and scrape.metrics is not None:
                return scrape.metrics
        return None

    def statuses(self, limits: Saturation | None = None) -> dict[str, TierStatus]:
        """Every configured tier's ``TierStatus``, in configuration order. A pool's load is
        that of its least loaded ready endpoint (with ``limits``: the least loaded one that is
        not saturated, if any), so a tier is saturated only when all its endpoints are."""
        out: dict[str, TierStatus] = {}
        for name, tier in self.tiers.items():
            ready = [e for e in self.endpoint_statuses(name) if e.state == TierState.READY]
            if limits is not None:
                ready = [e for e in ready if not saturated(e, limits)] or ready
            best = min(ready, key=load_key) if ready else None
            out[name] = TierStatus(
                name=name,
                state=self.state(name),
                requests_waiting=best.requests_waiting if best else 0.0,
                kv_usage=best.kv_usage if best else 0.0,
                max_model_len=tier.max_model_len,
                classes=self.classes(name),
            )
        return out

    def classes(self, name: str) -> frozenset[str] | None:
        """The classes tier ``name`` may serve (``None``: all): what the admission check
        admitted, less what the live guard withholds."""
        admitted = self._admitted.get(name, self.tiers[name].classes)
        withheld = self.guard.classes_withheld(name)
        if not withheld:
            return frozenset(admitted) if admitted is not None else None
        return frozenset(admitted if admitted is not None else CLASS_NAMES) - withheld

    def set_admitted(self, name: str, classes: frozenset[str] | None) -> None:
        """The classes the latest admission check let tier ``name`` serve (None: all)."""
        if name in self.tiers:
            self._admitted[name] = classes

    def describe(self) -> dict[str, dict[str, object]]:
        """For ``/admin/tiers``: state, last scrape and load of each tier (a tier's figures
        are its first endpoint's) and of each endpoint of its pool."""
        out: dict[str, dict[str, object]] = {}
        for name, tier in self.tiers.items():
            endpoints = [self._describe_endpoint(name, url) for url in self._pools[name]]
            first: dict[str, object] = endpoints[0] if endpoints else {}
            out[name] = {
                "state": self.state(name),
                "base_url": tier.base_url,
                "dns": tier.dns,
                "max_model_len": tier.max_model_len,
                "classes": tier.classes,
                "withheld": sorted(self.guard.classes_withheld(name)),
                "admission": tier.admission,
                **{key: first.get(key) for key in _LOAD_FIELDS},
                "endpoints": endpoints,
            }
        return out

    def _describe_endpoint(self, name: str, url: str) -> dict[str, object]:
        now = self._clock()
        scrape = self._scrapes.get((name, url))
        metrics = scrape.metrics if scrape is not None else None
        return {
            "url": url,
            "id": endpoint_id(url),
            "state": self.endpoint_state(name, url),
            "scraped_seconds_ago": round(now - scrape.at, 1) if scrape else None,
            "scrape_error": scrape.error if scrape else None,
            "requests_running": metrics.requests_running if metrics else None,
            "requests_waiting": metrics.requests_waiting if metrics else None,
            # None where the engine has no such figure (llama.cpp: no KV pool, no preemption)
            "kv_cache_usage": _known(metrics, "kv_cache_usage", KV_CACHE_USAGE[0]),
            "preemptions": _known(metrics, "preemptions", PREEMPTIONS[0]),
        }


def _known(metrics: TierMetrics | None, field: str, family: str) -> float | None:
    if metrics is None or family in metrics.missing:
        return None
    return float(getattr(metrics, field))


_LOAD_FIELDS = (
    "scraped_seconds_ago",
    "scrape_error",
    "requests_running",
    "requests_waiting",
    "kv_cache_usage",
    "preemptions",
)


async def scrape_pools(
    upstream: Upstream,
    board: TierBoard,
    names: Iterable[str],
    model_name: str,
    timeout: float,
) -> None:
    """Scrape every endpoint of the tiers ``names`` once, concurrently, and record what was
    seen on ``board``."""
    now = anyio.current_time()

    async def one(name: str, url: str) -> None:
        scrape = await scrape_tier(upstream, board.endpoint(name, url), model_name, timeout, now)
        board.record(name, scrape, url)

    async with anyio.create_task_group() as group:
        for name in names:
            for url in board.pool(name):  # every endpoint of the tier's pool
                group.start_soon(one, name, url)


async def scrape_tier(
    upstream: Upstream, tier: TierEndpoint, model_name: str, timeout: float, now: float
) -> Scrape:
    """``/metrics`` of one tier, falling back to ``/health``; never raises."""
    error: str | None = None
    answer = await _get(upstream, tier, "/metrics", timeout)
    if isinstance(answer, tuple) and answer[0] == 200:
        try:
            if tier.engine == "llama.cpp":
                return Scrape(True, parse_llama_metrics(answer[1]), now)
            return Scrape(True, parse_metrics(answer[1], model_name), now)
        except MetricsParseError as exc:
            error = str(exc)
    health = await _get(upstream, tier, "/health", timeout)
    if isinstance(health, tuple) and health[0] == 200:
        return Scrape(True, None, now, error)
    why = health if isinstance(health, str) else f"/health answered {health[0]}"
    return Scrape(False, None, now, why)


async def _get(
    upstream: Upstream, tier: TierEndpoint, path: str, timeout: float
) -> tuple[int, str] | str:
    try:
        response = await upstream.send(tier, "GET", path, timeout=timeout, quiet=True)
    except APIError as exc:
        return exc.message
    try:
        raw = await upstream.read(tier, response)
    except APIError as exc:
        return exc.message
    finally:
        await aclose_quietly(response)
    return response.status_code, raw.decode("utf-8", "replace")
