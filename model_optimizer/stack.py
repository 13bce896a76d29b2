"""``model-optimizer up``: model → variants → supervised tiers → gateway, stopped as one.

Phases: check ports, choose the engine (vLLM on a GPU, llama.cpp on a CPU-only host, or as
asked), build the variants (cached: a no-op when model, recipe and tools are unchanged),
resolve the deployment spec into one launch per tier (model_optimizer/tier_setup.py), start
the tiers in turn (each healthy and warm before the next: vLLM's memory profiling breaks when
two start at once on one GPU), check them in the engine and time them
(model_optimizer/serving_check.py), serve the gateway until SIGINT/SIGTERM, then stop every
tier's process group.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

import uvicorn

from backends.launch import LOOPBACK, VLLM, TierLaunch
from backends.process import reserve_port
from backends.spec import AdmissionSpec, load_spec
from backends.supervisor import RestartPolicy, Supervisor
from gateway.app import create_app, load_policies
from gateway.config import (
    TIER_KEY_ENV,
    GatewayConfig,
    MeasuredTier,
    MeasurementConfig,
    TierEndpoint,
    keys_from_environment,
)
from gateway.policy.store import PolicyStore
from gateway.server import log_config, server_options
from model_optimizer.envs import cache_root
from model_optimizer.models import ModelError
from model_optimizer.progress import TierStarts
from model_optimizer.serving_check import (
    Admission,
    admission_key,
    admission_probes,
    admit,
    apply_cached_modes,
    cache_file,
    is_emulated,
    load_cached,
    machine_identity,
    measure_speeds,
    print_admission,
    record_measurements,
    save,
    variant_digest,
)
from model_optimizer.tier_setup import (
    DEFAULT_SERVED_NAME,
    UpOptions,
    chosen_spec,
    device,
    emulated_copy,
    engine_versions,
    engines_used,
    phase_emulation,
    phase_engine,
    phase_launches,
    phase_variants,
    programs,
    say,
    warm_up,
)


def served_name(model: str) -> str:
    """The public model id: the embedded default's name, else the folder or file stem."""
    return DEFAULT_SERVED_NAME if model == "default" else Path(model).name.split(".")[0]


def curl_example(port: int, model: str) -> str:
    body = (
        f'{{"model": "{model}", "messages": '
        '[{"role": "user", "content": "Which city is the capital of France?"}]}'
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


def phase_admission(
    launches: list[TierLaunch],
    variants: Path | None,
    spec: AdmissionSpec,
    supervisor: Supervisor,
    key: str,
    cached: Admission | None,
) -> tuple[list[TierLaunch], Admission | None]:
    """The in-engine check of the running tiers (cached per machine, engine and variants)."""
    if not spec.enabled or len(launches) < 2:
        return launches, None
    if cached is not None:
        say(f"admission: cached verdicts ({cache_file(key)})")
        print_admission(cached)
        return launches, cached

    def emulate(launch: TierLaunch) -> TierLaunch:
        if variants is None:  # llama.cpp tiers are never emulated (serving_check.EMULABLE)
            raise ModelError(f"tier {launch.name}: no vLLM variants to emulate it from")
        return emulated_copy(launch, variants)

    def restart(launch: TierLaunch) -> None:
        supervisor.replace(launch.name, launch)

    launches, admission = admit(launches, spec, admission_probes(), emulate, restart, say)
    say("measuring each tier's speed (measure/speed.py) ...")
    speeds = measure_speeds(launches, launches[0].model_dir)
    admission = dataclasses.replace(admission, speeds=speeds)
    save(key, admission)
    print_admission(admission)
    return launches, admission


def spec_tiers(spec: Path) -> list[str]:
    """Every tier the deployment spec declares (a policy may name them all)."""
    return [tier.name for tier in load_spec(spec).tiers]


def gateway_config(
    opts: UpOptions,
    name: str,
    launches: list[TierLaunch],
    admission: Admission | None = None,
    *,
    measured_at: float | None = None,
    measurement: MeasurementConfig | None = None,
) -> GatewayConfig:
    """The gateway in front of ``launches``: the policy, the fp16 variant's tokenizer (all
    variants share it), each tier's max_model_len, Redis, and keys from the environment;
    the figures measured (``measured_at``: when) and how the gateway goes on measuring."""
    verdicts = admission.verdicts if admission else {}
    tiers = [
        TierEndpoint(
            name=t.name,
            base_url=f"http://{t.host}:{t.port}",
            max_model_len=t.max_model_len,
            classes=list(verdicts[t.name].admitted_classes()) if t.name in verdicts else None,
            admission=verdicts[t.name].summary() if t.name in verdicts else None,
            api_key=t.api_key,
            engine=t.engine,
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
        measured=measured_tiers(admission, launches) if admission else {},
        reference_tier=admission.reference if admission else None,
        measured_at=measured_at if admission else None,
        measurement=measurement or MeasurementConfig(),
    )
    return keys_from_environment(config)


def gateway_measurement(
    spec: AdmissionSpec, digests: Mapping[str, str], tiers: int
) -> MeasurementConfig:
    """The gateway goes on measuring as ``up`` did at start (gateway/control/measurement.py):
    the same reference, floors and answer length, the variants' digests; off when ``up``
    checks nothing (the admission check off, or a single tier)."""
    return MeasurementConfig(
        enabled=spec.enabled and tiers >= 2,
        reference=spec.reference,
        floors={str(k): v for k, v in spec.floors.items()},
        max_tokens=spec.max_tokens,
        digests=dict(digests),
    )


def admission_time(admission: Admission | None, cached: Admission | None, key: str) -> float:
    """When the figures ``up`` hands its gateway were measured: now, or for cached verdicts
    the cache file's time (the gateway measures again once they are older than its schedule's
    interval, in a quiet window)."""
    if admission is not None and admission is cached:
        try:
            return cache_file(key).stat().st_mtime
        except OSError:
            return 0.0
    return time.time()


def measured_tiers(admission: Admission, launches: list[TierLaunch]) -> dict[str, MeasuredTier]:
    """The admission's figures as the gateway takes them; a tier served from its emulated copy
    (``is_emulated``: the reference's arithmetic) is flagged, never to be routed ahead of it."""
    emulated = {t.name for t in launches if is_emulated(t)}
    return {
        name: MeasuredTier(**figures, emulated=name in emulated)
        for name, figures in admission.measured().items()
    }


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
    spec = chosen_spec(opts, name)
    engine = phase_engine(opts, spec)
    say(f"variants of {opts.model} ...")
    variants = phase_variants(opts, name, engines_used(spec, engine))
    launches = phase_launches(opts, spec, variants, engine)
    launches = phase_emulation(launches, variants.get(VLLM))
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
    variants: dict[str, Path],
    launches: list[TierLaunch],
    held: dict[int, socket.socket],
) -> int:
    # A bad policy (or one naming tiers the spec does not have) stops us before any tier runs.
    PolicyStore(opts.policy, spec_tiers(opts.spec)).load()
    spec = load_spec(opts.spec)
    digests = {t.name: variant_digest(t.model_dir) for t in launches}
    key = admission_key(
        launches,
        digests,
        engine_versions(launches),
        machine_identity(device()),
        spec.admission,
        admission_probes(),
    )
    cached = load_cached(key) if spec.admission.enabled else None
    vllm_variants = variants.get(VLLM)
    launches = apply_cached_modes(
        launches,
        cached,
        lambda t: emulated_copy(t, vllm_variants) if vllm_variants is not None else t,
    )
    secret = tier_key(os.environ)
    launches = [dataclasses.replace(launch, api_key=secret) for launch in launches]
    supervisor = Supervisor(
        launches,
        programs(launches),
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
            say(f"tier {launch.name} ready on http://{launch.host}:{launch.port}")
        launches, admission = phase_admission(
            launches, vllm_variants, spec.admission, supervisor, key, cached
        )
        config = gateway_config(
            opts,
            name,
            launches,
            admission,
            measured_at=admission_time(admission, cached, key),
            measurement=gateway_measurement(
                spec.admission, digests, len(launches) if opts.gateway_measures else 0
            ),
        )
        floors = {str(k): v for k, v in spec.admission.floors.items()}
        written = record_measurements(opts.gateway_port, config, floors)
        if written is not None:
            say(f"measured figures in {written} (read by policy check and eval routing)")
        for derived in load_policies(config).active.derived.values():
            say(f"route {derived.describe()}")
        app = create_app(
            config,
            supervisor_states=supervisor.states,
            tier_pids=supervisor.pids,
        )
        say(f"gateway on http://{LOOPBACK}:{opts.gateway_port}/v1 — try:")
        print(f"  {curl_example(opts.gateway_port, name)}", file=sys.stderr, flush=True)
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=LOOPBACK,
                port=opts.gateway_port,
                log_config=log_config(),
                **server_options(config),
            )
        )
        server.run(sockets=[gateway_socket])
    finally:
        say("stopping tiers ...")
        supervisor.stop_all()
    return 0
