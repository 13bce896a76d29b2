"""The tiers as Kubernetes objects (pure): per-tier Deployments, or one co-located pod.

Every tier's command line is its engine's argv builder's (``backends.vllm_args.build_argv``
for vLLM on GPU nodes, ``backends.llama_args.build_argv`` for llama.cpp on CPU nodes:
model_optimizer/kubernetes/llama_tiers.py) of the launch ``plan_tiers`` makes (the very code
``up`` runs), with the variant folder where the pod mounts it and ``0.0.0.0`` for a host (the
NetworkPolicy, not loopback, keeps everyone but the gateway out).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from backends.launch import LLAMA_CPP, TierLaunch
from backends.spec import DeploymentSpec, spec_error
from backends.tier_plan import VariantInfo, plan_tiers
from backends.vllm_args import GUARD, GUARD_KEY_ENV, build_argv, build_env
from model_optimizer.kubernetes.llama_tiers import llama_container, llama_launch, slots_volume
from model_optimizer.kubernetes.objects import (
    GUARD_MAP,
    GUARD_ROOT,
    TIER,
    TIER_KEY,
    VARIANTS_MOUNT,
    VARIANTS_VOLUME,
    Manifest,
    checksum,
    headless_service,
    http_probe,
    labels,
    meta,
    only_gateway_in,
    seconds,
    secret_env,
    tier_service_name,
    variants_volume,
)
from model_optimizer.kubernetes.options import KubeOptions

TIER_PYTHON = "python3"  # the tier image's interpreter
ANY_ADDRESS = "0.0.0.0"
GPU = "nvidia.com/gpu"
CLAIM = "gpu"  # the co-located pod's one GPU, claimed by every container
CLAIM_TEMPLATE = "tiers-gpu"
CO_LOCATED = "tiers"
START_PERIOD_S = 10
# The tier guard's package, mounted from a ConfigMap: backends/__init__.py and tier_guard.py.
GUARD_PACKAGE, GUARD_FILE = GUARD.rsplit(".", 2)[0], GUARD.rsplit(".", 2)[1] + ".py"


def tier_launches(
    spec: DeploymentSpec, variants: Mapping[str, VariantInfo], options: KubeOptions
) -> list[TierLaunch]:
    """``plan_tiers`` for the tiers' engine (vLLM on cuda, llama.cpp on CPU nodes); the variant
    folders as mounted. A tier of more than one replica needs the per-tier shape (the
    co-located pod holds all)."""
    llama = options.tier_engine == LLAMA_CPP
    device, cores = ("cpu", max(options.tier_cpus, 1)) if llama else ("cuda", 1)
    launches = plan_tiers(spec, variants, device, options.engine, cores, options.tier_engine)
    if llama:
        launches = [llama_launch(launch, options) for launch in launches]
    for i, tier in enumerate(spec.tiers):
        if tier.replicas > 1 and options.shape != "per-tier":
            message = f"{tier.replicas} replicas need --shape per-tier (one pod holds every tier)"
            raise spec_error(spec, ("tiers", i, "replicas"), message)
    folders: dict[str, str] = {tier.name: tier.variant for tier in spec.tiers}
    return [
        dataclasses.replace(
            launch,
            model_dir=Path(PurePosixPath(VARIANTS_MOUNT) / folders[launch.name]),
            host=ANY_ADDRESS,
        )
        for launch in launches
    ]


def tier_argv(launch: TierLaunch) -> list[str]:
    """The container's command: the argv builder's, with the tier image's python."""
    return build_argv(Path(TIER_PYTHON), launch)


def tier_objects(
    spec: DeploymentSpec, launches: list[TierLaunch], guard_text: str, options: KubeOptions
) -> list[Manifest]:
    """The tier guard's ConfigMap, the tiers' pods, a headless Service per tier, the
    NetworkPolicy, for the co-located shape the GPU's ResourceClaimTemplate, and for a tier of
    more than one replica a PodDisruptionBudget (one of its pods down at a time)."""
    ns = options.namespace
    llama = options.tier_engine == LLAMA_CPP
    objects: list[Manifest] = [] if llama else [guard_map(guard_text, ns)]
    replicas: dict[str, int] = {tier.name: tier.replicas for tier in spec.tiers}
    if options.shape == "per-tier":
        for launch in launches:
            container = tier_container(spec, launch, options, port_name="http")
            if not llama:
                container["resources"] = {"requests": {GPU: 1}, "limits": {GPU: 1}}
            deployment = _deployment(launch.name, [container], {}, guard_text, options)
            objects.append(_scaled(deployment, replicas[launch.name]))
    elif llama:  # CPU tiers start in a second: no turns to take, no device to claim
        containers = [tier_container(spec, t, options, port_name=t.name) for t in launches]
        objects.append(_deployment(None, containers, {}, guard_text, options))
    else:
        objects.append(gpu_claim_template(options))
        containers = []
        for i, launch in enumerate(launches):
            container = tier_container(spec, launch, options, port_name=launch.name)
            container["resources"] = {"claims": [{"name": CLAIM}]}
            if i < len(launches) - 1:  # the next container starts once this one is healthy
                container["lifecycle"] = {"postStart": _wait_healthy(launch.port, spec)}
            containers.append(container)
        claims = {"resourceClaims": [{"name": CLAIM, "resourceClaimTemplateName": CLAIM_TEMPLATE}]}
        objects.append(_deployment(None, containers, claims, guard_text, options))
    for launch in launches:
        selector = labels(TIER, launch.name if options.shape == "per-tier" else None)
        ports = [{"name": "http", "port": launch.port, "targetPort": launch.port}]
        objects.append(headless_service(tier_service_name(launch.name), ns, TIER, selector, ports))
    objects.append(
        only_gateway_in("tiers-from-gateway-only", ns, labels(TIER), [t.port for t in launches])
    )
    for launch in launches:
        if replicas[launch.name] > 1:
            objects.append(_disruption_budget(launch.name, options.namespace))
    return objects


def tier_container(
    spec: DeploymentSpec, launch: TierLaunch, options: KubeOptions, port_name: str
) -> Manifest:
    """One tier server: the argv builder's command, its environment and key from the Secret
    (vLLM: the guard's package on PYTHONPATH; llama.cpp: llama_tiers.py), probes from the spec's
    restart policy."""
    restart = spec.restart
    health = launch.port
    return {
        **_server(launch, options, port_name),
        "startupProbe": http_probe(
            "/health",
            health,
            START_PERIOD_S,
            seconds(restart.health_timeout_s),
            seconds(spec.start_timeout_s / START_PERIOD_S),
        ),
        "readinessProbe": http_probe(
            "/health",
            health,
            seconds(restart.health_interval_s),
            seconds(restart.health_timeout_s),
            1,
        ),
        "livenessProbe": http_probe(
            "/health",
            health,
            seconds(restart.health_interval_s),
            seconds(restart.health_timeout_s),
            restart.health_misses,
        ),
    }


def _server(launch: TierLaunch, options: KubeOptions, port_name: str) -> Manifest:
    if launch.engine == LLAMA_CPP:
        return llama_container(launch, options, port_name)
    env = build_env(launch, {})
    env["PYTHONPATH"] = GUARD_ROOT
    return {
        "name": launch.name,
        "image": options.tiers_image,
        "command": tier_argv(launch),
        "env": [
            *({"name": key, "value": env[key]} for key in sorted(env)),
            # The tier guard's key, and vLLM's own on /v1: the one key the gateway sends.
            secret_env(GUARD_KEY_ENV, options.secret_name, TIER_KEY),
            secret_env("VLLM_API_KEY", options.secret_name, TIER_KEY),
        ],
        "ports": [{"name": port_name, "containerPort": launch.port, "protocol": "TCP"}],
        "volumeMounts": [
            {"name": VARIANTS_VOLUME, "mountPath": VARIANTS_MOUNT, "readOnly": True},
            {"name": GUARD_MAP, "mountPath": f"{GUARD_ROOT}/{GUARD_PACKAGE}", "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
        "securityContext": {"allowPrivilegeEscalation": False},
    }


def guard_map(guard_text: str, namespace: str) -> Manifest:
    """backends/tier_guard.py (standard library only) for the tiers to import, as a package."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(GUARD_MAP, namespace, TIER),
        "data": {"__init__.py": "", GUARD_FILE: guard_text},
    }


def gpu_claim_template(options: KubeOptions) -> Manifest:
    """Exactly one GPU of ``gpu_device_class``, claimed once per pod and shared by its
    containers (dynamic resource allocation, resource.k8s.io/v1)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": meta(CLAIM_TEMPLATE, options.namespace, TIER),
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": CLAIM,
                            "exactly": {
                                "deviceClassName": options.gpu_device_class,
                                "allocationMode": "ExactCount",
                                "count": 1,
                            },
                        }
                    ]
                }
            }
        },
    }


def _wait_healthy(port: int, spec: DeploymentSpec) -> Manifest:
    """A postStart hook: kubelet starts a pod's next container only after it returns, so the
    tiers start in turn (two vLLM servers starting at once on one GPU break its profiling)."""
    tries = seconds(spec.start_timeout_s / 2)
    script = (
        "import time, urllib.request\n"
        f"for _ in range({tries}):\n"
        "    try:\n"
        f"        urllib.request.urlopen('http://127.0.0.1:{port}/health', timeout=2)\n"
        "        break\n"
        "    except Exception:\n"
        "        time.sleep(2)\n"
    )
    return {"exec": {"command": [TIER_PYTHON, "-c", script]}}


def _deployment(
    tier: str | None,
    containers: list[Manifest],
    pod_extra: Manifest,
    guard_text: str,
    options: KubeOptions,
) -> Manifest:
    pod_labels = labels(TIER, tier)
    name = tier_service_name(tier) if tier is not None else CO_LOCATED
    llama = options.tier_engine == LLAMA_CPP
    volumes = (
        [variants_volume(options.variants_claim), slots_volume()]
        if llama
        else [
            variants_volume(options.variants_claim),
            {"name": GUARD_MAP, "configMap": {"name": GUARD_MAP}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        ]
    )
    annotations = {} if llama else {"model-optimizer/tier-guard-sha256": checksum(guard_text)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(name, options.namespace, TIER, tier),
        "spec": {
            "replicas": 1,
            # A new pod needs the GPU the old one holds: stop it first.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": pod_labels},
            "template": {
                "metadata": {"labels": pod_labels, "annotations": annotations},
                "spec": {
                    "automountServiceAccountToken": False,
                    "containers": containers,
                    **pod_extra,
                    "volumes": volumes,
                },
            },
        },
    }


def _scaled(deployment: Manifest, replicas: int) -> Manifest:
    """A tier Deployment of ``replicas`` pods. Above one, updates roll one pod at a time and
    never add one first (``maxSurge: 0``: each pod holds a GPU), so the pool keeps serving."""
    if replicas > 1:
        deployment["spec"]["replicas"] = replicas
        rolling = {"maxSurge": 0, "maxUnavailable": 1}
        deployment["spec"]["strategy"] = {"type": "RollingUpdate", "rollingUpdate": rolling}
    return deployment


def _disruption_budget(tier: str, namespace: str) -> Manifest:
    """At most one pod of a scaled tier voluntarily down at a time (a node drain)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(tier_service_name(tier), namespace, TIER, tier),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels(TIER, tier)}},
    }
