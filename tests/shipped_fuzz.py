"""The gateway as ``up`` ships it, fuzzed by schemathesis over stub tiers on 127.0.0.1.

As shipped: ``model_optimizer.stack.gateway_config`` (what ``up`` builds) with the shipped
routing policy (policies/routing.yaml: the trained classifier, token limits, cost bounds), the
tiers of policies/deploy/tiers.yaml at the variants' ``max_model_len`` (2048), the default
body limit (1 MB) and every other default, and the real tokenizer of the embedded default
model. Only Redis is off (local state) and the tiers are stubs (tests/stub_tier.py).

Cases come from the gateway's own ``/openapi.json`` (as served: the served model, the policy's
bound on list prompts) in two modes, counted apart:
``positive`` (valid by the document) must get a 2xx or one of the 4xx the document allows a
valid request (``ALLOWED_FOR_VALID``); ``negative`` (invalid by the document) must get a 4xx.
Never a 5xx; every 4xx in OpenAI's error shape, its message one line.

Used by tests/unit/gateway/test_gateway_fuzz.py (a few hundred cases, in CI) and
benchmarks/bench_fuzz.py (10,000 and more, figures in docs/reliability.md).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from schemathesis import GenerationMode

from backends.launch import TierLaunch
from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.server import server_options
from model_optimizer.envs import cache_root
from model_optimizer.models import materialize
from model_optimizer.stack import gateway_config, spec_tiers
from model_optimizer.tier_setup import DEFAULT_SPEC, UpOptions
from tests.fuzz_shapes import derive
from tests.servers import ServerThread
from tests.stub_tier import StubTier

MODEL = "SmolLM2-135M-Instruct"  # the embedded default's served name (model_optimizer.stack)
MAX_MODEL_LEN = 2048  # the default model's variants (kv_cache_config.json)
OPERATIONS = (
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
    ("/v1/models", "GET"),
)
MODES = {"positive": GenerationMode.POSITIVE, "negative": GenerationMode.NEGATIVE}
SHAPE_EVERY = 3  # every third valid case also sends the shapes derived from it (fuzz_shapes)
# The 4xx a request valid by the document may get, with the `code` that says why (over a
# limit of the policy or the body limit); anything else is a finding.
ALLOWED_FOR_VALID = {
    (400, "context_length_exceeded"),  # prompt over limits.max_input_tokens (1536)
    (413, "request_too_large"),  # body over max_body_bytes (1 MB)
    (400, "request_too_large"),  # body over max_body_values (65,536 JSON values)
}


def default_tokenizer_dir() -> Path:
    """The embedded default model's Hugging Face folder (its tokenizer.json and chat
    template): the copy ``up`` converted into the cache, else converted now in the optimize
    environment (``model_optimizer.models.materialize``, as ``up`` does; ~1 min once)."""
    found = sorted(
        (p.parent for p in (cache_root() / "models").glob(f"{MODEL}-*/tokenizer.json")),
        key=lambda p: p.stat().st_mtime,
    )
    return found[-1] if found else materialize("default")


def shipped_config(tier_urls: dict[str, str], tokenizer_dir: Path) -> GatewayConfig:
    """``up``'s gateway configuration over ``tier_urls`` (name -> URL), without Redis."""
    launches = [
        TierLaunch(
            name=name,
            model_dir=tokenizer_dir,
            served_model_name=MODEL,
            port=int(urlsplit(url).port or 0),
            max_model_len=MAX_MODEL_LEN,
        )
        for name, url in tier_urls.items()
    ]
    return gateway_config(UpOptions(redis_url=None), MODEL, launches)


@contextmanager
def shipped_gateway(tokenizer_dir: Path) -> Iterator[tuple[str, list[StubTier]]]:
    """The gateway as shipped on 127.0.0.1 over one stub tier per tier of the spec; yields
    its URL and the stubs. Everything is stopped on exit."""
    servers: list[ServerThread] = []
    try:
        stubs: dict[str, StubTier] = {}
        for name in spec_tiers(DEFAULT_SPEC):
            stub = StubTier(model=MODEL)
            server = ServerThread(stub.app)
            server.start()
            servers.append(server)
            stub.url = server.url
            stubs[name] = stub
        config = shipped_config({n: s.url for n, s in stubs.items()}, tokenizer_dir)
        gateway = ServerThread(create_app(config), **server_options(config))
        gateway.start()
        servers.append(gateway)
        yield gateway.url, list(stubs.values())
    finally:
        for server in reversed(servers):
            server.stop()


@dataclass
class Tally:
    """What the fuzzer sent and got, per mode."""

    statuses: dict[str, Counter[int]] = field(default_factory=dict)
    codes: dict[str, Counter[str]] = field(default_factory=dict)  # "<status> <error code>"
    forwarded: Counter[str] = field(default_factory=Counter)  # cases a stub tier received
    findings: list[str] = field(default_factory=list)
    shapes: Counter[str] = field(default_factory=Counter)  # "<shape> <status>"
    seconds: float = 0.0

    def cases(self, mode: str | None = None) -> int:
        modes = [mode] if mode else list(self.statuses)
        shaped = sum(self.shapes.values()) if mode is None else 0
        return shaped + sum(sum(self.statuses.get(m, Counter()).values()) for m in modes)

    def server_errors(self) -> int:
        shaped = sum(n for k, n in self.shapes.items() if int(k.rsplit(" ", 1)[1]) >= 500)
        return shaped + sum(n for c in self.statuses.values() for s, n in c.items() if s >= 500)

    def summary(self) -> dict[str, Any]:
        return {
            "cases": self.cases(),
            "seconds": round(self.seconds, 1),
            "server_errors": self.server_errors(),
            "findings": len(self.findings),
            **{
                mode: {
                    "cases": self.cases(mode),
                    "statuses": dict(sorted(self.statuses[mode].items())),
                    "codes": dict(self.codes[mode].most_common()),
                    "reached_a_tier": self.forwarded[mode],
                }
                for mode in self.statuses
            },
            "shapes": dict(sorted(self.shapes.items())),
        }


def judge(mode: str, status: int, body: Any) -> str | None:
    """Why this answer is wrong for a case of ``mode``, or None."""
    if status >= 500:
        return f"{status} (a 5xx)"
    if status < 400:
        return "a 2xx to an invalid request" if mode == "negative" else None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or set(body) != {"error"}:
        return f"{status} not in OpenAI's error shape"
    if set(error) != {"message", "type", "param", "code"} or "\n" in str(error["message"]):
        return f"{status} error fields {sorted(error)} or a multi-line message"
    if mode == "positive" and (status, error["code"]) not in ALLOWED_FOR_VALID:
        return f"{status} {error['code']} to a valid request: {error['message'][:200]}"
    return None


def fuzz(
    gateway: str,
    stubs: list[StubTier],
    examples: int,
    seed: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Tally:
    """Up to ``examples`` cases per operation and mode (``/v1/models`` has no input: positive
    only), sent one at a time to ``gateway``; ``seed`` None: the same cases every run."""
    with httpx.Client(trust_env=False, timeout=30) as client:
        document = client.get(f"{gateway}/openapi.json").raise_for_status().json()
    schema = schemathesis.openapi.from_dict(document)
    tally = Tally()
    started = time.monotonic()
    for path, method in OPERATIONS:
        operation = schema[path][method]
        for mode, generation in MODES.items():
            if method == "GET" and mode == "negative":
                continue
            send = _sender(tally, gateway, stubs, mode, f"{method} {path}")
            run = settings(
                max_examples=examples,
                deadline=None,
                database=None,
                derandomize=seed is None,
                suppress_health_check=list(HealthCheck),
            )(given(operation.as_strategy(generation_mode=generation))(send))
            if seed is not None:
                run = hypothesis_seed(seed)(run)
            run()
            if progress:
                progress(f"{mode} {method} {path}: {tally.cases()} cases so far")
    tally.seconds = time.monotonic() - started
    return tally


def _sender(
    tally: Tally, gateway: str, stubs: list[StubTier], mode: str, what: str
) -> Callable[[Any], None]:
    statuses = tally.statuses.setdefault(mode, Counter())
    codes = tally.codes.setdefault(mode, Counter())
    sent = [0]

    def send(case: Any) -> None:
        before = sum(len(s.requests) for s in stubs)
        response = case.call(base_url=gateway, timeout=30)
        body = _json(response)
        statuses[response.status_code] += 1
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            codes[f"{response.status_code} {error.get('code')}"] += 1
        if sum(len(s.requests) for s in stubs) > before:
            tally.forwarded[mode] += 1
        finding = judge(mode, response.status_code, body)
        if finding:
            tally.findings.append(f"{mode} {what}: {finding}; sent {repr(case.body)[:300]}")
        sent[0] += 1
        if mode == "positive" and sent[0] % SHAPE_EVERY == 1:
            _send_shapes(tally, gateway, stubs, case, sent[0] // SHAPE_EVERY)

    return send


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _send_shapes(tally: Tally, gateway: str, stubs: list[StubTier], case: Any, index: int) -> None:
    """The shapes derived from the valid ``case`` (tests/fuzz_shapes.py), each judged as what
    it must be: "refused" as a negative case that must not reach a tier, "valid" as a
    positive one."""
    headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "content-length"}
    headers["content-type"] = "application/json"
    url = f"{gateway}{case.operation.path}"
    with httpx.Client(trust_env=False, timeout=30) as client:
        for shape in derive(case.operation.path, case.body, index):
            before = sum(len(s.requests) for s in stubs)
            response = client.post(url, content=shape.content, headers=headers)
            tally.shapes[f"{shape.name} {response.status_code}"] += 1
            mode = "negative" if shape.expect == "refused" else "positive"
            finding = judge(mode, response.status_code, _json(response))
            if shape.expect == "refused" and sum(len(s.requests) for s in stubs) > before:
                finding = finding or "reached a tier"
            if finding:
                sent = shape.content[:200]
                tally.findings.append(f"shape {shape.name}: {finding}; sent {sent!r}")
