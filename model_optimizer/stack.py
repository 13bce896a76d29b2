"""``model-optimizer up``: model → variants → supervised vLLM tiers → gateway, stopped as one.

Phases: check ports, build the variants (cached: a no-op when model, recipe and tools are
unchanged), resolve the deployment spec into one launch per tier, start the tiers in turn
(each healthy and warm before the next: vLLM's memory profiling breaks when two start at once
on one GPU), serve the gateway until SIGINT/SIGTERM, then stop every tier's process group.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import httpx
import uvicorn

from backends.platform import (
    dtype_reason,
    emulation_reason,
    machine_flags,
    native_precisions,
    serving_dtype,
)
from backends.process import reserve_port
from backends.spec import AdmissionSpec, load_spec, resolve_tiers
from backends.supervisor import RestartPolicy, Supervisor
from backends.vllm_args import LOOPBACK, TierLaunch
from gateway.app import create_app, load_policies
from gateway.config import (
    TIER_KEY_ENV,
    GatewayConfig,
    MeasuredTier,
    TierEndpoint,
    keys_from_environment,
)
from gateway.policy.store import PolicyStore
from gateway.server import log_config, server_options
from model_optimizer.envs import ROOT, cache_lock, cache_root, env_python, has_nvidia_gpu
from model_optimizer.models import AlreadyReported, ModelError
from model_optimizer.optimize import installed_vllm, run_in_optimize_env, run_optimize
from model_optimizer.progress import TierStarts
from model_optimizer.serving_check import (
    Admission,
    admission_key,
    admission_probes,
    admit,
    apply_cached_modes,
    cache_file,
    load_cached,
    machine_identity,
    measure_speeds,
    print_admission,
    record_measurements,
    save,
    variant_digest,
)

DEFAULT_SERVED_NAME = "SmolLM2-135M-Instruct"
DEFAULT_SPEC = ROOT / "policies" / "deploy" / "tiers.yaml"
DEFAULT_POLICY = ROOT / "policies" / "routing.yaml"


@dataclass(frozen=True)
class UpOptions:
    model: str = "default"
    served_model_name: str | None = None
    gateway_port: int = 8000
    tier_port: int | None = None  # first tier's port; the others follow (None: the spec's)
    tiers: tuple[str, ...] = ()  # a subset of the spec's tiers (empty: all)
    spec: Path = DEFAULT_SPEC
    recipe: str | None = None
    variants: Path | None = None  # serve these pre-built variants instead of building them
    policy: Path = DEFAULT_POLICY  # the gateway's routing policy (reloaded when edited)
    redis_url: str | None = (
        "redis://127.0.0.1:6379/0"  # shared state; unreachable → local state, logged once
    )


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


def tier_key(environ: Mapping[str, str]) -> str:
    """The key the tier guard (backends/tier_guard.py) wants on the tiers' control routes:
    ``MO_TIER_API_KEY`` when set (tools that call those routes themselves), else a fresh random
    one for this run. It travels in the tiers' environment only and is never printed."""
    return environ.get(TIER_KEY_ENV, "").strip() or secrets.token_urlsafe(32)


def _raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _say(message: str) -> None:
    print(f"up: {message}", file=sys.stderr, flush=True)


def warm_up(launch: TierLaunch, requests: int = 2) -> None:
    """Tiny completions so the first user request does not pay first-call costs."""
    url = f"http://{launch.host}:{launch.port}/v1/completions"
    body = {"model": launch.served_model_name, "prompt": "Hello", "max_tokens": 4}
    with httpx.Client(timeout=120, trust_env=False) as client:
        for _ in range(requests):
            client.post(url, json=body).raise_for_status()


def phase_variants(opts: UpOptions, name: str) -> Path:
    """The model's fp16/int8/int4 variants in the cache (built once, then a no-op)."""
    if opts.variants is not None:
        if not opts.variants.is_dir():
            raise ModelError(f"variants folder not found: {opts.variants}")
        return opts.variants
    folder = cache_root() / "variants" / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Another up (or a test run's) may be building the same folder: one after the other, the
    # second then finds them up to date.
    lock = folder.parent / f".{name}.lock"
    with cache_lock(lock, lambda: _say(f"waiting for another run building {folder} ...")):
        code = run_optimize(opts.model, str(folder), opts.recipe, None, 1, None)
    if code != 0:
        raise AlreadyReported(code)  # the optimizer said why, in one line
    return folder


def phase_launches(opts: UpOptions, name: str, variants: Path) -> list[TierLaunch]:
    """The spec's tiers (or the --tiers subset) resolved against the variants."""
    spec = load_spec(opts.spec)
    if opts.tiers:
        unknown = set(opts.tiers) - {tier.name for tier in spec.tiers}
        if unknown:
            raise ModelError(f"--tiers names unknown tier(s): {', '.join(sorted(unknown))}")
        spec = spec.model_copy(update={"tiers": [t for t in spec.tiers if t.name in opts.tiers]})
    scaled = [f"{t.name} ({t.replicas})" for t in spec.tiers if t.replicas > 1]
    if scaled:
        _say(f"one server per tier: replicas of {', '.join(scaled)} are for deploy kubernetes")
    device = "cuda" if has_nvidia_gpu() else "cpu"
    launches = resolve_tiers(
        spec.model_copy(update={"model_name": name}),
        variants,
        device,
        installed_vllm(),
        os.cpu_count() or 1,
    )
    if opts.tier_port is not None:
        launches = [
            dataclasses.replace(launch, port=opts.tier_port + i)
            for i, launch in enumerate(launches)
        ]
    return launches


def emulated_copy(launch: TierLaunch, variants: Path) -> TierLaunch:
    """``launch`` served from its variant's dequantized copy (built once, beside the variants
    folder: that one holds only the optimizer's output)."""
    copy = variants.with_name(f"{variants.name}.emulated") / launch.name
    code = run_in_optimize_env(
        ["emulate", "--variant", str(launch.model_dir), "--output", str(copy)]
    )
    if code != 0:
        raise AlreadyReported(code)
    return dataclasses.replace(launch, model_dir=copy)


def phase_emulation(launches: list[TierLaunch], variants: Path, device: str) -> list[TierLaunch]:
    """Tiers whose format has no kernel here serve a dequantized copy (said out loud); every
    tier gets the ``--dtype`` this machine needs (backends/platform.py says why). These are
    priors: the admission check (model_optimizer/serving_check.py) measures what they missed."""
    flags = machine_flags()
    native = native_precisions(device, flags)
    dtype = serving_dtype(device, flags)
    if dtype is not None:
        _say(f"tiers run as {dtype}: {dtype_reason(flags)}")
    out = []
    for launch in launches:
        launch = dataclasses.replace(launch, dtype=launch.dtype or dtype)
        if launch.name in native:
            out.append(launch)
            continue
        copy = emulated_copy(launch, variants)
        _say(
            f"tier {launch.name}: {emulation_reason(launch.name, flags)}; serving it emulated "
            f"from {copy.model_dir} (weights on the {launch.name} grid, dequantized: the same "
            "weights, no memory saving)"
        )
        out.append(copy)
    return out


def phase_admission(
    launches: list[TierLaunch],
    variants: Path,
    spec: AdmissionSpec,
    supervisor: Supervisor,
    key: str,
    cached: Admission | None,
) -> tuple[list[TierLaunch], Admission | None]:
    """The in-engine check of the running tiers (cached per machine, engine and variants)."""
    if not spec.enabled or len(launches) < 2:
        return launches, None
    if cached is not None:
        _say(f"admission: cached verdicts ({cache_file(key)})")
        print_admission(cached)
        return launches, cached

    def emulate(launch: TierLaunch) -> TierLaunch:
        return emulated_copy(launch, variants)

    def restart(launch: TierLaunch) -> None:
        supervisor.replace(launch.name, launch)

    launches, admission = admit(launches, spec, admission_probes(), emulate, restart, _say)
    _say("measuring each tier's speed (measure/speed.py) ...")
    speeds = measure_speeds(launches, launches[0].model_dir)
    admission = dataclasses.replace(admission, speeds=speeds)
    save(key, admission)
    print_admission(admission)
    return launches, admission


def spec_tiers(spec: Path) -> list[str]:
    """Every tier the deployment spec declares (a policy may name them all)."""
    return [tier.name for tier in load_spec(spec).tiers]


def gateway_config(
    opts: UpOptions, name: str, launches: list[TierLaunch], admission: Admission | None = None
) -> GatewayConfig:
    """The gateway in front of ``launches``: the policy, the fp16 variant's tokenizer (all
    variants share it), each tier's max_model_len, Redis, and keys from the environment."""
    verdicts = admission.verdicts if admission else {}
    tiers = [
        TierEndpoint(
            name=t.name,
            base_url=f"http://{t.host}:{t.port}",
            max_model_len=t.max_model_len,
            classes=list(verdicts[t.name].admitted_classes()) if t.name in verdicts else None,
            admission=verdicts[t.name].summary() if t.name in verdicts else None,
            api_key=t.api_key,
        )
        for t in launches
    ]
    config = GatewayConfig(
        model_name=name,
        tiers=tiers,
        policy_path=str(opts.policy),
        tokenizer_dir=str(launches[0].model_dir),
        redis_url=opts.redis_url or None,
        policy_extra_tiers=[t for t in spec_tiers(opts.spec) if t not in {x.name for x in tiers}],
        measured={k: MeasuredTier(**v) for k, v in admission.measured().items()}
        if admission
        else {},
        reference_tier=admission.reference if admission else None,
    )
    return keys_from_environment(config)


def run_up(opts: UpOptions) -> int:
    """Bring the stack up and serve until interrupted. Raises on any start failure."""
    name = opts.served_model_name or served_name(opts.model)
    # Held from now on: starting the tiers takes minutes, and vLLM binds random free ports.
    gateway_socket = reserve_port(LOOPBACK, opts.gateway_port)
    try:
        return _run_up(opts, name, gateway_socket)
    finally:
        gateway_socket.close()


def _run_up(opts: UpOptions, name: str, gateway_socket: socket.socket) -> int:
    _say(f"variants of {opts.model} ...")
    variants = phase_variants(opts, name)
    device = "cuda" if has_nvidia_gpu() else "cpu"
    launches = phase_emulation(phase_launches(opts, name, variants), variants, device)
    # Each tier's port is held until just before its tier starts: the tiers start in turn over
    # minutes, and the first ones' vLLM processes (or another run's) bind random free ports.
    held: dict[int, socket.socket] = {}
    try:
        for launch in launches:
            held[launch.port] = reserve_port(launch.host, launch.port)
        return _serve(opts, name, gateway_socket, variants, launches, held)
    finally:
        for sock in held.values():
            sock.close()


def _release(held: dict[int, socket.socket], launch: TierLaunch) -> None:
    sock = held.pop(launch.port, None)
    if sock is not None:
        sock.close()


def _serve(
    opts: UpOptions,
    name: str,
    gateway_socket: socket.socket,
    variants: Path,
    launches: list[TierLaunch],
    held: dict[int, socket.socket],
) -> int:
    device = "cuda" if has_nvidia_gpu() else "cpu"
    # A bad policy (or one naming tiers the spec does not have) stops us before any tier runs.
    PolicyStore(opts.policy, spec_tiers(opts.spec)).load()
    spec = load_spec(opts.spec)
    digests = {t.name: variant_digest(variants / t.name) for t in launches}
    key = admission_key(
        launches,
        digests,
        installed_vllm(),
        machine_identity(device),
        spec.admission,
        admission_probes(),
    )
    cached = load_cached(key) if spec.admission.enabled else None
    launches = apply_cached_modes(launches, cached, lambda t: emulated_copy(t, variants))
    secret = tier_key(os.environ)
    launches = [dataclasses.replace(launch, api_key=secret) for launch in launches]
    supervisor = Supervisor(
        launches,
        env_python("serve"),
        cache_root() / "logs",
        RestartPolicy(**spec.restart.model_dump()),
        warm_up=lambda launch: warm_up(launch, spec.warmup_requests),
        start_timeout=spec.start_timeout_s,
        before_start=lambda launch: _release(held, launch),
    )
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        with TierStarts(sys.stderr, total=len(launches)) as starts:
            supervisor.start_all(on_tick=starts.tick)
        for launch in launches:
            _say(f"tier {launch.name} ready on http://{launch.host}:{launch.port}")
        launches, admission = phase_admission(
            launches, variants, spec.admission, supervisor, key, cached
        )
        config = gateway_config(opts, name, launches, admission)
        floors = {str(k): v for k, v in spec.admission.floors.items()}
        written = record_measurements(opts.gateway_port, config, floors)
        if written is not None:
            _say(f"measured figures in {written} (read by policy check and eval routing)")
        for derived in load_policies(config).active.derived.values():
            _say(f"route {derived.describe()}")
        app = create_app(
            config,
            supervisor_states=supervisor.states,
            tier_pids=supervisor.pids,
        )
        _say(f"gateway on http://{LOOPBACK}:{opts.gateway_port}/v1 — try:")
        print(f"  {curl_example(opts.gateway_port, name)}", file=sys.stderr, flush=True)
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=LOOPBACK,
                port=opts.gateway_port,
                timeout_graceful_shutdown=5,
                log_config=log_config(),
                **server_options(config),
            )
        )
        server.run(sockets=[gateway_socket])
    finally:
        _say("stopping tiers ...")
        supervisor.stop_all()
    return 0


class StackLauncher:
    """``up``'s way to launch one tier, for ``bench --ablation`` (measure.ablation.TierLauncher):
    the CLI hands it to measure, which never imports model_optimizer."""

    def launch(self, model: str, tier: str) -> TierLaunch:
        variants = cache_root() / "variants" / model
        device = "cuda" if has_nvidia_gpu() else "cpu"
        launches = phase_launches(UpOptions(tiers=(tier,)), model, variants)
        return phase_emulation(launches, variants, device)[0]

    def warm_up(self, launch: TierLaunch) -> None:
        warm_up(launch)
