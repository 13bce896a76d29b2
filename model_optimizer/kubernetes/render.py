"""The whole deployment as a list of manifests: spec + variants' facts + files + options (pure).

Order is apply order: the Namespace, then Redis, the tiers (and their InferencePools, when
asked for) and the gateway, each with what its pods mount before the pods.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from backends.spec import DeploymentSpec
from backends.tier_plan import VariantInfo
from model_optimizer.kubernetes.gateway import gateway_config, gateway_objects, redis_objects
from model_optimizer.kubernetes.objects import APP, NAME_LABEL, Manifest
from model_optimizer.kubernetes.options import KubeOptions
from model_optimizer.kubernetes.pools import inference_pools
from model_optimizer.kubernetes.tiers import tier_launches, tier_objects


@dataclass(frozen=True)
class Sources:
    """The files the manifests carry: the routing policy and backends/tier_guard.py."""

    policy_text: str
    guard_text: str


def render(
    spec: DeploymentSpec,
    variants: Mapping[str, VariantInfo],
    sources: Sources,
    options: KubeOptions,
) -> list[Manifest]:
    """Every object, in apply order. ``SpecError`` when the spec cannot run on cuda with these
    variants (the checks ``up`` makes: fractions below 1, a passed variant for the engine)."""
    launches = tier_launches(spec, variants, options)
    replicas: dict[str, int] = {tier.name: tier.replicas for tier in spec.tiers}
    digests = {name: info.digest for name, info in variants.items() if info.digest}
    config = gateway_config(
        spec.model_name, launches, options, replicas, spec.admission, digests=digests
    )
    namespace: Manifest = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": options.namespace, "labels": {NAME_LABEL: APP}},
    }
    return [
        namespace,
        *redis_objects(options),
        *tier_objects(spec, launches, sources.guard_text, options),
        *inference_pools(launches, options),
        *gateway_objects(config, sources.policy_text, options),
    ]
