"""``model-optimizer up``: model → vLLM tier(s) → gateway on loopback, stopped as one.

Phases: resolve the model, check ports, start tiers in turn (each waits for /health before the
next: vLLM's memory profiling breaks when two start at once on one GPU), serve the gateway
until SIGINT/SIGTERM, then stop every tier's whole process group.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import uvicorn

from backends.process import TierProcess, check_port_free
from backends.vllm_args import LOOPBACK, TierLaunch
from gateway.app import create_app
from gateway.config import GatewayConfig, TierEndpoint
from model_optimizer.envs import cache_root, env_python
from model_optimizer.models import materialize

DEFAULT_SERVED_NAME = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class UpOptions:
    model: str = "default"
    served_model_name: str | None = None
    gateway_port: int = 8000
    tier_port: int = 8101
    max_model_len: int = 2048
    start_timeout: float = 300.0


def served_name(model: str) -> str:
    """The public model id: the embedded default's name, else the folder or file stem."""
    return DEFAULT_SERVED_NAME if model == "default" else Path(model).name.split(".")[0]


def curl_example(port: int, model: str) -> str:
    body = (
        f'{{"model": "{model}", "messages": '
        '[{"role": "user", "content": "What is the capital of France?"}]}'
    )
    return (
        f"curl -s http://{LOOPBACK}:{port}/v1/chat/completions "
        f"-H 'content-type: application/json' -d '{body}'"
    )


def _raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _progress(name: str) -> Callable[[float], None]:
    def tick(elapsed: float) -> None:
        print(f"\rup: tier {name} starting ... {elapsed:4.0f}s", end="", file=sys.stderr)

    return tick


def run_up(opts: UpOptions) -> int:
    """Bring the stack up and serve until interrupted. Raises on any start failure."""
    name = opts.served_model_name or served_name(opts.model)
    check_port_free(LOOPBACK, opts.gateway_port)
    check_port_free(LOOPBACK, opts.tier_port)
    print(f"up: resolving model {opts.model} ...", file=sys.stderr, flush=True)
    model_dir = materialize(opts.model)
    launch = TierLaunch(
        name="fp16",
        model_dir=model_dir,
        served_model_name=name,
        port=opts.tier_port,
        max_model_len=opts.max_model_len,
    )
    tier = TierProcess(launch, env_python("serve"), cache_root() / "logs" / "tier-fp16.log")
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    tier.start()
    try:
        tier.wait_ready(opts.start_timeout, on_tick=_progress(launch.name))
        print(f"\nup: tier fp16 ready on {tier.base_url}", file=sys.stderr)
        config = GatewayConfig(
            model_name=name, tiers=[TierEndpoint(name=launch.name, base_url=tier.base_url)]
        )
        print(
            f"up: gateway on http://{LOOPBACK}:{opts.gateway_port}/v1 — try:\n"
            f"  {curl_example(opts.gateway_port, name)}",
            file=sys.stderr,
            flush=True,
        )
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(config),
                host=LOOPBACK,
                port=opts.gateway_port,
                timeout_graceful_shutdown=5,
            )
        )
        server.run()
    finally:
        print("up: stopping tiers ...", file=sys.stderr)
        tier.stop()
    return 0
