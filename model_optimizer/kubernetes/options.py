"""What the operator chooses beyond the deployment spec (pure, validated on construction)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

TierEngine = Literal["vllm", "llama.cpp"]
TIER_ENGINES: tuple[TierEngine, ...] = ("vllm", "llama.cpp")
# The engines' own server images: vLLM's OpenAI server; llama.cpp's llama-server (CPU build,
# the program at /app/llama-server).
TIER_IMAGES: dict[str, str] = {
    "vllm": "vllm/vllm-openai:v0.32.0",
    "llama.cpp": "ghcr.io/ggml-org/llama.cpp:server",
}
Shape = Literal["per-tier", "co-located"]
SHAPES: tuple[Shape, ...] = ("per-tier", "co-located")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class OptionsError(ValueError):
    """An option that cannot render; ``str()`` is one line naming the option."""


@dataclass(frozen=True)
class KubeOptions:
    """The rendering's knobs; every default is closed (keys required, tiers unreachable but
    from the gateway).

    ``image`` holds the repository at ``/app`` and the gateway environment's packages
    (``requirements/gateway.txt``); ``tier_engine`` is what the tiers run: ``vllm`` (GPU nodes;
    ``engine`` is the vLLM the variants must have been built for) or ``llama.cpp`` (CPU nodes,
    GGUF variants, ``tier_cpus`` cores a tier pod, each its own llama-server threads);
    ``tier_image`` the tiers' image ("" = the engine's own, ``TIER_IMAGES``). ``redis_url``
    None renders a Redis of its own.
    ``shape``: ``per-tier`` is one Deployment per tier, each with its own ``nvidia.com/gpu``;
    ``co-located`` is the three tiers as containers of one pod sharing one GPU (claimed through
    dynamic resource allocation from ``gpu_device_class``), with the spec's memory fractions.
    ``inference_pools`` adds one Gateway API Inference Extension ``InferencePool`` per tier,
    naming the endpoint picker ``tier-<name>-epp`` on ``endpoint_picker_port`` (not rendered).
    """

    namespace: str = "model-optimizer"
    image: str = "model-optimizer:latest"
    tier_engine: TierEngine = "vllm"
    tier_image: str = ""
    engine: str = "vllm==0.32.0"
    tier_cpus: int = 2
    gateway_replicas: int = 2
    max_gateway_replicas: int = 6
    shape: Shape = "per-tier"
    redis_url: str | None = None
    secret_name: str = "model-optimizer-keys"
    variants_claim: str = "model-optimizer-variants"
    gpu_device_class: str = "gpu.nvidia.com"
    rate_limit_per_minute: int = 600
    inference_pools: bool = False
    endpoint_picker_port: int = 9002

    def __post_init__(self) -> None:
        for option in ("namespace", "secret_name", "variants_claim"):
            value = getattr(self, option)
            pattern = _DNS_LABEL if option == "namespace" else _DNS_NAME
            if not pattern.fullmatch(value):
                raise OptionsError(f"{option}: {value!r} is not a Kubernetes name")
        if not _DNS_NAME.fullmatch(self.gpu_device_class):
            raise OptionsError(f"gpu_device_class: {self.gpu_device_class!r} is not a name")
        if self.shape not in SHAPES:
            raise OptionsError(f"shape: must be one of {', '.join(SHAPES)}, not {self.shape!r}")
        if self.gateway_replicas < 1:
            raise OptionsError(f"gateway_replicas: must be at least 1, not {self.gateway_replicas}")
        if self.max_gateway_replicas < self.gateway_replicas:
            raise OptionsError(
                f"max_gateway_replicas: {self.max_gateway_replicas} is below gateway_replicas "
                f"{self.gateway_replicas}"
            )
        if self.rate_limit_per_minute < 1:
            raise OptionsError("rate_limit_per_minute: must be at least 1")
        if not 1 <= self.endpoint_picker_port <= 65535:
            raise OptionsError(f"endpoint_picker_port: {self.endpoint_picker_port} is not a port")
        if self.redis_url is not None and not self.redis_url.startswith(("redis://", "rediss://")):
            raise OptionsError("redis_url: must start with redis:// or rediss://")
        for option in ("image", "engine"):
            value = getattr(self, option)
            if not value or any(c.isspace() for c in value):
                raise OptionsError(f"{option}: must be a non-empty word, not {value!r}")
        if any(c.isspace() for c in self.tier_image):
            raise OptionsError(f"tier_image: must be one word, not {self.tier_image!r}")
        if self.tier_engine not in TIER_ENGINES:
            choices = ", ".join(TIER_ENGINES)
            raise OptionsError(f"tier_engine: must be one of {choices}, not {self.tier_engine!r}")
        if self.tier_cpus < 1:
            raise OptionsError(f"tier_cpus: must be at least 1, not {self.tier_cpus}")
        if self.inference_pools and self.tier_engine == "llama.cpp":
            raise OptionsError(
                "inference_pools: the endpoint picker reads vLLM's metrics (KV-cache usage), "
                "which llama.cpp tiers do not export; render them without it"
            )

    @property
    def tiers_image(self) -> str:
        """The tiers' image: ``tier_image``, else the engine's own."""
        return self.tier_image or TIER_IMAGES[self.tier_engine]
