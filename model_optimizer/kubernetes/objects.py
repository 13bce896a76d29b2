"""Labels, names and the small builders every manifest shares (pure)."""

from __future__ import annotations

import hashlib
import math
from typing import Any

Manifest = dict[str, Any]
APP = "model-optimizer"
NAME_LABEL = "app.kubernetes.io/name"
COMPONENT_LABEL = "app.kubernetes.io/component"
TIER_LABEL = "model-optimizer/tier"
GATEWAY, TIER, REDIS = "gateway", "tier", "redis"
# Where the pods find things.
VARIANTS_MOUNT = "/variants"
GUARD_ROOT = "/opt/model-optimizer"  # the tier guard's package is mounted under it
POLICY_DIR = "/etc/model-optimizer/policy"  # the routing policy's ConfigMap, as a folder
CONFIG_DIR = "/etc/model-optimizer/gateway"
GATEWAY_PORT = 8000
REDIS_PORT = 6379
# ConfigMap and Secret names; the Secret's keys.
POLICY_MAP, CONFIG_MAP, GUARD_MAP = "routing-policy", "gateway-config", "tier-guard"
API_KEYS, ADMIN_KEYS, TIER_KEY = "api-keys", "admin-keys", "tier-key"
VARIANTS_VOLUME = "variants"


def labels(component: str, tier: str | None = None) -> dict[str, str]:
    """The labels of a component's pods; tier pods of the per-tier shape name their tier."""
    found = {NAME_LABEL: APP, COMPONENT_LABEL: component}
    if tier is not None:
        found[TIER_LABEL] = tier
    return found


def meta(name: str, namespace: str, component: str, tier: str | None = None) -> Manifest:
    return {"name": name, "namespace": namespace, "labels": labels(component, tier)}


def tier_service_name(tier: str) -> str:
    return f"tier-{tier}"


def checksum(*texts: str) -> str:
    """sha256 of the texts: a pod template annotation, so a changed file rolls the pods."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()


def seconds(value: float) -> int:
    """Kubernetes wants whole seconds: rounded up, at least 1."""
    return max(1, math.ceil(value))


def http_probe(path: str, port: int | str, period: int, timeout: int, failures: int) -> Manifest:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def secret_env(name: str, secret: str, key: str, optional: bool = False) -> Manifest:
    ref: Manifest = {"name": secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def variants_volume(claim: str) -> Manifest:
    return {
        "name": VARIANTS_VOLUME,
        "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
    }


def headless_service(
    name: str, namespace: str, component: str, selector: dict[str, str], ports: list[Manifest]
) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(name, namespace, component),
        "spec": {"clusterIP": "None", "selector": selector, "ports": ports},
    }


def only_gateway_in(
    name: str, namespace: str, selector: dict[str, str], ports: list[int]
) -> Manifest:
    """A NetworkPolicy: the pods of ``selector`` take connections from the gateway's pods only,
    on ``ports``, and open none themselves (no way out, like compose's internal network)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": {NAME_LABEL: APP}},
        "spec": {
            "podSelector": {"matchLabels": selector},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": labels(GATEWAY)}}],
                    "ports": [{"protocol": "TCP", "port": port} for port in ports],
                }
            ],
            "egress": [],
        },
    }
