"""The gateway, its configuration and policy, and Redis as Kubernetes objects (pure).

The gateway is ``python -m gateway`` on 0.0.0.0 inside its pod, which refuses to start without
API keys: they come from the Secret, never from a rendered file. The routing policy is a
ConfigMap mounted as a folder (never with subPath, which kubelet does not update): the gateway
watches the folder and follows kubelet's ``..data`` symlink swap without a restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from backends.launch import TierLaunch
from backends.spec import AdmissionSpec
from gateway.config import (
    ADMIN_KEYS_ENV,
    API_KEYS_ENV,
    TIER_KEY_ENV,
    GatewayConfig,
    MeasurementConfig,
    TierEndpoint,
)
from model_optimizer.kubernetes.objects import (
    ADMIN_KEYS,
    API_KEYS,
    APP,
    CONFIG_DIR,
    CONFIG_MAP,
    GATEWAY,
    GATEWAY_PORT,
    NAME_LABEL,
    POLICY_DIR,
    POLICY_MAP,
    REDIS,
    REDIS_PORT,
    TIER_KEY,
    VARIANTS_MOUNT,
    VARIANTS_VOLUME,
    Manifest,
    checksum,
    http_probe,
    labels,
    meta,
    only_gateway_in,
    secret_env,
    tier_service_name,
    variants_volume,
)
from model_optimizer.kubernetes.options import KubeOptions

POLICY_FILE, CONFIG_FILE = "routing.yaml", "gateway.yaml"
REDIS_IMAGE = "redis:7-alpine"
APP_DIR = "/app"  # the repository inside the gateway image
HPA_CPU_PERCENT = 70


def redis_url(options: KubeOptions) -> str:
    return options.redis_url or f"redis://{REDIS}:{REDIS_PORT}/0"


def gateway_config(
    model_name: str,
    launches: list[TierLaunch],
    options: KubeOptions,
    replicas: Mapping[str, int] | None = None,
    admission: AdmissionSpec | None = None,
    *,
    digests: Mapping[str, str] | None = None,
) -> GatewayConfig:
    """The gateway ``up`` would run, in the cluster: each tier at its headless Service with its
    real max_model_len, the first tier's variant as tokenizer (all variants share it), Redis, a
    per-key rate limit. No key in it: the environment (the Secret) adds them.

    A tier of one pod is ``base_url`` (one server: drained and reset as a whole); a tier of
    more (``replicas``, name → pods) is a pool, ``dns:`` its headless Service, whose name the
    gateway resolves again every ``dns_interval`` to every ready pod.

    With ``admission`` (the spec's) the gateway measures its tiers itself, as ``up`` does
    (gateway/control/measurement.py): the in-engine check and the speed calibration of every
    pod, at start, when a pod appears or comes back, and in quiet windows; ``digests`` (tier ->
    its variant's digest) make a rendering with new variants measured again at once, even
    where a rolling update never shows the gateway a tier down."""
    tiers = [_endpoint(t, (replicas or {}).get(t.name, 1)) for t in launches]
    names = {t.name for t in launches}
    measures = admission is not None and admission.enabled and admission.reference in names
    measurement = MeasurementConfig(
        enabled=measures and len(launches) >= 2,
        reference=admission.reference if admission is not None else "fp16",
        floors={str(k): v for k, v in admission.floors.items()} if admission is not None else {},
        max_tokens=admission.max_tokens if admission is not None else 32,
        digests=dict(digests or {}),
    )
    return GatewayConfig(
        model_name=model_name,
        tiers=tiers,
        policy_path=f"{POLICY_DIR}/{POLICY_FILE}",
        tokenizer_dir=str(launches[0].model_dir),
        redis_url=redis_url(options),
        rate_limit_per_minute=options.rate_limit_per_minute,
        measurement=measurement if measurement.enabled else MeasurementConfig(),
    )


def _endpoint(launch: TierLaunch, replicas: int) -> TierEndpoint:
    address = f"{tier_service_name(launch.name)}:{launch.port}"
    if replicas > 1:  # base_url comes from the name (gateway/config.py)
        pool = {
            "name": launch.name,
            "dns": address,
            "max_model_len": launch.max_model_len,
            "engine": launch.engine,
        }
        return TierEndpoint.model_validate(pool)
    return TierEndpoint(
        name=launch.name,
        base_url=f"http://{address}",
        max_model_len=launch.max_model_len,
        engine=launch.engine,
    )


def config_text(config: GatewayConfig) -> str:
    data = config.model_dump(mode="json", exclude_defaults=True)
    # Each tier's max_model_len always, even the default one: the gateway must know it. A dns
    # tier without the base_url derived from its name (it loads back either way).
    data["tiers"] = [
        t.model_dump(mode="json", exclude_none=True, exclude={"base_url"} if t.dns else None)
        for t in config.tiers
    ]
    return yaml.safe_dump(data, sort_keys=False)


def gateway_objects(
    config: GatewayConfig, policy_text: str, options: KubeOptions
) -> list[Manifest]:
    """ConfigMaps (policy, config), the Deployment, its Service, PodDisruptionBudget and
    HorizontalPodAutoscaler."""
    ns = options.namespace
    config_yaml = config_text(config)
    pod_labels = labels(GATEWAY)
    return [
        _config_map(POLICY_MAP, ns, {POLICY_FILE: policy_text}),
        _config_map(CONFIG_MAP, ns, {CONFIG_FILE: config_yaml}),
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta(GATEWAY, ns, GATEWAY),
            "spec": {
                "replicas": options.gateway_replicas,
                "selector": {"matchLabels": pod_labels},
                "template": {
                    "metadata": {
                        "labels": pod_labels,
                        # The config is read at start: a changed one rolls the pods. The
                        # policy is not here: it is reloaded in place.
                        "annotations": {"model-optimizer/config-sha256": checksum(config_yaml)},
                    },
                    "spec": _gateway_pod(options),
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(GATEWAY, ns, GATEWAY),
            "spec": {
                "selector": pod_labels,
                "ports": [{"name": "http", "port": GATEWAY_PORT, "targetPort": "http"}],
            },
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": meta(GATEWAY, ns, GATEWAY),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": pod_labels}},
        },
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": meta(GATEWAY, ns, GATEWAY),
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": GATEWAY},
                "minReplicas": options.gateway_replicas,
                "maxReplicas": options.max_gateway_replicas,
                "metrics": [
                    {
                        "type": "Resource",
                        "resource": {
                            "name": "cpu",
                            "target": {
                                "type": "Utilization",
                                "averageUtilization": HPA_CPU_PERCENT,
                            },
                        },
                    }
                ],
            },
        },
    ]


TERMINATION_GRACE_SECONDS = 30


def _gateway_pod(options: KubeOptions) -> Manifest:
    command = ["python", "-m", "gateway", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}"]
    secret = options.secret_name
    container: dict[str, Any] = {
        "name": GATEWAY,
        "image": options.image,
        "workingDir": APP_DIR,
        "command": [*command, "--host", "0.0.0.0", "--port", str(GATEWAY_PORT)],
        "env": [
            {"name": "PYTHONPATH", "value": APP_DIR},
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
            secret_env(API_KEYS_ENV, secret, API_KEYS),
            secret_env(ADMIN_KEYS_ENV, secret, ADMIN_KEYS, optional=True),
            secret_env(TIER_KEY_ENV, secret, TIER_KEY),
        ],
        "ports": [{"name": "http", "containerPort": GATEWAY_PORT, "protocol": "TCP"}],
        "readinessProbe": http_probe("/readyz", "http", 5, 3, 2),
        "livenessProbe": http_probe("/healthz", "http", 10, 5, 3),
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": POLICY_MAP, "mountPath": POLICY_DIR, "readOnly": True},
            {"name": CONFIG_MAP, "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": VARIANTS_VOLUME, "mountPath": VARIANTS_MOUNT, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    return {
        "automountServiceAccountToken": False,
        # Above the gateway's shutdown bound (shutdown_timeout 20 s + 2 s to end open streams
        # with an error event, gateway/server.py): SIGKILL never cuts a stream mid-answer.
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "containers": [container],
        "volumes": [
            {"name": POLICY_MAP, "configMap": {"name": POLICY_MAP}},
            {"name": CONFIG_MAP, "configMap": {"name": CONFIG_MAP}},
            variants_volume(options.variants_claim),
            {"name": "tmp", "emptyDir": {}},
        ],
    }


def redis_objects(options: KubeOptions) -> list[Manifest]:
    """A Redis of the gateway's own (no persistence: the shared state is counters and locks),
    reachable from the gateway's pods only; none when ``redis_url`` names one elsewhere."""
    if options.redis_url is not None:
        return []
    ns, pod_labels = options.namespace, labels(REDIS)
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta(REDIS, ns, REDIS),
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": pod_labels},
                "template": {
                    "metadata": {"labels": pod_labels},
                    "spec": {
                        "automountServiceAccountToken": False,
                        "containers": [
                            {
                                "name": REDIS,
                                "image": REDIS_IMAGE,
                                "args": ["redis-server", "--save", "", "--appendonly", "no"],
                                "ports": [{"name": REDIS, "containerPort": REDIS_PORT}],
                                "readinessProbe": {
                                    "tcpSocket": {"port": REDIS_PORT},
                                    "periodSeconds": 5,
                                },
                                "securityContext": {"allowPrivilegeEscalation": False},
                            }
                        ],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(REDIS, ns, REDIS),
            "spec": {
                "selector": pod_labels,
                "ports": [{"name": REDIS, "port": REDIS_PORT, "targetPort": REDIS_PORT}],
            },
        },
        only_gateway_in("redis-from-gateway-only", ns, pod_labels, [REDIS_PORT]),
    ]


def _config_map(name: str, namespace: str, data: dict[str, str]) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": {NAME_LABEL: APP}},
        "data": data,
    }
