"""The deployment spec (``policies/deploy/tiers.yaml``): its schema, loading and validation.

Schema in code (pydantic v2, unknown fields rejected), data in the YAML. Every problem is a
``SpecError`` whose text is one line: ``<file>:<line>: <dotted.field>: <message>`` for the spec
(common/operator_yaml.py reads, parses and validates), ``tier NAME: <message>`` for a tier's
variant folder. Everything is checked before any tier starts.

Flow: ``load_spec`` → the caller resolves ``device: auto`` and ``engine: auto`` →
backends/tier_plan.py's ``resolve_tiers`` (each tier's variant read, its launch planned).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import Field, PrivateAttr, field_validator

from backends.launch import Engine
from common.operator_yaml import (
    OperatorYamlError,
    Section,
    compose_yaml,
    dotted,
    line_of,
    read_text,
    validate,
)

TierName = Literal["fp16", "int8", "int4"]
Device = Literal["auto", "cpu", "cuda"]
KVCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
PositiveInt = Annotated[int, Field(strict=True, gt=0)]
NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]
Seconds = Annotated[float, Field(strict=True, gt=0)]
Loc = tuple[str | int, ...]
StackEngine = Literal["auto", "vllm", "llama.cpp"]
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
    engine: Engine | None = None  # None: the spec's engine
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
    # auto: vLLM on a GPU; on a CPU host llama.cpp (backends/tier_plan.py's resolve_engine).
    engine: StackEngine = "auto"
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
            yield from batch_limits(i, t.max_num_seqs, t.max_num_batched_tokens)
        if device == "cuda" and t.engine == "llama.cpp":
            message = "llama.cpp tiers run on the CPU here (its build has no CUDA); use vllm"
            yield ("tiers", i, "engine"), message
        if device is not None and device != "cuda" and (t.kv_cache_dtype or "").startswith("fp8"):
            yield ("tiers", i, "kv_cache_dtype"), f"{t.kv_cache_dtype} KV cache needs cuda"
        if device == "cuda" and t.gpu_memory_utilization and t.kv_cache_memory_bytes:
            message = "give gpu_memory_utilization or kv_cache_memory_bytes on cuda, not both"
            yield ("tiers", i, "kv_cache_memory_bytes"), message
    if device == "cuda" and spec.engine == "llama.cpp":
        message = "llama.cpp tiers run on the CPU here (its build has no CUDA); use vllm or auto"
        yield ("engine",), message
    if device is not None and spec.device not in ("auto", device):
        yield ("device",), f"the spec asks for {spec.device}, but this machine runs on {device}"
    shares = [t.gpu_memory_utilization or 0.0 for t in spec.tiers]
    if device == "cuda" and sum(shares) >= 1:
        terms = " + ".join(f"{s:g}" for s in shares)
        message = f"gpu_memory_utilization sums to {terms} = {sum(shares):.3g}; keep it below 1"
        yield ("tiers",), message


def batch_limits(i: int, seqs: int, batched: int, origin: str = "") -> Iterator[tuple[Loc, str]]:
    if batched < seqs:
        message = f"max_num_batched_tokens ({batched}) must be at least max_num_seqs ({seqs})"
        yield ("tiers", i, "max_num_batched_tokens"), message + origin
