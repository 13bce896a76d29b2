"""A llama.cpp tier as a container (pure): llama.cpp's own server image on a CPU node.

The command is ``backends.llama_args.build_argv`` of the launch (the very line ``up`` runs),
with the image's program (``/app/llama-server``), the variant folder where the pod mounts it,
``0.0.0.0`` for a host and a pod of its own's cores as threads (``tier_cpus``: the per-tier
shape gives each tier its cores; co-located tiers share the pod's, one thread each, as ``up``
runs them). The tier key is llama-server's own (``LLAMA_API_KEY``, from the Secret): it guards
every route but ``/health``, so no tier guard is mounted. Slot files (the KV reset erases
slots) go to an emptyDir.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from backends.launch import TierLaunch
from backends.llama_args import KEY_ENV, build_argv, build_env
from model_optimizer.kubernetes.objects import (
    TIER_KEY,
    VARIANTS_MOUNT,
    VARIANTS_VOLUME,
    Manifest,
    secret_env,
)
from model_optimizer.kubernetes.options import KubeOptions

SERVER = Path("/app/llama-server")  # in ghcr.io/ggml-org/llama.cpp:server
SLOTS_VOLUME, SLOTS_MOUNT = "slots", "/slots"


def llama_launch(launch: TierLaunch, options: KubeOptions) -> TierLaunch:
    """The launch as a pod runs it: its cores as threads (per-tier), slots in the emptyDir."""
    threads = options.tier_cpus if options.shape == "per-tier" else 1
    return dataclasses.replace(launch, threads=threads, slot_dir=Path(SLOTS_MOUNT))


def llama_container(launch: TierLaunch, options: KubeOptions, port_name: str) -> Manifest:
    """One llama-server: command, environment (the key from the Secret), CPU requests, the
    variants and the slots' folder mounted. Probes are added by the caller (both engines')."""
    env = build_env(launch, {})
    cpus = str(options.tier_cpus) if options.shape == "per-tier" else "1"
    return {
        "name": launch.name,
        "image": options.tiers_image,
        "command": build_argv(SERVER, launch),
        "env": [
            *({"name": key, "value": env[key]} for key in sorted(env)),
            secret_env(KEY_ENV, options.secret_name, TIER_KEY),
        ],
        "ports": [{"name": port_name, "containerPort": launch.port, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": cpus}, "limits": {"cpu": cpus}},
        "volumeMounts": [
            {"name": VARIANTS_VOLUME, "mountPath": VARIANTS_MOUNT, "readOnly": True},
            {"name": SLOTS_VOLUME, "mountPath": SLOTS_MOUNT},
        ],
        "securityContext": {"allowPrivilegeEscalation": False},
    }


def slots_volume() -> Manifest:
    return {"name": SLOTS_VOLUME, "emptyDir": {}}
