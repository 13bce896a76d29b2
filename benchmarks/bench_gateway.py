"""Gateway overhead benchmark: our gateway and LiteLLM's proxy against the upstream, in one run.

    ./mo setup && $(python3 -m model_optimizer.envs path gateway)/bin/python \\
        benchmarks/bench_gateway.py [--quick] [--concurrency 1,16] [--requests 400] [--rounds 3] \\
        [--modes chat,stream] [--rates 50,100,200,400,800] [--step-seconds 3] \\
        [--upstream URL] [--no-litellm] [--no-redis] [--json PATH] [--keep]

Targets in front of the SAME upstream, all on 127.0.0.1: the upstream itself ("direct"), the
least a proxy can do on the gateway's server stack (benchmarks/minimal_proxy.py: the hop's own
cost, wake-ups of an idle machine included), the gateway (``python -m gateway``, one tier,
the shipped classifier rules, Redis at redis://127.0.0.1:6379/0 under a throwaway prefix), the
gateway without Redis, --gateway-processes gateways sharing Redis, and LiteLLM's proxy
(pinned in requirements/bench-litellm.txt, installed into its own venv under
~/.cache/model-optimizer/envs/litellm-<hash> on first use; ``--no-litellm`` skips it).

The upstream is a stub OpenAI server started by this script (fixed small chat.completion, a few
SSE chunks when streaming): a vLLM tier on this CPU takes ~100 ms a token, which would bury the
proxies' cost. ``--upstream URL`` points all targets at a real tier instead.

1. Closed loop: --rounds rounds; in each, every target (order rotated each round, so drift on
   a shared machine falls on all of them) gets --requests short chat requests at --concurrency
   (each prompt its own, a batch prefix and the request's number: the gateway caches token
   counts per text),
   per mode: ``chat`` (latency of the whole answer) and ``stream`` (time to the first body
   byte). p50 / p99 / mean over all rounds, the added p50 / p99 against direct, requests per
   second, the server's CPU time per request (process tree, user + system) and failures.
2. Open loop: offered rates --rates, --step-seconds each, non-streaming; rates go up together,
   targets interleaved. Latency counts from each request's scheduled send time, so a client
   that falls behind counts against the target too. A target holds a rate when it answered
   every request, at >= 95% of the offered rate and with p99 <= --p99-bound-ms; it leaves the
   step-up at its first miss. Rates above the one "direct" holds measure this client, not the
   proxies (it shares the 2 cores with the servers).

Markdown tables on stdout, progress on stderr, raw figures (every latency) with --json PATH.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backends.process import free_port  # noqa: E402
from benchmarks.http_load import LoadError, Pool, post_bytes  # noqa: E402
from common.class_categories import CLASS_NAMES  # noqa: E402
from gateway.policy.schema import load_policy  # noqa: E402
from measure.serving_stats import percentile  # noqa: E402
from model_optimizer.envs import cache_root  # noqa: E402
from model_optimizer.tier_setup import DEFAULT_SERVED_NAME  # noqa: E402

LOCAL = "127.0.0.1"
REDIS_URL = "redis://127.0.0.1:6379/0"
LITELLM_REQUIREMENTS = ROOT / "requirements" / "bench-litellm.txt"
PROMPT = "What is the capital of France? Answer in one word."
DIRECT, GATEWAY, GATEWAY_LOCAL, LITELLM = "direct", "gateway", "gateway (no redis)", "litellm"
MINIMAL = "minimal proxy"  # benchmarks/minimal_proxy.py: the hop's own cost
MODES = ("chat", "stream")
HELD_SHARE = 0.95  # achieved / offered rate for a step to count as held


def say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- stub upstream


def stub_app(model: str) -> Any:
    """A fast OpenAI-compatible upstream: fixed answers, no work."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    usage = {"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23}
    message = {"role": "assistant", "content": "Paris."}
    completion = json.dumps(
        {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "created": 1700000000,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": usage,
        }
    ).encode()

    def chunk(delta: dict[str, str], finish: str | None = None, **extra: Any) -> bytes:
        body = {
            "id": "chatcmpl-stub",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    chunks = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Par"}),
        chunk({"content": "is"}),
        chunk({"content": "."}),
        chunk({}, "stop"),
    ]
    usage_chunk = (
        b"data: "
        + json.dumps(
            {
                "id": "chatcmpl-stub",
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": model,
                "choices": [],
                "usage": usage,
            }
        ).encode()
        + b"\n\n"
    )
    models = json.dumps(
        {
            "object": "list",
            "data": [
                {"id": model, "object": "model", "created": 0, "owned_by": "stub", "root": model}
            ],
        }
    ).encode()
    metrics = (
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{model_name="{model}"}} 0.0\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{model_name="{model}"}} 0.0\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{model_name="{model}"}} 0.0\n'
    )

    async def chat(request: Request) -> Response:
        body = await request.json()
        if not body.get("stream"):
            return Response(completion, media_type="application/json")
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def events() -> Any:
            for part in chunks:
                yield part
            if with_usage:
                yield usage_chunk
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def list_models(request: Request) -> Response:
        return Response(models, media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b"")

    async def metrics_text(request: Request) -> Response:
        return Response(metrics, media_type="text/plain; version=0.0.4")

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics_text, methods=["GET"]),
        ]
    )


def serve_stub(port: int, model: str) -> None:
    import uvicorn

    uvicorn.run(stub_app(model), host=LOCAL, port=port, log_level="warning", access_log=False)


# --------------------------------------------------------------------------- processes


@dataclass
class Server:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def stop(self) -> None:
        """SIGTERM to the process group this script started, SIGKILL after 10 s."""
        if self.process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def start(name: str, cmd: list[str], workdir: Path, env: dict[str, str] | None = None) -> Server:
    log = workdir / f"{name.replace(' ', '_').replace('(', '').replace(')', '')}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env=env,
            start_new_session=True,  # its own process group: stop() ends it and its children
        )
    say(f"started {name} (pid {process.pid}): {' '.join(cmd)}")
    return Server(name, process, log)


def wait_ready(
    server: Server | None, url: str, timeout: float, post: dict[str, Any] | None = None
) -> str:
    """Poll ``url`` until it answers 200 (a POST of ``post`` when given); '' or why not."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    with httpx.Client(timeout=10, trust_env=False) as client:
        while time.monotonic() < deadline:
            if server is not None and server.process.poll() is not None:
                return f"exited with code {server.process.returncode}"
            try:
                resp = client.post(url, json=post) if post else client.get(url)
                if resp.status_code == 200:
                    return ""
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.3)
    return f"not ready after {timeout:.0f} s ({last})"


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without proxy, OpenTelemetry or LiteLLM settings."""
    drop = ("OTEL_", "LITELLM_", "DATABASE_URL", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(drop)}
    env["NO_PROXY"] = env["no_proxy"] = LOCAL
    env.update(extra)
    return env


def gateway_env(trace_ratio: float = 1.0) -> dict[str, str]:
    """A gateway's environment: clean, and with OpenTelemetry's ratio sampler when only a share
    of the requests is to be traced (``trace_ratio`` < 1; spans are made, never exported)."""
    extra = {"PYTHONPATH": str(ROOT)}
    if trace_ratio < 1:
        extra["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
        extra["OTEL_TRACES_SAMPLER_ARG"] = f"{trace_ratio:g}"
    return clean_env(**extra)


def tree_cpu(pid: int | None) -> float:
    """User + system CPU seconds of ``pid`` and its children (0 when unknown)."""
    if pid is None:
        return 0.0
    try:
        root = psutil.Process(pid)
        total = 0.0
        for proc in [root, *root.children(recursive=True)]:
            times = proc.cpu_times()
            total += times.user + times.system
        return total
    except psutil.Error:
        return 0.0


# --------------------------------------------------------------------------- gateway


def find_tokenizer_dir() -> Path | None:
    found = sorted(cache_root().glob(f"models/{DEFAULT_SERVED_NAME}-*/tokenizer.json"))
    found = found or sorted(cache_root().glob("models/*/tokenizer.json"))
    return found[-1].parent if found else None


def write_gateway_config(
    workdir: Path,
    upstream: str,
    model: str,
    tokenizer: Path | None,
    redis_prefix: str | None,
    whole_answers: str = "regenerate",
) -> Path:
    """The policy (shipped classifier rules, one tier; ``whole_answers``: the policy's
    ``failover.whole_answers``) once, and a GatewayConfig per variant."""
    policy_path = workdir / "routing.yaml"
    if not policy_path.exists():
        shipped = yaml.safe_load((ROOT / "policies" / "routing.yaml").read_text(encoding="utf-8"))
        policy = {
            "tiers": ["fp16"],
            "classes": shipped["classes"],
            "routes": {cls: ["fp16"] for cls in CLASS_NAMES},
            "failover": {"whole_answers": whole_answers},
        }
        policy_path.write_text(yaml.safe_dump(policy, sort_keys=False), encoding="utf-8")
        load_policy(policy_path)  # a PolicyError here is this script's bug: say so early
    config: dict[str, Any] = {
        "model_name": model,
        "tiers": [{"name": "fp16", "base_url": upstream, "max_model_len": 2048}],
        "policy_path": str(policy_path),
        "metrics_interval": 2,
        # Every request of this benchmark comes from one address (as through a trusted proxy):
        # the per-address connection bound (64 by default) would close the open loop's
        # connections past it.
        "max_connections_per_client": None,
    }
    if tokenizer is not None:
        config["tokenizer_dir"] = str(tokenizer)
    if redis_prefix is not None:
        config["redis_url"] = REDIS_URL
        config["redis_prefix"] = redis_prefix
    path = workdir / ("gateway.yaml" if redis_prefix else "gateway-local.yaml")
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def drop_redis_keys(prefix: str) -> None:
    """Remove what the gateway left under this run's throwaway prefix (best effort)."""
    try:
        import redis

        client = redis.Redis.from_url(REDIS_URL, socket_timeout=5)
        keys = list(client.scan_iter(match=f"{prefix}:*", count=500))[:100_000]
        if keys:
            client.delete(*keys)
        client.close()
    except Exception as exc:  # cleanup only: never fail the run for it
        say(f"could not clean Redis keys {prefix}:* ({exc})")


# --------------------------------------------------------------------------- litellm


def litellm_venv() -> Path:
    digest = hashlib.sha256(LITELLM_REQUIREMENTS.read_bytes()).hexdigest()[:12]
    return cache_root() / "envs" / f"litellm-{digest}"


def dir_size_mb(path: Path) -> float:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total / 1e6


def ensure_litellm(args: argparse.Namespace) -> tuple[Path | None, str]:
    """LiteLLM's venv (built if missing); (None, why) when it cannot be had."""
    timeout = args.install_timeout
    venv = litellm_venv()
    marker = venv / ".bench-installed"
    if marker.exists() and (venv / "bin" / "litellm").exists():
        return venv, ""
    python3 = shutil.which("python3")
    if python3 is None:
        return None, "no python3 on PATH to build its venv"
    if venv.exists():
        shutil.rmtree(venv)  # a build that did not finish
    venv.parent.mkdir(parents=True, exist_ok=True)
    log = venv.parent / f"{venv.name}.install.log"
    say(f"litellm: building {venv} from {LITELLM_REQUIREMENTS.name} (log {log})")
    started = time.monotonic()
    try:
        with log.open("wb") as out:
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install"]
            for step in (
                [python3, "-m", "venv", str(venv)],
                [*pip, "-r", str(LITELLM_REQUIREMENTS)],
            ):
                say(f"litellm: {' '.join(step[-3:])} ...")
                left = timeout - (time.monotonic() - started)
                subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=left)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        errors = [line for line in lines if line.startswith("ERROR")] or lines[-1:]
        why = f"install failed ({type(exc).__name__}): {' '.join(errors)[:300]}"
        shutil.rmtree(venv, ignore_errors=True)
        return None, why
    marker.write_text(LITELLM_REQUIREMENTS.read_text(encoding="utf-8"), encoding="utf-8")
    say(
        f"litellm: installed in {time.monotonic() - started:.0f} s, "
        f"{dir_size_mb(venv):.0f} MB on disk"
    )
    return venv, ""


def litellm_version(venv: Path) -> str:
    try:
        out = subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import importlib.metadata as m;print(m.version('litellm'))",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return out.stdout.strip()
    except (subprocess.SubprocessError, OSError):
        return "?"


def litellm_env() -> dict[str, str]:
    # Nothing phones home: telemetry vetoed (LITELLM_TELEMETRY_DISABLED, and the older switch),
    # the bundled model-cost map instead of fetching it, no database (DATABASE_URL dropped), no
    # admin UI; logs at WARNING (LiteLLM's default), so it pays for no extra logging.
    return clean_env(
        LITELLM_TELEMETRY="False",
        LITELLM_TELEMETRY_DISABLED="true",
        # It refuses to start without a master key; ours runs without API keys, so this one does
        # too (its documented switch for that), and neither pays for checking one.
        LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY="true",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        DISABLE_ADMIN_UI="True",
        LITELLM_LOG="WARNING",
        NO_DOCKER="True",
    )


def write_litellm_config(workdir: Path, upstream: str, model: str) -> Path:
    config = {
        "model_list": [
            {
                "model_name": model,
                "litellm_params": {
                    "model": f"openai/{model}",
                    "api_base": f"{upstream}/v1",
                    "api_key": "unused",
                },
            }
        ],
        "litellm_settings": {"telemetry": False},
    }
    path = workdir / "litellm.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- load


@dataclass
class Target:
    name: str
    url: str = ""  # base URL, without /v1
    pid: int | None = None  # server process, for its CPU time
    skipped: str = ""  # why it was not run
    more: list[tuple[str, int | None]] = field(default_factory=list)  # more processes: (url, pid)

    @property
    def urls(self) -> list[str]:
        """Every process's URL; the load alternates between them, as a Service would."""
        return [self.url, *(url for url, _ in self.more)]

    def cpu(self) -> float:
        return sum(tree_cpu(pid) for pid in [self.pid, *(pid for _, pid in self.more)])


@dataclass
class Sample:
    first: float  # seconds to the first body byte (the whole answer when not streaming)
    total: float
    ok: bool


@dataclass
class Batch:
    target: str
    mode: str
    concurrency: int
    round: int
    requests: int
    failures: int
    wall_s: float
    cpu_s: float
    first_ms: list[float]
    total_ms: list[float]
    errors: dict[str, int]


@dataclass
class Step:
    target: str
    rate: int
    sent: int
    ok: int
    achieved: float
    p50_ms: float
    p99_ms: float
    held: bool
    errors: dict[str, int] = field(default_factory=dict)


def request_body(model: str, stream: bool, max_tokens: int, nonce: str = "") -> bytes:
    """The benchmark's request; a ``nonce`` makes its prompt differ from every other's (the
    gateway caches token counts per text: a prompt sent again would skip its count)."""
    prompt = f"{PROMPT} ({nonce})" if nonce else PROMPT
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


HEADERS = {"content-type": "application/json", "authorization": "Bearer unused"}


def request_bodies(model: str, stream: bool, max_tokens: int, count: int) -> list[bytes]:
    """``count`` requests, each prompt its own (a batch's prefix and the request's number)."""
    batch = uuid.uuid4().hex[:8]
    return [request_body(model, stream, max_tokens, f"{batch}-{i}") for i in range(count)]


@dataclass(frozen=True)
class Lane:
    pool: Pool
    raws: list[bytes]  # the requests, ready to write: request i writes raws[i]


def lanes(target: Target, bodies: list[bytes], connections: int, timeout: float) -> list[Lane]:
    """One keep-alive pool per process of ``target``, each with the whole POSTs of ``bodies``
    to its chat completions as the load client writes them; request ``i`` takes lane
    ``i % n``."""
    found = []
    for url in target.urls:
        host, _, port = url.removeprefix("http://").partition(":")
        raws = [post_bytes(host, int(port), "/v1/chat/completions", b, HEADERS) for b in bodies]
        found.append(Lane(Pool(host, int(port), connections, timeout), raws))
    return found


async def one_request(pool: Pool, raw: bytes, stream: bool, errors: Counter[str]) -> Sample:
    started = time.perf_counter()
    try:
        answer = await pool.request(raw)
    except (LoadError, OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as exc:
        errors[f"{type(exc).__name__}: {str(exc)[:120]}"] += 1
        done = time.perf_counter()
        return Sample(done - started, done - started, False)
    if stream:
        ok = answer.status == 200 and b"[DONE]" in answer.tail
    else:
        ok = answer.status == 200 and answer.tail.rstrip().endswith(b"}")
    if not ok:
        errors[f"HTTP {answer.status}, body tail {answer.tail[-40:]!r}"] += 1
    first = (answer.first if stream else answer.done) - started
    return Sample(first, answer.done - started, ok)


async def closed_batch(
    target: Target,
    mode: str,
    concurrency: int,
    rnd: int,
    args: argparse.Namespace,
    count: int | None = None,
) -> Batch:
    """``count`` requests at ``concurrency`` in flight, within ``args.batch_timeout``."""
    total = count if count is not None else args.requests
    stream = mode == "stream"
    bodies = request_bodies(args.model, stream, args.max_tokens, total)
    errors: Counter[str] = Counter()
    samples: list[Sample] = []
    issued = 0
    deadline = time.perf_counter() + args.batch_timeout
    ways = lanes(target, bodies, concurrency, args.request_timeout)
    try:

        async def worker(i: int) -> None:
            nonlocal issued
            lane = ways[i % len(ways)]
            while issued < total and time.perf_counter() < deadline:
                issued += 1
                raw = lane.raws[issued - 1]
                samples.append(await one_request(lane.pool, raw, stream, errors))

        cpu_before = target.cpu()
        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        wall = time.perf_counter() - started
        cpu = target.cpu() - cpu_before
    finally:
        for lane in ways:
            lane.pool.close()
    good = [s for s in samples if s.ok]
    missing = total - len(samples)
    if missing:
        errors[f"not sent within --batch-timeout {args.batch_timeout:.0f} s"] += missing
    return Batch(
        target=target.name,
        mode=mode,
        concurrency=concurrency,
        round=rnd,
        requests=total,
        failures=total - len(good),
        wall_s=wall,
        cpu_s=cpu,
        first_ms=[round(s.first * 1000, 3) for s in good],
        total_ms=[round(s.total * 1000, 3) for s in good],
        errors=dict(errors),
    )


async def open_step(target: Target, rate: int, args: argparse.Namespace) -> Step:
    """``rate`` requests a second for ``args.step_seconds``, sent on schedule whatever answers."""
    count = max(1, round(rate * args.step_seconds))
    bodies = request_bodies(args.model, False, args.max_tokens, count)
    errors: Counter[str] = Counter()
    latencies: list[float] = []
    ends: list[float] = []
    ways = lanes(target, bodies, args.max_connections, args.request_timeout)
    try:

        async def fire(at: float, i: int) -> None:
            lane = ways[i % len(ways)]
            sample = await one_request(lane.pool, lane.raws[i], False, errors)
            if sample.ok:
                end = time.perf_counter()
                latencies.append(end - at)  # from the scheduled time: client lag counts
                ends.append(end)

        t0 = time.perf_counter() + 0.05
        tasks: list[asyncio.Task[None]] = []
        for i in range(count):
            at = t0 + i / rate
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(fire(at, i)))
        _, pending = await asyncio.wait(tasks, timeout=args.request_timeout + 1)
        for task in pending:
            task.cancel()
        if pending:
            errors["unanswered at the end of the step"] += len(pending)
            await asyncio.gather(*pending, return_exceptions=True)
    finally:
        for lane in ways:
            lane.pool.close()
    duration = max(args.step_seconds, (max(ends) - t0) if ends else args.step_seconds)
    achieved = len(latencies) / duration
    ms = [x * 1000 for x in latencies]
    p50, p99 = percentile(ms, 50, empty=math.nan), percentile(ms, 99, empty=math.nan)
    held = len(latencies) == count and achieved >= HELD_SHARE * rate and p99 <= args.p99_bound_ms
    return Step(target.name, rate, count, len(latencies), achieved, p50, p99, held, dict(errors))


def rotated(items: list[Target], by: int) -> list[Target]:
    k = by % len(items) if items else 0
    return items[k:] + items[:k]


async def run_load(
    targets: list[Target], args: argparse.Namespace
) -> tuple[list[Batch], list[Step]]:
    live = [t for t in targets if not t.skipped]
    top = max(args.concurrency)
    for target in live:  # warm-up (connections, caches, lazy imports), not recorded
        for mode in args.modes:
            warm = await closed_batch(target, mode, top, -1, args, count=4 * top)
            if warm.failures:
                say(f"warm-up {target.name} {mode}: {warm.failures} failures {warm.errors}")
    batches: list[Batch] = []
    for rnd in range(args.rounds):
        for mode in args.modes:
            for level in args.concurrency:
                for target in rotated(live, rnd):
                    batch = await closed_batch(target, mode, level, rnd, args)
                    batches.append(batch)
                    rate = (batch.requests - batch.failures) / batch.wall_s
                    p50 = percentile(batch.first_ms, 50, empty=math.nan)
                    p99 = percentile(batch.first_ms, 99, empty=math.nan)
                    say(
                        f"round {rnd + 1}/{args.rounds} {mode:6} c={level:<3} {target.name:18} "
                        f"p50 {p50:6.2f} ms  p99 {p99:6.2f}"
                        f" ms  {rate:6.0f} req/s  fail {batch.failures}"
                    )
    steps: list[Step] = []
    climbing = list(live)
    for i, rate in enumerate(args.rates):
        for target in rotated(climbing, i):
            step = await open_step(target, rate, args)
            steps.append(step)
            say(
                f"rate {rate:5}/s {target.name:18} achieved {step.achieved:7.1f}/s  "
                f"p50 {step.p50_ms:7.2f} ms  p99 {step.p99_ms:7.2f} ms  "
                f"{'held' if step.held else 'NOT held'} {step.errors or ''}"
            )
            if not step.held:
                climbing.remove(target)
            await asyncio.sleep(args.settle_seconds)
        if not climbing:
            break
    return batches, steps


# --------------------------------------------------------------------------- report


def summarize(
    targets: list[Target],
    batches: list[Batch],
    steps: list[Step],
    mode: str,
    concurrency: int,
    rates: list[int],
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for target in targets:
        mine = [
            b
            for b in batches
            if b.target == target.name and b.mode == mode and b.concurrency == concurrency
        ]
        if target.skipped or not mine:
            rows.append({"target": target.name, "skipped": target.skipped or "no data"})
            continue
        first = [x for b in mine for x in b.first_ms]
        total = [x for b in mine for x in b.total_ms]
        requests = sum(b.requests for b in mine)
        failures = sum(b.failures for b in mine)
        held = [s.rate for s in steps if s.target == target.name and s.held]
        rows.append(
            {
                "target": target.name,
                "requests": requests,
                "failures": failures,
                "p50_ms": percentile(first, 50, empty=math.nan),
                "p99_ms": percentile(first, 99, empty=math.nan),
                "mean_ms": statistics.fmean(first) if first else float("nan"),
                "total_p50_ms": percentile(total, 50, empty=math.nan),
                "req_s": (requests - failures) / sum(b.wall_s for b in mine),
                "cpu_ms_per_req": 1000 * sum(b.cpu_s for b in mine) / requests,
                "round_p50_ms": [
                    round(percentile(b.first_ms, 50, empty=math.nan), 3) for b in mine
                ],
                "max_held_rate": max(held) if held else None,
                "held_top_rate": bool(held) and max(held) == max(rates, default=0),
                "errors": dict(sum((Counter(b.errors) for b in mine), Counter())),
            }
        )
    base = next((r for r in rows if r["target"] == DIRECT and "p50_ms" in r), None)
    for row in rows:
        if base is not None and "p50_ms" in row:
            row["added_p50_ms"] = row["p50_ms"] - base["p50_ms"]
            row["added_p99_ms"] = row["p99_ms"] - base["p99_ms"]
    return rows


def steps_rates(steps: list[Step]) -> list[int]:
    return sorted({s.rate for s in steps})


def render(rows: list[dict[str, Any]], mode: str, concurrency: int, with_rates: bool) -> str:
    what = "whole answer" if mode == "chat" else "time to first byte"
    what += f", concurrency {concurrency}"
    head = (
        f"| target | p50 ms | p99 ms | mean ms | added p50 ms | added p99 ms | req/s "
        f"| CPU ms/req | failures |{' max held rate |' if with_rates else ''}"
    )
    ncols = 10 if with_rates else 9
    lines = [f"{mode} ({what}):", "", head, "|" + "---|" * ncols]
    for r in rows:
        if "p50_ms" not in r:
            why = r["skipped"].replace("|", "/")
            why = why if len(why) <= 100 else why[:97] + "..."
            lines.append(f"| {r['target']} | not run: {why} |" + " - |" * (ncols - 2))
            continue
        added = (
            f"{r['added_p50_ms']:+.2f} | {r['added_p99_ms']:+.2f}"
            if "added_p50_ms" in r
            else "- | -"
        )
        rate = ""
        if with_rates:
            held = r["max_held_rate"]
            top = "+" if r["held_top_rate"] else ""
            rate = f" {'none' if held is None else f'{held}{top}'} |"
        lines.append(
            f"| {r['target']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['mean_ms']:.2f} "
            f"| {added} | {r['req_s']:.0f} | {r['cpu_ms_per_req']:.2f} | {r['failures']} |{rate}"
        )
    return "\n".join(lines) + "\n"


def against_targets(tables: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> str:
    """The issue's targets: the gateway's req/s over LiteLLM's at the highest concurrency
    (>= 5x), and its added p50 at the lowest (<= 1 ms), per mode, from this run's tables."""
    lines = ["against the targets (gateway with Redis; this run):", ""]
    low, high = min(args.concurrency), max(args.concurrency)
    for mode in args.modes:
        rows = {r["target"]: r for r in tables[f"{mode}@{high}"] if "req_s" in r}
        ours, theirs = rows.get(GATEWAY), rows.get(LITELLM)
        if ours and theirs and theirs["req_s"] > 0:
            ratio = ours["req_s"] / theirs["req_s"]
            verdict = "met" if ratio >= 5 else "NOT met"
            lines.append(
                f"- {mode}, concurrency {high}: {ours['req_s']:.0f} vs LiteLLM's "
                f"{theirs['req_s']:.0f} req/s = {ratio:.2f}x (target >= 5x: {verdict})"
            )
            scaled = next((r for n, r in rows.items() if n.startswith("gateway x")), None)
            if scaled is not None:
                lines.append(
                    f"  ({scaled['target']}: {scaled['req_s']:.0f} req/s = "
                    f"{scaled['req_s'] / theirs['req_s']:.2f}x LiteLLM's one process)"
                )
        low_rows = {r["target"]: r for r in tables[f"{mode}@{low}"] if "added_p50_ms" in r}
        if GATEWAY in low_rows:
            added = low_rows[GATEWAY]["added_p50_ms"]
            verdict = "met" if added <= 1.0 else "NOT met"
            lines.append(
                f"- {mode}, concurrency {low}: added p50 {added:+.2f} ms (target <= 1 ms: "
                f"{verdict})"
            )
            if MINIMAL in low_rows:
                hop = low_rows[MINIMAL]["added_p50_ms"]
                lines.append(
                    f"  (of which the hop itself, as the minimal proxy adds it: {hop:+.2f} ms;"
                    f" the gateway's own work: {added - hop:+.2f} ms)"
                )
    return "\n".join(lines) + "\n"


def render_steps(targets: list[Target], steps: list[Step]) -> str:
    rates = steps_rates(steps)
    if not rates:
        return ""
    lines = [
        "open loop (achieved req/s, p99 ms; * = held):",
        "",
        "| target | " + " | ".join(f"{r}/s" for r in rates) + " |",
        "|" + "---|" * (len(rates) + 1),
    ]
    for target in targets:
        if target.skipped:
            continue
        cells = []
        for rate in rates:
            step = next((s for s in steps if s.target == target.name and s.rate == rate), None)
            cells.append(
                "-"
                if step is None
                else f"{step.achieved:.0f}, {step.p99_ms:.0f}{'*' if step.held else ''}"
            )
        lines.append(f"| {target.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (~1 minute of load)")
    parser.add_argument(
        "--concurrency", default="1,16", help="closed-loop levels, comma separated (1,16)"
    )
    parser.add_argument("--requests", type=int, help="per target, mode and round (default 400)")
    parser.add_argument("--rounds", type=int, help="default 3")
    parser.add_argument("--modes", default="chat,stream", help="chat, stream or both")
    parser.add_argument("--rates", help="offered req/s steps (default 50,100,200,400,800)")
    parser.add_argument("--step-seconds", type=float, help="per rate step (default 3)")
    parser.add_argument("--p99-bound-ms", type=float, default=1000.0)
    parser.add_argument("--settle-seconds", type=float, default=0.5, help="pause between steps")
    parser.add_argument("--max-connections", type=int, default=256, help="open-loop client pool")
    parser.add_argument("--request-timeout", type=float, default=10.0)
    parser.add_argument("--batch-timeout", type=float, default=120.0, help="per closed batch")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--model", default=DEFAULT_SERVED_NAME, help="served model name")
    parser.add_argument("--upstream", help="a real OpenAI-compatible tier instead of the stub")
    parser.add_argument("--no-litellm", action="store_true", help="skip LiteLLM's proxy")
    parser.add_argument("--no-redis", action="store_true", help="skip the gateway with Redis")
    parser.add_argument(
        "--gateway-processes",
        type=int,
        default=2,
        help="one more target: this many gateway processes sharing Redis (1: none)",
    )
    parser.add_argument(
        "--trace-ratio",
        type=float,
        default=1.0,
        help="share of requests the gateway traces (default 1: every one)",
    )
    parser.add_argument("--startup-timeout", type=float, default=90.0)
    parser.add_argument("--install-timeout", type=float, default=900.0, help="LiteLLM's venv")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    parser.add_argument("--keep", action="store_true", help="keep the configs and server logs")
    parser.add_argument("--serve-stub", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    quick = args.quick
    args.requests = args.requests or (100 if quick else 400)
    args.rounds = args.rounds or (2 if quick else 3)
    args.step_seconds = args.step_seconds or (2.0 if quick else 3.0)
    rates = args.rates or ("50,100,200,400" if quick else "50,100,200,400,800")
    args.rates = sorted(int(r) for r in rates.split(",") if r.strip())
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or any(m not in MODES for m in args.modes):
        parser.error(f"--modes: give one or more of {', '.join(MODES)}")
    try:
        args.concurrency = sorted({int(c) for c in args.concurrency.split(",") if c.strip()})
    except ValueError:
        parser.error(f"--concurrency: comma separated integers, not {args.concurrency!r}")
    if not args.concurrency or min(args.concurrency) < 1:
        parser.error("--concurrency: give one or more levels >= 1")
    if args.requests < 1 or args.rounds < 1 or not args.rates:
        parser.error("--requests, --rounds and --rates must be positive")
    if not 0 < args.trace_ratio <= 1:
        parser.error(f"--trace-ratio: a share in (0, 1], not {args.trace_ratio:g}")
    return args


def main() -> int:
    args = parse_args()
    if args.serve_stub:
        serve_stub(args.serve_stub, args.model)
        return 0
    servers: list[Server] = []
    workdir = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    redis_prefix = f"mo:bench:{secrets.token_hex(4)}"
    loads = [os.getloadavg()]
    notes: list[str] = []
    try:
        targets = start_targets(args, workdir, servers, redis_prefix, notes)
        loads.append(os.getloadavg())
        say(f"load: {len(args.modes)} mode(s) x {args.rounds} rounds x {args.requests} requests")
        batches, steps = asyncio.run(run_load(targets, args))
        loads.append(os.getloadavg())
    finally:
        for server in reversed(servers):
            server.stop()
        if not args.no_redis:
            drop_redis_keys(redis_prefix)
    report(args, targets, batches, steps, notes, loads)
    if args.keep:
        say(f"configs and server logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def start_targets(
    args: argparse.Namespace,
    workdir: Path,
    servers: list[Server],
    redis_prefix: str,
    notes: list[str],
) -> list[Target]:
    """Start the stub (unless --upstream), both gateways and LiteLLM; each ready or skipped."""
    venv, litellm_why = (None, "--no-litellm") if args.no_litellm else ensure_litellm(args)
    if args.upstream:
        upstream = args.upstream.rstrip("/")
        why = wait_ready(None, f"{upstream}/health", args.startup_timeout)
        if why:
            raise SystemExit(f"--upstream {upstream}: /health {why}")
        notes.append(f"upstream: {upstream} (given)")
        targets = [Target(DIRECT, upstream)]
    else:
        port = free_port()
        cmd = [sys.executable, __file__, "--serve-stub", str(port), "--model", args.model]
        stub = start("stub", cmd, workdir, clean_env())
        servers.append(stub)
        upstream = f"http://{LOCAL}:{port}"
        why = wait_ready(stub, f"{upstream}/health", 30)
        if why:
            raise SystemExit(f"stub upstream did not start: {why}\n{stub.tail()}")
        notes.append(f"upstream: stub OpenAI server at {upstream} (uvicorn, one process)")
        targets = [Target(DIRECT, upstream, stub.process.pid)]

    targets.append(minimal_proxy(workdir, servers, upstream, args))
    if not targets[-1].skipped:
        notes.append(
            f"{MINIMAL}: benchmarks/minimal_proxy.py (the gateway's server stack and an aiohttp"
            " session, nothing else): what the extra hop costs by itself on this machine"
        )

    tokenizer = find_tokenizer_dir()
    traced = "every request" if args.trace_ratio == 1 else f"a share of {args.trace_ratio:g}"
    notes.append(f"gateway traces {traced} (spans made, not exported: no exporter is set)")
    notes.append(
        f"gateway tokenizer_dir: {tokenizer}"
        if tokenizer
        else f"gateway tokenizer_dir: none (no tokenizer.json under {cache_root() / 'models'}):"
        " the gateway bounds prompts by bytes"
    )
    variants = [(GATEWAY, redis_prefix), (GATEWAY_LOCAL, None)]
    for name, prefix in variants[1:] if args.no_redis else variants:
        config = write_gateway_config(workdir, upstream, args.model, tokenizer, prefix)
        port = free_port()
        cmd = [sys.executable, "-m", "gateway", "--config", str(config)]
        cmd += ["--host", LOCAL, "--port", str(port)]
        server = start(name, cmd, workdir, gateway_env(args.trace_ratio))
        servers.append(server)
        targets.append(ready_target(name, server, f"http://{LOCAL}:{port}", "/readyz", args))
        if not targets[-1].skipped:
            notes.append(f"{name} routes the benchmark prompt: {route_of(targets[-1].url, args)}")
    if not args.no_redis:
        notes.append(f"{GATEWAY}: redis_url {REDIS_URL}, redis_prefix {redis_prefix}")
    if not args.no_redis and args.gateway_processes > 1:
        targets.append(
            gateway_processes(args, workdir, servers, upstream, tokenizer, redis_prefix, notes)
        )

    if venv is None:
        targets.append(Target(LITELLM, skipped=litellm_why))
        return targets
    notes.append(
        f"{LITELLM} {litellm_version(venv)} ({venv}): 1 worker (its default, uvicorn), no master"
        " key, no database, telemetry vetoed, local model-cost map"
    )
    config = write_litellm_config(workdir, upstream, args.model)
    port = free_port()
    cmd = [str(venv / "bin" / "litellm"), "--config", str(config)]
    cmd += ["--host", LOCAL, "--port", str(port)]
    server = start(LITELLM, cmd, workdir, litellm_env())
    servers.append(server)
    targets.append(ready_target(LITELLM, server, f"http://{LOCAL}:{port}", "", args))
    return targets


def minimal_proxy(
    workdir: Path, servers: list[Server], upstream: str, args: argparse.Namespace
) -> Target:
    """benchmarks/minimal_proxy.py in front of ``upstream``, ready or skipped."""
    port = free_port()
    cmd = [sys.executable, str(ROOT / "benchmarks" / "minimal_proxy.py"), upstream, str(port)]
    server = start(MINIMAL, cmd, workdir, clean_env())
    servers.append(server)
    return ready_target(MINIMAL, server, f"http://{LOCAL}:{port}", "", args)


def gateway_processes(
    args: argparse.Namespace,
    workdir: Path,
    servers: list[Server],
    upstream: str,
    tokenizer: Path | None,
    redis_prefix: str,
    notes: list[str],
) -> Target:
    """--gateway-processes gateways with Redis, one config, one Redis prefix: the way a machine
    (or a Kubernetes Deployment) scales the gateway past one core; the load alternates."""
    name = f"gateway x{args.gateway_processes}"
    config = write_gateway_config(workdir, upstream, args.model, tokenizer, redis_prefix)
    started: list[Target] = []
    for i in range(args.gateway_processes):
        port = free_port()
        cmd = [sys.executable, "-m", "gateway", "--config", str(config)]
        cmd += ["--host", LOCAL, "--port", str(port)]
        server = start(f"{name} {i + 1}", cmd, workdir, gateway_env(args.trace_ratio))
        servers.append(server)
        started.append(ready_target(name, server, f"http://{LOCAL}:{port}", "/readyz", args))
    skipped = [t.skipped for t in started if t.skipped]
    if skipped:
        return Target(name, skipped=skipped[0])
    notes.append(
        f"{name}: {args.gateway_processes} gateway processes sharing Redis (prefix "
        f"{redis_prefix}); the client alternates connections between them"
    )
    first, rest = started[0], started[1:]
    return Target(name, first.url, first.pid, more=[(t.url, t.pid) for t in rest])


def route_of(url: str, args: argparse.Namespace) -> str:
    """The gateway's x-route-* headers for the benchmark's request."""
    body = request_body(args.model, False, args.max_tokens)
    try:
        with httpx.Client(timeout=10, trust_env=False) as client:
            resp = client.post(f"{url}/v1/chat/completions", content=body, headers=HEADERS)
    except httpx.HTTPError as exc:
        return f"({type(exc).__name__})"
    got = {k: resp.headers.get(f"x-route-{k}", "?") for k in ("class", "tier", "reason")}
    return f"class {got['class']}, tier {got['tier']} ({got['reason']})"


def ready_target(
    name: str, server: Server, url: str, probe_path: str, args: argparse.Namespace
) -> Target:
    """The started server as a target once it is ready: ``probe_path`` answers 200, then a chat
    request succeeds; a skipped target (its log on stderr) if not within --startup-timeout."""
    deadline = time.monotonic() + args.startup_timeout
    chat = {"model": args.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    why = wait_ready(server, f"{url}{probe_path}", args.startup_timeout) if probe_path else ""
    left = max(5.0, deadline - time.monotonic())
    why = why or wait_ready(server, f"{url}/v1/chat/completions", left, post=chat)
    if why:
        say(f"{name} did not start: {why}\n--- its log ({server.log}) ---\n{server.tail(60)}\n---")
        server.stop()
        return Target(name, skipped=why)
    say(f"{name} ready at {url}")
    return Target(name, url, server.process.pid)


def report(
    args: argparse.Namespace,
    targets: list[Target],
    batches: list[Batch],
    steps: list[Step],
    notes: list[str],
    loads: list[tuple[float, float, float]],
) -> None:
    tables = {
        f"{mode}@{level}": summarize(targets, batches, steps, mode, level, args.rates)
        for mode in args.modes
        for level in args.concurrency
    }
    for i, (name, rows) in enumerate(tables.items()):
        mode, level = name.split("@")
        print(render(rows, mode, int(level), with_rates=i == 0))
    print(against_targets(tables, args))
    print(render_steps(targets, steps))
    print("parameters:")
    print(
        f"- closed loop: concurrency {', '.join(map(str, args.concurrency))}, {args.requests}"
        " requests per target, "
        f"mode and round, {args.rounds} rounds (target order rotated each round), "
        f"max_tokens {args.max_tokens}, prompt {PROMPT!r} + ' (<batch>-<n>)', "
        "each request's own"
    )
    print(
        f"- open loop: rates {', '.join(map(str, args.rates))} req/s, {args.step_seconds:g} s each;"
        f" held = every request answered, >= {HELD_SHARE:.0%} of the rate, p99 <= "
        f"{args.p99_bound_ms:g} ms (latency from the scheduled send time); '+' = held every rate"
        " tried"
    )
    print(
        "- CPU ms/req: the target server's process tree (user + system) during its closed-loop"
        " batches; Redis's own CPU is not counted"
    )
    for note in notes:
        print(f"- {note}")
    print(
        f"- machine: {os.cpu_count()} CPUs, load average (1 min) before / after start / after "
        f"load: {' / '.join(f'{x[0]:.2f}' for x in loads)}; client, servers and Redis share it"
    )
    if args.json:
        raw = {
            "parameters": {k: v for k, v in vars(args).items() if k != "json"},
            "notes": notes,
            "load_average": loads,
            "summary": tables,
            "batches": [asdict(b) for b in batches],
            "steps": [asdict(s) for s in steps],
            "targets": [asdict(t) for t in targets],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(raw, indent=1, default=str), encoding="utf-8")
        say(f"raw figures in {args.json}")


if __name__ == "__main__":
    sys.exit(main())
