"""Prometheus metrics for the gateway, owned by one ``GatewayMetrics`` object per app.

Contract:

* Every metric lives in the instance's own ``CollectorRegistry``; nothing touches
  prometheus_client's default ``REGISTRY``, so two apps (or two tests) never share a value.
* Labels: ``class`` is the routing class, ``tier`` the tier that answered (``"none"`` when no
  tier was chosen), ``status`` the HTTP status code as a string. Callers pass values from a
  bounded set (policy classes, configured tiers, fixed reason codes); every distinct value is
  a new series, so free text would explode the series count.
* ``render(accept)`` returns ``(body, content_type)``: OpenMetrics when the Accept header asks
  for ``application/openmetrics-text``, else the Prometheus text format.
* The ``endpoint`` label (an endpoint URL of a tier's pool) is only on the three
  ``gateway_endpoint_*`` gauges, rendered from the pools as they are now: an endpoint that
  left its pool has no series left, so their number stays the number of endpoints.
* Nothing happens at import time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.tier_state import TierState
from gateway.control.tier_signals import TierSignals
from gateway.request.route.endpoint_choice import EndpointStatus
from gateway.serving import ServingState

NO_TIER = "none"
# LLM calls span milliseconds (a rejected or cached answer) to minutes (a long generation).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)
RELOAD_OUTCOMES = frozenset({"applied", "rejected", "unchanged"})
# Token agreement of a shadow comparison, 0..1 (gateway/control/shadow.py); 1: identical outputs.
AGREEMENT_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)


class GatewayMetrics:
    """The gateway's counters, histograms and gauges over a private registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self.requests = Counter(
            "gateway_requests_total",
            "Requests answered, by routing class, tier and HTTP status.",
            ["class", "tier", "status"],
            registry=reg,
        )
        self.duration = Histogram(
            "gateway_request_duration_seconds",
            "Time from request received to the last response byte sent.",
            ["class", "tier"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Time until the first body byte from the tier (streamed and whole answers).",
            ["class", "tier"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.tokens = Counter(
            "gateway_tokens_total",
            "Tokens processed, by direction (input = prompt, output = completion).",
            ["class", "tier", "direction"],
            registry=reg,
        )
        self.rejections = Counter(
            "gateway_rejections_total",
            "Requests refused before reaching a tier, by reason.",
            ["reason"],
            registry=reg,
        )
        self.fallbacks = Counter(
            "gateway_upstream_fallbacks_total",
            "Tiers skipped mid-chain (connect error, 503), by tier and reason.",
            ["tier", "reason"],
            registry=reg,
        )
        self.resumes = Counter(
            "gateway_stream_resumes_total",
            "Streamed answers continued on another tier after theirs failed mid-stream, by the "
            "failed tier and the one that went on ('none': the answer's length was used up).",
            ["from_tier", "to_tier"],
            registry=reg,
        )
        self.escalations = Counter(
            "gateway_stream_escalations_total",
            "Streamed answers of a watched tier that degenerated and went on on the next tier, "
            "by that tier, the next one, the class and what was seen (loop, scripts).",
            ["from_tier", "to_tier", "class", "kind"],
            registry=reg,
        )
        self.in_flight = Gauge(
            "gateway_tier_in_flight", "Requests currently sent to the tier.", ["tier"], registry=reg
        )
        self.tier_up = Gauge(
            "gateway_tier_up", "1 when the tier is ready, else 0.", ["tier"], registry=reg
        )
        self.resets = Counter(
            "gateway_kv_resets_total",
            "KV-pool resets led by this replica, by tier and outcome.",
            ["tier", "outcome"],
            registry=reg,
        )
        self.measurement_runs = Counter(
            "gateway_measurement_runs_total",
            "Measurement runs (admission check + speed calibration) led by this replica, by "
            "outcome: ok, failed, lost_lock, refused (a newer leader had written).",
            ["outcome"],
            registry=reg,
        )
        self.reset_duration = Histogram(
            "gateway_kv_reset_duration_seconds",
            "Time a tier was out of routing for a reset (drain, reset, verify, warm-up).",
            ["tier"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.reloads = Counter(
            "gateway_policy_reloads_total",
            "Routing policy reloads, by outcome (applied, rejected, unchanged).",
            ["outcome"],
            registry=reg,
        )
        self.shadow_comparisons = Counter(
            "gateway_shadow_comparisons_total",
            "Shadow comparisons of a tier's answer with the reference tier's, by tier.",
            ["tier"],
            registry=reg,
        )
        self.shadow_deviations = Counter(
            "gateway_shadow_deviations_total",
            "Shadow comparisons whose token agreement was below the policy's threshold.",
            ["tier"],
            registry=reg,
        )
        self.shadow_agreement = Histogram(
            "gateway_shadow_agreement",
            "Token agreement (0..1) of shadow comparisons, by tier.",
            ["tier"],
            buckets=AGREEMENT_BUCKETS,
            registry=reg,
        )
        self.shadow_dropped = Counter(
            "gateway_shadow_dropped_total",
            "Sampled shadow comparisons not made, by tier and reason.",
            ["tier", "reason"],
            registry=reg,
        )
        self.shadow_in_flight = Gauge(
            "gateway_shadow_in_flight", "Shadow comparisons running now.", registry=reg
        )
        self.guard_trips = Counter(
            "gateway_live_guard_trips_total",
            "Times the live guard withheld a tier from a class (shadow agreement below floor, or "
            "too many escalations).",
            ["tier", "class"],
            registry=reg,
        )
        self.route_changes = Counter(
            "gateway_route_changes_total",
            "Times a class's route (its tiers, in order) changed: a policy applied with other "
            "tiers, or a derivation from new figures that moved them.",
            ["class"],
            registry=reg,
        )
        self.route_first_tier = Gauge(
            "gateway_route_first_tier",
            "1 for each class's first tier now (one series per class).",
            ["class", "tier"],
            registry=reg,
        )
        self.live_factor = Gauge(
            "gateway_live_route_factor",
            "Each measured tier's live factor the routes are derived on now: its per-token time "
            "in real answers over the calibration's at the same load (1: as calibrated).",
            ["tier"],
            registry=reg,
        )
        self.live_probes = Counter(
            "gateway_live_probes_total",
            "Probe rounds of a tier the live routes moved away from, by outcome: judged "
            "(enough answers), short (fewer: nothing changes), failed.",
            ["tier", "outcome"],
            registry=reg,
        )
        self.background_errors = Counter(
            "gateway_background_errors_total",
            "Exceptions that ended a background loop (started again), by loop.",
            ["loop"],
            registry=reg,
        )
        self.tier_signals = TierSignalsCollector()
        reg.register(self.tier_signals)
        self.endpoints = EndpointCollector()
        reg.register(self.endpoints)
        self.serving = ServingCollector()
        reg.register(self.serving)

    def observe_request(
        self,
        cls: str,
        tier: str | None,
        status: int | str,
        duration: float,
        ttft: float | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> None:
        """Record one finished request; ``None`` leaves the optional series untouched.

        Durations are seconds; token counts must not be negative.
        """
        tier_label = tier or NO_TIER
        self.requests.labels(cls, tier_label, str(status)).inc()
        self.duration.labels(cls, tier_label).observe(duration)
        if ttft is not None:
            self.ttft.labels(cls, tier_label).observe(ttft)
        if input_tokens is not None:
            self.tokens.labels(cls, tier_label, "input").inc(input_tokens)
        if output_tokens is not None:
            self.tokens.labels(cls, tier_label, "output").inc(output_tokens)

    def reject(self, reason: str) -> None:
        """Count a request refused before any tier saw it (e.g. ``rate_limited``)."""
        self.rejections.labels(reason).inc()

    def fallback(self, tier: str, reason: str) -> None:
        """Count ``tier`` being skipped for the next one in the chain."""
        self.fallbacks.labels(tier, reason).inc()

    def resumed(self, failed: str, tier: str) -> None:
        """Count a stream continued on ``tier`` after ``failed`` broke off mid-stream."""
        self.resumes.labels(failed, tier).inc()

    def escalated(self, failed: str, tier: str, cls: str, kind: str) -> None:
        """Count a degenerate stream of ``failed`` continued on ``tier``."""
        self.escalations.labels(failed, tier, cls, kind).inc()

    def set_tier(self, tier: str, in_flight: int, up: bool) -> None:
        """Publish a tier's current in-flight count and readiness."""
        self.in_flight.labels(tier).set(in_flight)
        self.tier_up.labels(tier).set(1 if up else 0)

    def policy_reload(self, outcome: str) -> None:
        """Count a policy reload; ``outcome`` is ``applied``, ``rejected`` or ``unchanged``."""
        if outcome not in RELOAD_OUTCOMES:
            raise ValueError(f"unknown policy reload outcome {outcome!r}")
        self.reloads.labels(outcome).inc()

    def routes_changed(self, classes: Iterable[str], first_tiers: Mapping[str, str]) -> None:
        """Count a route change per class in ``classes``; ``first_tiers``: every class's first
        tier now (the gauge keeps only these)."""
        for cls in classes:
            self.route_changes.labels(cls).inc()
        self.route_first_tier.clear()
        for cls, tier in first_tiers.items():
            self.route_first_tier.labels(cls, tier).set(1)

    def reset(self, tier: str, outcome: str, seconds: float) -> None:
        """One reset of ``tier`` ended with ``outcome`` after ``seconds`` out of routing."""
        self.resets.labels(tier=tier, outcome=outcome).inc()
        self.reset_duration.labels(tier=tier).observe(max(seconds, 0.0))

    def reset_refused(self, tier: str) -> None:
        """An operator's "reset now" of ``tier`` that the safety rules kept refusing."""
        self.resets.labels(tier=tier, outcome="refused").inc()

    def background_error(self, loop: str) -> None:
        """A background loop (scrape, resets, policy_watch, dns) failed and will start again."""
        self.background_errors.labels(loop).inc()

    def shadow_compared(self, tier: str, agreement: float, deviated: bool) -> None:
        """One shadow comparison of ``tier`` with the reference ended with ``agreement``."""
        self.shadow_comparisons.labels(tier).inc()
        self.shadow_agreement.labels(tier).observe(agreement)
        if deviated:
            self.shadow_deviations.labels(tier).inc()

    def guard_trip(self, tier: str, cls: str) -> None:
        """The live guard withheld ``tier`` from class ``cls``."""
        self.guard_trips.labels(tier, cls).inc()

    def shadow_drop(self, tier: str, reason: str) -> None:
        """A sampled shadow comparison of ``tier`` was not made (a fixed reason code)."""
        self.shadow_dropped.labels(tier, reason).inc()

    def render(self, accept_header: str | None) -> tuple[bytes, str]:
        """The registry in the format the Accept header asks for, and its content type."""
        encoder, content_type = choose_encoder(accept_header or "")
        return encoder(self.registry), content_type


# (name, help, kind, TierSignals field); counters get "_total" appended when rendered.
TIER_SIGNAL_SERIES = (
    ("gateway_tier_kv_usage_ratio", "Share (0..1) of the tier's KV blocks in use.", "gauge",
     "kv_usage"),
    ("gateway_tier_kv_capacity_tokens", "Token slots of the tier's KV pool.", "gauge",
     "kv_capacity_tokens"),
    ("gateway_tier_kv_tokens_per_request",
     "KV token slots in use per running request (absent while none runs).", "gauge",
     "kv_tokens_per_request"),
    ("gateway_tier_preemptions", "vllm:num_preemptions_total of the tier, mirrored.", "counter",
     "preemptions"),
    ("gateway_tier_memory_bytes", "RSS of the tier's process tree at the last sample.", "gauge",
     "memory_bytes"),
    ("gateway_tier_peak_memory_bytes",
     "Largest sampled RSS of the tier's process tree since its process started.", "gauge",
     "peak_memory_bytes"),
)  # fmt: skip


class TierSignalsCollector(Collector):
    """Renders the latest ``TierSignals`` of each tier (gateway/control/tier_signals.py); a value
    that is not known has no sample."""

    def __init__(self) -> None:
        self._signals: dict[str, TierSignals] = {}

    def publish(self, signals: Mapping[str, TierSignals]) -> None:
        self._signals = dict(signals)

    def collect(self) -> Iterator[Metric]:
        for name, text, kind, attribute in TIER_SIGNAL_SERIES:
            family: GaugeMetricFamily | CounterMetricFamily
            if kind == "counter":
                family = CounterMetricFamily(name, text, labels=["tier"])
            else:
                family = GaugeMetricFamily(name, text, labels=["tier"])
            for tier, signals in self._signals.items():
                value = getattr(signals, attribute)
                if value is not None:
                    family.add_metric([tier], float(value))
            yield family


class EndpointCollector(Collector):
    """Renders each endpoint of each tier's pool as last published: ready or not, waiting
    requests and KV usage (``gateway_endpoint_*{tier,endpoint}``)."""

    def __init__(self) -> None:
        self._pools: dict[str, list[EndpointStatus]] = {}

    def publish(self, pools: Mapping[str, list[EndpointStatus]]) -> None:
        self._pools = {tier: list(endpoints) for tier, endpoints in pools.items()}

    def collect(self) -> Iterator[Metric]:
        labels = ["tier", "endpoint"]
        up = GaugeMetricFamily(
            "gateway_endpoint_up", "1 when the endpoint of the tier's pool is ready.", labels=labels
        )
        waiting = GaugeMetricFamily(
            "gateway_endpoint_requests_waiting",
            "vllm:num_requests_waiting of the endpoint at its last scrape.",
            labels=labels,
        )
        kv = GaugeMetricFamily(
            "gateway_endpoint_kv_usage_ratio",
            "Share (0..1) of the endpoint's KV blocks in use at its last scrape.",
            labels=labels,
        )
        for tier, endpoints in self._pools.items():
            for endpoint in endpoints:
                up.add_metric(
                    [tier, endpoint.url], 1.0 if endpoint.state == TierState.READY else 0.0
                )
                waiting.add_metric([tier, endpoint.url], endpoint.requests_waiting)
                kv.add_metric([tier, endpoint.url], endpoint.kv_usage)
        yield from (up, waiting, kv)


class ServingCollector(Collector):
    """Renders the connection layer's counts of the app's event loop (gateway/serving.py):
    connections aborted because their client stopped reading, answers ended by a shutdown.
    ``state`` is set when the app starts (no samples before)."""

    def __init__(self) -> None:
        self.state: ServingState | None = None

    def collect(self) -> Iterator[Metric]:
        aborted = CounterMetricFamily(
            "gateway_slow_clients_aborted",
            "Connections aborted because the client read nothing of its answer for send_timeout.",
        )
        drained = CounterMetricFamily(
            "gateway_answers_drained",
            "Answers (streams, whole) still in progress at shutdown_timeout, ended with 503.",
        )
        if self.state is not None:
            aborted.add_metric([], self.state.slow_clients_aborted)
            drained.add_metric([], self.state.answers_drained)
        yield from (aborted, drained)
