"""``up``'s tiers before they start: which engine, which variants, which launches, which programs.

Phases, each a function: ``phase_engine`` (the spec's ``engine`` or ``--engine``, ``auto``
settled by backends/tier_plan.py's rule and printed with its reason), ``phase_variants`` (each
engine's variants of the model in the cache: safetensors for vLLM, GGUF for llama.cpp; built
once, then a no-op), ``phase_launches`` (the spec's tiers resolved against them),
``phase_emulation`` (vLLM tiers whose format has no kernel on this CPU serve a dequantized
copy) and ``programs`` (vLLM's environment, llama.cpp's server).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from backends.commands import Programs
from backends.launch import LLAMA_CPP, VLLM, Engine, TierLaunch
from backends.platform import dtype_reason, emulation_reason, native_precisions, serving_dtype
from backends.spec import DeploymentSpec, load_spec
from backends.tier_plan import resolve_engine, resolve_tiers, tier_engine
from common.cpu import machine_flags
from common.llama_cpp import LlamaCppMissing, locate
from model_optimizer.envs import ROOT, cache_lock, cache_root, ensure, has_nvidia_gpu
from model_optimizer.models import AlreadyReported, ModelError
from model_optimizer.optimize import installed_vllm, run_in_optimize_env, run_optimize

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
    engine: str | None = None  # vllm | llama.cpp | auto (None: the spec's engine)
    # The gateway goes on measuring the tiers (gateway/control/measurement.py): after a tier
    # restarts and every 6 h in a quiet window. False: only up's measurement at start.
    gateway_measures: bool = True


def say(message: str) -> None:
    print(f"up: {message}", file=sys.stderr, flush=True)


def device() -> str:
    return "cuda" if has_nvidia_gpu() else "cpu"


def chosen_spec(opts: UpOptions, name: str) -> DeploymentSpec:
    """The spec with the --tiers subset and the served name."""
    spec = load_spec(opts.spec)
    if opts.tiers:
        unknown = set(opts.tiers) - {tier.name for tier in spec.tiers}
        if unknown:
            raise ModelError(f"--tiers names unknown tier(s): {', '.join(sorted(unknown))}")
        spec = spec.model_copy(update={"tiers": [t for t in spec.tiers if t.name in opts.tiers]})
    return spec.model_copy(update={"model_name": name})


def phase_engine(opts: UpOptions, spec: DeploymentSpec) -> Engine:
    """The stack's engine (a tier may name its own in the spec), said with its reason."""
    engine, why = resolve_engine(opts.engine or spec.engine, device())
    say(f"engine {engine}: {why}")
    return engine


def engines_used(spec: DeploymentSpec, engine: Engine) -> list[Engine]:
    return sorted({tier_engine(spec, i, engine) for i in range(len(spec.tiers))})


def variants_folder(name: str, engine: Engine) -> Path:
    """Where ``up`` keeps a model's variants for an engine (GGUF ones beside the vLLM ones)."""
    return cache_root() / "variants" / (name if engine == VLLM else f"{name}-gguf")


def phase_variants(opts: UpOptions, name: str, engines: list[Engine]) -> dict[str, Path]:
    """Each engine's variants of the model in the cache (built once, then a no-op)."""
    if opts.variants is not None:
        if not opts.variants.is_dir():
            raise ModelError(f"variants folder not found: {opts.variants}")
        return {engine: opts.variants for engine in engines}
    out: dict[str, Path] = {}
    for engine in engines:
        if engine == VLLM:  # its variants name the vLLM they are for: have it installed
            ensure("serve", has_nvidia_gpu())
        folder = variants_folder(name, engine)
        folder.parent.mkdir(parents=True, exist_ok=True)
        # Another up (or a test run's) may be building the same folder: one after the other,
        # the second then finds them up to date.
        lock = folder.parent / f".{folder.name}.lock"
        waiting = functools.partial(say, f"waiting for another run building {folder} ...")
        with cache_lock(lock, waiting):
            framework = LLAMA_CPP if engine == LLAMA_CPP else None
            code = run_optimize(opts.model, str(folder), opts.recipe, None, 1, framework)
        if code != 0:
            raise AlreadyReported(code)  # the optimizer said why, in one line
        out[engine] = folder
    return out


def phase_launches(
    opts: UpOptions, spec: DeploymentSpec, variants: dict[str, Path], engine: Engine
) -> list[TierLaunch]:
    """The spec's tiers resolved against the variants; llama.cpp tiers get a slot folder (its
    KV reset erases slots, which llama-server allows only with one)."""
    scaled = [f"{t.name} ({t.replicas})" for t in spec.tiers if t.replicas > 1]
    if scaled:
        say(f"one server per tier: replicas of {', '.join(scaled)} are for deploy kubernetes")
    launches = resolve_tiers(
        spec, variants, device(), installed_vllm(), os.cpu_count() or 1, engine
    )
    if opts.tier_port is not None:
        launches = [
            dataclasses.replace(launch, port=opts.tier_port + i)
            for i, launch in enumerate(launches)
        ]
    slots = cache_root() / "slots"
    return [
        dataclasses.replace(launch, slot_dir=slots / f"{launch.host}-{launch.port}")
        if launch.engine == LLAMA_CPP
        else launch
        for launch in launches
    ]


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


def phase_emulation(launches: list[TierLaunch], variants: Path | None) -> list[TierLaunch]:
    """vLLM tiers whose format has no kernel here serve a dequantized copy (said out loud);
    every vLLM tier gets the ``--dtype`` this machine needs (backends/platform.py says why).
    These are priors: the admission check (model_optimizer/serving_check.py) measures what they
    missed. llama.cpp tiers are left as they are (its kernels cover every CPU it builds for)."""
    if variants is None or not any(t.engine == VLLM for t in launches):
        return launches
    flags = machine_flags()
    native = native_precisions(device(), flags)
    dtype = serving_dtype(device(), flags)
    if dtype is not None:
        say(f"vLLM tiers run as {dtype}: {dtype_reason(flags)}")
    out = []
    for launch in launches:
        if launch.engine != VLLM:
            out.append(launch)
            continue
        launch = dataclasses.replace(launch, dtype=launch.dtype or dtype)
        if launch.name in native:
            out.append(launch)
            continue
        copy = emulated_copy(launch, variants)
        say(
            f"tier {launch.name}: {emulation_reason(launch.name, flags)}; serving it emulated "
            f"from {copy.model_dir} (weights on the {launch.name} grid, dequantized: the same "
            "weights, no memory saving)"
        )
        out.append(copy)
    return out


def warm_up(launch: TierLaunch, requests: int = 2) -> None:
    """Tiny completions so the first user request does not pay first-call costs (with the
    tier's key: llama-server wants it on every route)."""
    url = f"http://{launch.host}:{launch.port}/v1/completions"
    body = {"model": launch.served_model_name, "prompt": "Hello", "max_tokens": 4}
    headers = {"authorization": f"Bearer {launch.api_key}"} if launch.api_key else None
    with httpx.Client(timeout=120, trust_env=False, headers=headers) as client:
        for _ in range(requests):
            client.post(url, json=body).raise_for_status()


def programs(launches: list[TierLaunch]) -> Programs:
    """The engines' programs the launches need (the serve environment built if missing)."""
    python = server = None
    if any(t.engine == VLLM for t in launches):
        python = ensure("serve", has_nvidia_gpu()) / "bin" / "python"
    if any(t.engine == LLAMA_CPP for t in launches):
        try:
            server = locate().server
        except LlamaCppMissing as exc:
            raise ModelError(str(exc)) from None
    return Programs(vllm_python=python, llama_server=server)


def engine_versions(launches: list[TierLaunch]) -> str:
    """The versions of the engines serving ``launches`` (the admission cache key holds them)."""
    parts = []
    if any(t.engine == VLLM for t in launches):
        parts.append(installed_vllm())
    if any(t.engine == LLAMA_CPP for t in launches):
        try:
            parts.append(locate().version)
        except LlamaCppMissing:
            parts.append("llama.cpp==unknown")
    return " ".join(parts)


class StackLauncher:
    """``up``'s way to launch one vLLM tier, for ``bench --ablation``
    (measure.ablation.TierLauncher): the CLI hands it to measure, which never imports
    model_optimizer."""

    def launch(self, model: str, tier: str) -> TierLaunch:
        opts = UpOptions(tiers=(tier,))
        spec = chosen_spec(opts, model)
        variants = {VLLM: variants_folder(model, VLLM)}
        return phase_emulation(phase_launches(opts, spec, variants, VLLM), variants[VLLM])[0]

    def warm_up(self, launch: TierLaunch) -> None:
        warm_up(launch)
