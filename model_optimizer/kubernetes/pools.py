"""Gateway API Inference Extension ``InferencePool`` objects, one per tier (pure, opt-in).

This gateway chooses the tier (the precision) of a request; an InferencePool names the pods of
one tier, so that an endpoint picker (the extension's EPP, llm-d's inference scheduler) behind
an inference-aware proxy can choose among them. Only the pools are rendered: the endpoint
picker (``tier-<name>-epp``, a Service on ``endpoint_picker_port``), the proxy's Gateway and
HTTPRoutes are the cluster's own (docs/kubernetes.md#llm-d-and-the-inference-extension).
"""

from __future__ import annotations

from backends.launch import TierLaunch
from model_optimizer.kubernetes.objects import TIER, Manifest, labels, meta, tier_service_name
from model_optimizer.kubernetes.options import KubeOptions

API_VERSION = "inference.networking.k8s.io/v1"


def endpoint_picker_name(tier: str) -> str:
    """The endpoint picker's Service a tier's pool names (the extension's chart: ``<pool>-epp``)."""
    return f"{tier_service_name(tier)}-epp"


def inference_pools(launches: list[TierLaunch], options: KubeOptions) -> list[Manifest]:
    """One InferencePool per tier: its pods (the per-tier shape's tier label; the co-located
    pod holds every tier and is told apart by the port), its port, its endpoint picker. None
    unless ``options.inference_pools``."""
    if not options.inference_pools:
        return []
    per_tier = options.shape == "per-tier"
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "InferencePool",
            "metadata": meta(
                tier_service_name(t.name), options.namespace, TIER, t.name if per_tier else None
            ),
            "spec": {
                "selector": {"matchLabels": labels(TIER, t.name if per_tier else None)},
                "targetPorts": [{"number": t.port}],
                "endpointPickerRef": {
                    "name": endpoint_picker_name(t.name),
                    "port": {"number": options.endpoint_picker_port},
                },
            },
        }
        for t in launches
    ]
