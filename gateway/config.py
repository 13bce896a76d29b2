"""Gateway configuration: the served model name and the tiers behind it."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class TierEndpoint(BaseModel):
    """One OpenAI-compatible server (a vLLM tier), e.g. ``fp16`` at ``http://127.0.0.1:8001``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    base_url: str

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {value!r}")
        return value


class GatewayConfig(BaseModel):
    """Everything ``create_app`` needs; tiers are tried in order until one answers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_name: str = Field(min_length=1)
    tiers: list[TierEndpoint] = Field(min_length=1)
    connect_timeout: float = Field(default=5.0, gt=0)
    read_timeout: float = Field(default=600.0, gt=0)
    max_body_bytes: int = Field(default=1_000_000, gt=0)

    @model_validator(mode="after")
    def _unique_tier_names(self) -> GatewayConfig:
        names = [tier.name for tier in self.tiers]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"tier names must be unique, repeated: {', '.join(duplicates)}")
        return self


class ConfigError(Exception):
    """A configuration file could not be read or is invalid (message is one line)."""


def load_config(path: str | Path) -> GatewayConfig:
    """Read a YAML file holding a ``GatewayConfig`` mapping."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read gateway config {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"gateway config {path} is not valid YAML: {first_line}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"gateway config {path} must be a YAML mapping")
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in err['loc']) or '<root>'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"gateway config {path} is invalid: {problems}") from exc
