"""Gateway configuration: the served model, the tiers behind it, and where state and keys live.

API keys are stored hashed (sha256 hex): ``api_key_hashes`` / ``admin_key_hashes`` in the file,
or plain keys in the environment (``MO_GATEWAY_API_KEYS``, ``MO_GATEWAY_ADMIN_KEYS``, comma
separated), hashed by ``keys_from_environment`` as the config is built and never kept in clear.
The key the gateway sends to its tiers (``TierEndpoint.api_key``) must stay in clear; it comes
from the file or from ``MO_TIER_API_KEY``.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from common.operator_yaml import OperatorYamlError, compose_yaml, read_text, validate


class TierEndpoint(BaseModel):
    """One tier: a pool of OpenAI-compatible servers (vLLM or llama.cpp's llama-server) serving
    one precision, e.g. ``fp16`` at ``http://127.0.0.1:8001``.

    The pool is given by one of: ``base_url`` (one server), ``endpoints`` (a static list of
    server URLs) or ``dns`` (``host:port``, optionally with an ``http://``/``https://`` scheme:
    a name resolving to many addresses, e.g. a Kubernetes headless Service, re-resolved every
    ``GatewayConfig.dns_interval`` seconds by gateway/control/tier_dns.py). Without its own
    ``base_url`` a pool's is its first endpoint (or ``scheme://host:port`` for ``dns``): the
    address used where one URL stands for the tier (memory sampling, resets)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    base_url: str
    endpoints: list[str] | None = Field(default=None, min_length=1)
    dns: str | None = None
    max_model_len: int = Field(default=2048, gt=0)  # prompt + completion tokens it accepts
    # The request classes this tier may serve (the in-engine admission check's verdict, see
    # measure/admission.py); None: every class. A route naming the tier skips it for others.
    classes: list[str] | None = None
    admission: str | None = None  # the verdict's one line, for /admin/tiers and route reasons
    # The tier's own key (backends/tier_guard.py), sent as its bearer token on every call;
    # None: none sent. Kept out of repr; from MO_TIER_API_KEY when the file gives none.
    api_key: str | None = Field(default=None, min_length=1, repr=False)
    # The engine its servers run: how its /metrics read and how its KV pool is reset.
    engine: Literal["vllm", "llama.cpp"] = "vllm"

    @model_validator(mode="before")
    @classmethod
    def _one_source(cls, data: object) -> object:
        """Exactly one of base_url, endpoints, dns; a pool's base_url from its first member."""
        if not isinstance(data, dict):
            return data
        derived = _pool_base_url(data)
        if derived is not None and str(data.get("base_url", "")).rstrip("/") == derived:
            # A dumped pool (model_dump) carries its derived base_url: it loads back as it was.
            data = {key: value for key, value in data.items() if key != "base_url"}
        given = [key for key in ("base_url", "endpoints", "dns") if data.get(key) is not None]
        if len(given) != 1:
            shown = ", ".join(given) if given else "none"
            raise ValueError(f"give exactly one of base_url, endpoints, dns (got {shown})")
        if given == ["endpoints"] and isinstance(data["endpoints"], list) and data["endpoints"]:
            first = data["endpoints"][0]
            return {**data, "base_url": first} if isinstance(first, str) else data
        if given == ["dns"] and isinstance(data["dns"], str):
            scheme, host, port = split_dns(data["dns"])
            return {**data, "base_url": f"{scheme}://{host}:{port}"}
        return data

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        return _check_url(value, "base_url")

    @field_validator("endpoints")
    @classmethod
    def _check_endpoints(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        urls = [_check_url(url, "endpoints") for url in value]
        repeated = sorted({url for url in urls if urls.count(url) > 1})
        if repeated:
            raise ValueError(f"endpoints must be unique, repeated: {', '.join(repeated)}")
        return urls

    @field_validator("dns")
    @classmethod
    def _check_dns(cls, value: str | None) -> str | None:
        if value is None:
            return None
        scheme, host, port = split_dns(value)
        return f"{scheme}://{host}:{port}"

    def pool(self) -> list[str]:
        """The configured endpoint URLs (a ``dns`` tier's come from resolving it)."""
        return list(self.endpoints) if self.endpoints is not None else [self.base_url]


def _pool_base_url(data: dict[str, object]) -> str | None:
    """The base_url a pool gets from its ``endpoints`` or ``dns`` (``None``: not a pool, or a
    value the field validators will refuse)."""
    endpoints, dns = data.get("endpoints"), data.get("dns")
    try:
        if isinstance(endpoints, list) and endpoints and isinstance(endpoints[0], str):
            return endpoints[0].strip().rstrip("/")
        if isinstance(dns, str):
            scheme, host, port = split_dns(dns)
            return f"{scheme}://{host}:{port}"
    except ValueError:
        return None
    return None


def _check_url(value: str, field: str) -> str:
    value = value.strip().rstrip("/")
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"{field} must start with http:// or https://, got {value!r}")
    return value


def split_dns(value: str) -> tuple[str, str, int]:
    """``[http://|https://]host:port`` as (scheme, host, port); ValueError naming the field."""
    text = value.strip().rstrip("/")
    scheme = "http"
    for prefix in ("http://", "https://"):
        if text.startswith(prefix):
            scheme, text = prefix[:-3], text[len(prefix) :]
    host, sep, port = text.rpartition(":")
    if not sep or not host or "/" in text or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"dns must be host:port (a name and a port 1-65535), got {value!r}")
    return scheme, host, int(port)


class MeasuredTier(BaseModel):
    """One tier's figures measured on this machine (``up``'s admission check and speed
    calibration): agreement with the reference tier per category, and speed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    quality: dict[str, float]
    ttft_s: float = Field(ge=0)
    tpot_s: float = Field(ge=0)
    throughput_tok_s: float = Field(ge=0)
    # Per prompt of the calibration's requests alone, in prompt order, paired across tiers
    # (measure/speed.py); None: that request failed. Empty (files from before): point figures.
    ttfts_s: list[float | None] = Field(default_factory=list)
    tpots_s: list[float | None] = Field(default_factory=list)
    # Served emulated (the reference's arithmetic on dequantized weights): never routed ahead
    # of the reference (gateway/policy/derive.py).
    emulated: bool = False
    # Requests at once when throughput_tok_s was measured (4: files from before, which all
    # measured at 4); the live routes read a tier's per-token time under load from it.
    concurrency: int = Field(default=4, gt=0)


class MeasurementConfig(BaseModel):
    """The gateway's own measurements (gateway/control/measurement.py): the leading replica
    runs the in-engine admission check (measure/admission_run.py) and the speed calibration
    (measure/speed.py) on every endpoint of every tier at start, when an endpoint appears or
    comes back, and every ``interval_s`` in a quiet window; every replica re-derives its routes
    from the figures shared in Redis. Off unless enabled (``up``, compose and the Kubernetes
    manifests enable it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    reference: str = "fp16"  # the tier the others are judged against
    floors: dict[str, float] = Field(
        default_factory=lambda: {"chat": 0.5, "code": 0.5, "math": 0.5}
    )
    max_tokens: int = Field(default=32, gt=0)  # tokens of each probe's answer
    interval_s: float = Field(default=6 * 3600.0, gt=0)  # between scheduled measurements
    # Quiet: the request rate across replicas below quiet_max_rps for quiet_for_s seconds.
    quiet_max_rps: float = Field(default=0.5, ge=0)
    quiet_for_s: float = Field(default=60.0, ge=0)
    tick_s: float = Field(default=5.0, gt=0)  # how often due endpoints are looked for
    # Budget: runs per look (a run: one endpoint of each tier), seconds one run may take
    # (past it: interrupted, nothing written), seconds before a failed run is tried again.
    max_runs: int = Field(default=2, gt=0)
    run_timeout_s: float = Field(default=600.0, gt=0)
    retry_s: float = Field(default=300.0, gt=0)
    # The calibration (measure/speed.py SpeedOptions): prompts alone per tier, their length.
    speed_requests: int = Field(default=8, gt=0)
    speed_input_len: int = Field(default=128, gt=0)
    speed_output_len: int = Field(default=32, gt=1)
    speed_concurrency: int = Field(default=4, gt=0)
    # The check's held-aside probes (JSONL: category, text); None: the shipped set.
    probes_path: str | None = None
    # Each tier's variant digest when known (``up`` gives them): a new one is measured again.
    digests: dict[str, str] = Field(default_factory=dict)


class GatewayConfig(BaseModel):
    """Everything ``create_app`` needs; tiers are tried in order until one answers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_name: str = Field(min_length=1)
    tiers: list[TierEndpoint] = Field(min_length=1)
    connect_timeout: float = Field(default=5.0, gt=0)
    # Seconds /readyz waits for one tier to be found healthy and routed before answering 503
    # (below the Deployment's readiness probe timeout, 3 s); the first such tier answers it.
    readiness_timeout: float = Field(default=2.0, gt=0)
    read_timeout: float = Field(default=600.0, gt=0)
    max_body_bytes: int = Field(default=1_000_000, gt=0)
    # JSON values a completion request's body may hold (objects, arrays, strings, numbers,
    # literals, keys), counted from its bytes before decoding: past it 400 request_too_large.
    # Decoded, a value takes up to ~70 bytes (a body of `{},` is ~24x its bytes), so this bounds
    # a body in flight to ~5 MB of objects besides its bytes.
    max_body_values: int = Field(default=65_536, gt=0)
    # Bytes the gateway holds of one tier answer at once: a whole answer (read whole to be
    # relayed), one SSE event of a stream. Past it the tier failed (502 answer_too_large, or
    # the stream's error event). 64 MiB: the policy's largest answers (n 4 x 4,000 tokens x
    # top_logprobs 20, ~20 MB) fit.
    max_answer_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    # Seconds a client may take to send a completion request's whole body (past it: 408 and
    # the connection closed). The body is read before the request takes an in-flight slot.
    body_timeout: float = Field(default=30.0, gt=0)
    # Routing policy YAML (policies/routing.yaml); None: every class tries the tiers in order.
    policy_path: str | None = None
    watch_policy: bool = True  # reload the policy file when it changes
    # Tier names the policy may name beyond the configured ones (a deployment's tiers that are
    # not running here); any other name in the policy makes it invalid.
    policy_extra_tiers: list[str] = Field(default_factory=list)
    # A model or variant folder with tokenizer.json (+ chat template) for counting tokens;
    # None: prompts are bounded by their UTF-8 byte count (safe for byte-level BPE).
    tokenizer_dir: str | None = None
    redis_url: str | None = None  # shared state across replicas; None: this process only
    redis_prefix: str = "mo:gateway"
    # Seconds within which this replica's in-flight counts and request counts reach Redis: one
    # write carries every change since the last, off the request path (0: each request awaits
    # two writes, at its start and its end).
    shared_flush_interval: float = Field(default=0.02, ge=0, le=1)
    api_key_hashes: list[str] = Field(default_factory=list)  # empty: /v1 needs no key
    admin_key_hashes: list[str] = Field(default_factory=list)  # empty: /admin is disabled
    rate_limit_per_minute: int | None = Field(default=None, gt=0)  # per API key
    # Failed key attempts per client address and minute, one budget for /admin (requests
    # without the admin key) and /v1 (a wrong API key sent), across replicas; once spent both
    # answer 429 without checking the key until the window frees (gateway/key_guesses.py).
    # None: no limit.
    admin_rate_limit_per_minute: int | None = Field(default=300, gt=0)
    metrics_interval: float = Field(default=2.0, gt=0)  # seconds between scrapes of the tiers
    dns_interval: float = Field(default=10.0, gt=0)  # seconds between resolving `dns` tiers
    # Completion requests this process holds at once; past it new ones get a prompt 503 with
    # Retry-After (load shedding) instead of queueing behind an overloaded event loop.
    max_in_flight: int = Field(default=256, gt=0)
    # Tiers' measured figures; routes with `derive` in the policy are ordered from them
    # (gateway/policy/derive.py). Empty: every route as written.
    measured: dict[str, MeasuredTier] = Field(default_factory=dict)
    reference_tier: str | None = None  # the tier the quality figures are measured against
    # When measured (epoch seconds): with ``measurement`` on, figures handed over by ``up`` for
    # these endpoints are not measured again at start. None: not known (measured again).
    measured_at: float | None = None
    measurement: MeasurementConfig = Field(default_factory=MeasurementConfig)
    # Connections, as uvicorn serves them (gateway/server.py): at most max_connections at once
    # (past it: 503); at most max_connections_per_client from one address (None: no bound;
    # trusted proxies are not bounded); a request's head must arrive within header_timeout s
    # of the connection opening or of the previous answer; an idle kept-alive connection is
    # closed after keep_alive_timeout s. forwarded_allow_ips: the proxies whose
    # X-Forwarded-For is believed (IPs, networks such as 10.0.0.0/8, or "*"); none by default.
    max_connections: int = Field(default=1024, gt=0)
    max_connections_per_client: int | None = Field(default=64, gt=0)
    header_timeout: float = Field(default=10.0, gt=0)
    keep_alive_timeout: int = Field(default=5, gt=0)
    # Seconds an answer may wait on a client that reads nothing (its connection's write buffer
    # stays past the high-water mark): then the connection is aborted and its slot freed
    # (NGINX's send_timeout).
    send_timeout: float = Field(default=60.0, gt=0)
    # Seconds a shutdown (SIGTERM) lets requests finish; streams still open then end with an
    # error event (503 shutting_down) and [DONE]. Keep it below the orchestrator's grace period
    # less 2 s (compose's stop_grace_period and Kubernetes' terminationGracePeriodSeconds: 30).
    shutdown_timeout: float = Field(default=20.0, gt=0)
    forwarded_allow_ips: list[str] = Field(default_factory=list)
    # How uvicorn serves (gateway/server.py): the llhttp parser (httptools) or h11, on the
    # libuv event loop (uvloop) or asyncio's own. A request's head (request line and headers)
    # may take at most max_head_bytes (past it: 400 and the connection closed).
    http_parser: Literal["httptools", "h11"] = "httptools"
    # How the gateway talks to its tiers, under httpx's API: aiohttp's pool and parser
    # (gateway/request/upstream/aiohttp_transport.py) or httpx's own (httpcore).
    upstream_transport: Literal["aiohttp", "httpx"] = "aiohttp"
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    max_head_bytes: int = Field(default=65_536, ge=1024)
    # One uvicorn access-log line per request (off by default: it costs about a tenth of the
    # gateway's CPU per request). The request log (gateway/request_log.py) logs every 5xx and a
    # sample of the rest as one JSON line each.
    access_log: bool = False
    request_log_sample: float = Field(default=0.01, ge=0, le=1)

    @field_validator("api_key_hashes", "admin_key_hashes")
    @classmethod
    def _hex_digests(cls, value: list[str]) -> list[str]:
        for digest in value:
            if not _SHA256.fullmatch(digest):
                raise ValueError("key hashes must be sha256 hex digests (64 hex characters)")
        return [digest.lower() for digest in value]

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        for entry in value:
            if entry != "*":
                try:
                    ipaddress.ip_network(entry, strict=False)
                except ValueError:
                    raise ValueError(f"{entry!r} is not an IP address, a network or *") from None
        return value

    @model_validator(mode="after")
    def _unique_tier_names(self) -> GatewayConfig:
        names = [tier.name for tier in self.tiers]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"tier names must be unique, repeated: {', '.join(duplicates)}")
        return self


_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
API_KEYS_ENV = "MO_GATEWAY_API_KEYS"
ADMIN_KEYS_ENV = "MO_GATEWAY_ADMIN_KEYS"
TIER_KEY_ENV = "MO_TIER_API_KEY"


def hash_key(key: str) -> str:
    """The stored form of an API key: its sha256 hex digest."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def keys_from_environment(
    config: GatewayConfig, environ: Mapping[str, str] | None = None
) -> GatewayConfig:
    """``config`` with the keys of ``MO_GATEWAY_API_KEYS`` / ``MO_GATEWAY_ADMIN_KEYS`` added,
    hashed (the plain keys go no further than this function), and ``MO_TIER_API_KEY`` as the
    ``api_key`` of every tier that has none."""
    env = os.environ if environ is None else environ

    def hashed(name: str) -> list[str]:
        return [hash_key(key.strip()) for key in env.get(name, "").split(",") if key.strip()]

    tier_key = env.get(TIER_KEY_ENV, "").strip()
    if tier_key and any(tier.api_key is None for tier in config.tiers):
        tiers = [
            tier if tier.api_key else tier.model_copy(update={"api_key": tier_key})
            for tier in config.tiers
        ]
        config = config.model_copy(update={"tiers": tiers})
    api, admin = hashed(API_KEYS_ENV), hashed(ADMIN_KEYS_ENV)
    if not api and not admin:
        return config
    return config.model_copy(
        update={
            "api_key_hashes": [*config.api_key_hashes, *api],
            "admin_key_hashes": [*config.admin_key_hashes, *admin],
        }
    )


class ConfigError(OperatorYamlError):
    """A configuration file could not be read or is invalid; ``str()`` is one line,
    ``<file>:<line>: <dotted.field>: <message>`` (common/operator_yaml.py)."""


def load_config(path: str | Path) -> GatewayConfig:
    """Read a YAML file holding a ``GatewayConfig`` mapping."""
    path = Path(path)
    text = read_text(path, "gateway config", ConfigError)
    root, data = compose_yaml(text, str(path), ConfigError)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: (top level): must be a YAML mapping")
    return validate(GatewayConfig, data, root, str(path), ConfigError)
