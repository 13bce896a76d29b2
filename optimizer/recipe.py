"""The recipe: which variants to write, how to quantize and calibrate, and the KV-cache target.

Schema in code (pydantic v2, unknown fields rejected everywhere), data in
``policies/recipes/*.yaml``. Standard library + pydantic + pyyaml only, so it imports in both the
gateway and the optimize environment.

Every problem with a recipe file is a ``RecipeError`` whose text is one line,
``<file>:<line>: <dotted.field>: <message>`` (common/operator_yaml.py reads, parses and validates;
an unknown field names the closest allowed one).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from common.operator_yaml import OperatorYamlError, Section, load_model, parse_model

Precision = Literal["fp16", "bf16", "int8", "int4"]
PRECISIONS: tuple[Precision, ...] = ("fp16", "bf16", "int8", "int4")
UNQUANTIZED: frozenset[str] = frozenset({"fp16", "bf16"})
_ALIASES: dict[str, Precision] = {
    "fp16": "fp16",
    "float16": "fp16",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "int8": "int8",
    "int4": "int4",
}
_ACCEPTED = ", ".join(_ALIASES)

DEFAULT_THRESHOLDS: dict[str, dict[str, float]] = {
    # Measured on SmolLM2-135M-Instruct with the shipped probes (worst category / worst layer):
    # int8 (SmoothQuant+GPTQ W8A8) KL 0.040, top-1 0.90, layer 0.15; int4 (GPTQ W4A16 g64)
    # KL 0.43, top-1 0.71, layer 0.41. Limits leave room for other seeds and models; a
    # deliberately broken layer lands far beyond them (its error is ~50 for a 50x scale).
    "fp16": {"max_kl": 0.001, "min_top1": 0.99, "max_layer_rel_error": 0.01},
    "bf16": {"max_kl": 0.001, "min_top1": 0.99, "max_layer_rel_error": 0.01},
    "int8": {"max_kl": 0.1, "min_top1": 0.85, "max_layer_rel_error": 0.3},
    "int4": {"max_kl": 0.6, "min_top1": 0.6, "max_layer_rel_error": 0.6},
}
DEFAULT_VARIANTS: tuple[Precision, ...] = ("fp16", "int8", "int4")


class RecipeError(OperatorYamlError):
    """A recipe that cannot be used; ``str()`` is one line naming file, line and field."""


def normalize_precision(value: str) -> Precision:
    """``float16``→``fp16``, ``bfloat16``→``bf16``; ``ValueError`` naming the accepted names."""
    key = value.strip().lower()
    if key not in _ALIASES:
        raise ValueError(f"unknown precision {value!r} (expected one of {_ACCEPTED})")
    return _ALIASES[key]


def is_quantized(precision: str) -> bool:
    """``int8``/``int4`` are quantized; ``fp16``/``bf16`` both mean "kept in floating point"."""
    return normalize_precision(precision) not in UNQUANTIZED


def _precision_before(value: object) -> object:
    return normalize_precision(value) if isinstance(value, str) else value


PrecisionName = Annotated[Precision, BeforeValidator(_precision_before)]
PositiveInt = Annotated[int, Field(strict=True, gt=0)]
NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]


class CheckThresholds(Section):
    """Limits of the precision check for one variant against the original model."""

    max_kl: float = Field(ge=0)
    min_top1: float = Field(ge=0, le=1)
    max_layer_rel_error: float = Field(ge=0)


class VariantSpec(Section):
    check: CheckThresholds


class LayerOverride(Section):
    """Keep ``layers`` (exact names, dotted suffixes or ``re:`` patterns) at ``precision``."""

    layers: list[str] = Field(min_length=1)
    precision: PrecisionName

    @field_validator("layers")
    @classmethod
    def _patterns_compile(cls, layers: list[str]) -> list[str]:
        for pattern in layers:
            if not pattern.strip():
                raise ValueError("empty layer name")
            if pattern.startswith("re:"):
                try:
                    re.compile(pattern[3:])
                except re.error as exc:
                    raise ValueError(f"bad regular expression {pattern!r}: {exc}") from None
        return layers


class QuantizationSection(Section):
    default_precision: PrecisionName = "int8"
    ignore: list[str] = Field(default_factory=lambda: ["lm_head"])
    layer_overrides: list[LayerOverride] = Field(default_factory=list)
    group_size: Literal["auto"] | int = "auto"
    smoothing_strength: float = Field(default=0.8, ge=0, le=1)

    @field_validator("group_size", mode="before")
    @classmethod
    def _auto_or_positive(cls, value: object) -> object:
        if value == "auto" or (type(value) is int and value > 0):
            return value
        raise ValueError(f"must be 'auto' or a positive integer, not {value!r}")


class CalibrationSection(Section):
    dataset: str | None = None
    num_samples: PositiveInt = 32
    max_seq_length: PositiveInt = 256
    seed: NonNegativeInt = 0


class KVCacheSection(Section):
    dtype: Literal["auto", "fp8"] = "auto"
    block_size: PositiveInt = 16
    max_model_len: PositiveInt = 2048
    max_num_seqs: PositiveInt = 8
    max_num_batched_tokens: PositiveInt = 2048
    headroom: float = Field(default=0.1, ge=0, le=1)

    @model_validator(mode="after")
    def _batch_holds_every_sequence(self) -> KVCacheSection:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                f"max_num_seqs ({self.max_num_seqs})"
            )
        return self


GGMLFloat = Literal["F16", "BF16", "F32"]
GGML4Bit = Literal["Q4_0", "Q4_1", "Q4_K_S", "Q4_K_M", "IQ4_NL", "IQ4_XS"]


def _default_int4_types() -> list[GGML4Bit]:
    return ["Q4_0", "Q4_K_M"]


class GGUFSection(Section):
    """llama.cpp (GGUF) variants: the GGML type of each; optimizer/gguf_plan.py says what every
    other part of the recipe means for them."""

    # The unquantized variants. BF16 by default: the same bytes as the reference the precision
    # check compares with (the source's weights as bf16), so "fp16" is exact as on vLLM.
    fp16: GGMLFloat = "BF16"
    bf16: GGMLFloat = "BF16"
    int8: Literal["Q8_0"] = "Q8_0"
    # Candidates: each is quantized, checked and timed here; the fastest that passes is kept.
    int4: list[GGML4Bit] = Field(default_factory=_default_int4_types, min_length=1)
    # Candidates whose time per token is within this share of the fastest's count as tied;
    # among the tied, the lowest KL wins.
    speed_tolerance: float = Field(default=0.1, ge=0, le=1)
    # Mixed precision for the GGUF variants: null = quantization.ignore and
    # quantization.layer_overrides apply; a list (even empty) replaces both.
    layer_overrides: list[LayerOverride] | None = None

    @field_validator("int4")
    @classmethod
    def _unique(cls, value: list[GGML4Bit]) -> list[GGML4Bit]:
        repeated = sorted({t for t in value if value.count(t) > 1})
        if repeated:
            raise ValueError(f"names {', '.join(repeated)} twice")
        return value


def _default_variants() -> dict[Precision, VariantSpec]:
    return {p: default_variant_spec(p) for p in DEFAULT_VARIANTS}


def default_variant_spec(precision: str) -> VariantSpec:
    return VariantSpec.model_validate({"check": DEFAULT_THRESHOLDS[normalize_precision(precision)]})


class Recipe(Section):
    variants: dict[PrecisionName, VariantSpec] = Field(default_factory=_default_variants)
    quantization: QuantizationSection = Field(default_factory=QuantizationSection)
    calibration: CalibrationSection = Field(default_factory=CalibrationSection)
    kv_cache: KVCacheSection = Field(default_factory=KVCacheSection)
    gguf: GGUFSection = Field(default_factory=GGUFSection)

    @field_validator("variants", mode="before")
    @classmethod
    def _fill_thresholds(cls, value: object) -> object:
        """Accept a list of names; fill each variant's missing thresholds with its defaults."""
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = {v: None for v in value}
        if not isinstance(value, dict):
            return value
        if not value:
            raise ValueError("names no variant (give at least one of fp16, bf16, int8, int4)")
        filled: dict[object, object] = {}
        seen: dict[str, object] = {}
        for key, spec in value.items():
            try:
                precision = normalize_precision(key) if isinstance(key, str) else None
            except ValueError:
                precision = None
            if precision is None:
                filled[key] = spec
                continue
            if precision in seen:
                raise ValueError(f"{precision} is named twice ({seen[precision]!r} and {key!r})")
            seen[precision] = key
            spec = {} if spec is None else spec
            if isinstance(spec, dict):
                check = spec.get("check", {})
                check = {} if check is None else check
                if isinstance(check, dict):
                    spec = {**spec, "check": {**DEFAULT_THRESHOLDS[precision], **check}}
            filled[key] = spec
        return filled


# --------------------------------------------------------------------------- loading


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate a recipe file; ``RecipeError`` (one line) on any problem."""
    return load_model(path, Recipe, "recipe", RecipeError, suggest=True)


def parse_recipe(text: str, source_name: str = "<recipe>") -> Recipe:
    """Validate recipe YAML ``text``; ``source_name`` is the file named in errors."""
    return parse_model(text, source_name, Recipe, RecipeError, suggest=True)


# --------------------------------------------------------------------------- derived recipes


# What a variant's bytes do not depend on, per format: vLLM variants ignore the gguf section;
# GGUF variants ignore what optimizer/gguf_plan.py lists as not applicable. Editing one format's
# part of a recipe leaves the other format's variants up to date.
_NOT_HASHED: dict[str, tuple[tuple[str, ...], ...]] = {
    "safetensors": (("gguf",),),
    "gguf": (
        ("quantization", "group_size"),
        ("quantization", "smoothing_strength"),
        ("quantization", "default_precision"),
        ("calibration",),
    ),
}


def recipe_hash(recipe: Recipe, fmt: str = "safetensors") -> str:
    """16 hex chars of sha256 over the canonical JSON (aliases and defaults already applied) of
    the parts of the recipe that variants of format ``fmt`` (safetensors or gguf) depend on."""
    data = recipe.model_dump(mode="json")
    for path in _NOT_HASHED[fmt]:
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        parent.pop(path[-1], None)
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def single_variant_recipe(precision: str | None, base: Recipe) -> Recipe:
    """The recipe for ``--quantize PRECISION`` (``None``: the base's ``default_precision``).

    Keeps the base's thresholds for that variant when it names one, else the defaults.
    """
    try:
        chosen = (
            normalize_precision(precision)
            if precision is not None
            else base.quantization.default_precision
        )
    except ValueError as exc:
        raise RecipeError(f"--quantize: {exc}") from None
    spec = base.variants.get(chosen) or default_variant_spec(chosen)
    data = base.model_dump(mode="json")
    data["variants"] = {chosen: spec.model_dump(mode="json")}
    data["quantization"]["default_precision"] = chosen
    return Recipe.model_validate(data)
