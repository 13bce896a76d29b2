"""``model-optimizer deploy kubernetes``: the deployment spec ``up`` reads, as plain manifests.

Reads the spec, each tier's variant facts (``kv_cache_config.json`` and ``metadata.json`` of
the variants the pods will mount, for the values the spec leaves null), the routing policy
(checked as the gateway checks it) and backends/tier_guard.py; renders
(model_optimizer/kubernetes/render.py, pure) and writes one file per object, all or nothing.
Usage errors (a bad spec, policy, option or output folder) exit 2, in one line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from backends.spec import DeploymentSpec, SpecError, load_spec, spec_error
from backends.tier_plan import read_variants
from backends.vllm_args import SOURCE_ROOT
from gateway.policy.schema import PolicyError
from gateway.policy.store import PolicyStore
from model_optimizer.kubernetes.options import SHAPES, TIER_ENGINES, KubeOptions, OptionsError
from model_optimizer.kubernetes.render import Sources, render
from model_optimizer.kubernetes.tiers import GUARD_FILE, GUARD_PACKAGE
from model_optimizer.kubernetes.write import (
    OutputError,
    rendered_files,
    secret_example,
    write_all,
)

DEFAULTS = KubeOptions()
GUARD_SOURCE = SOURCE_ROOT / GUARD_PACKAGE / GUARD_FILE
DEFAULT_SPEC = SOURCE_ROOT / "policies" / "deploy" / "tiers.yaml"
DEFAULT_POLICY = SOURCE_ROOT / "policies" / "routing.yaml"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    deploy = sub.add_parser("deploy", help="render the deployment for a cluster")
    targets = deploy.add_subparsers(dest="deploy_target", metavar="TARGET", required=True)
    k8s = targets.add_parser("kubernetes", help="plain Kubernetes manifests, one file per object")
    k8s.add_argument("--spec", default=str(DEFAULT_SPEC), help="deployment spec (tiers.yaml)")
    k8s.add_argument("--output", required=True, help="folder for the manifests (replaced whole)")
    k8s.add_argument(
        "--variants", default=None, help="the variants the pods mount (default: the spec's)"
    )
    k8s.add_argument("--policy", default=str(DEFAULT_POLICY), help="routing policy for the map")
    k8s.add_argument("--namespace", default=DEFAULTS.namespace)
    k8s.add_argument("--image", default=DEFAULTS.image, help="gateway image (repo at /app)")
    k8s.add_argument(
        "--tier-engine",
        choices=TIER_ENGINES,
        default=DEFAULTS.tier_engine,
        help="vllm (GPU nodes) or llama.cpp (CPU nodes, GGUF variants)",
    )
    k8s.add_argument(
        "--tier-image", default=DEFAULTS.tier_image, help="the tiers' image (default: the engine's)"
    )
    k8s.add_argument("--engine", default=DEFAULTS.engine, help="the tier image's vLLM")
    k8s.add_argument(
        "--tier-cpus", type=int, default=DEFAULTS.tier_cpus, help="llama.cpp: cores a tier pod"
    )
    k8s.add_argument("--gateway-replicas", type=int, default=DEFAULTS.gateway_replicas)
    k8s.add_argument("--max-gateway-replicas", type=int, default=DEFAULTS.max_gateway_replicas)
    k8s.add_argument("--shape", choices=SHAPES, default=DEFAULTS.shape)
    k8s.add_argument("--redis-url", default=None, help="an external Redis (default: render one)")
    k8s.add_argument("--secret-name", default=DEFAULTS.secret_name, help="the keys' Secret")
    k8s.add_argument("--variants-claim", default=DEFAULTS.variants_claim, help="variants PVC")
    k8s.add_argument("--gpu-device-class", default=DEFAULTS.gpu_device_class)
    k8s.add_argument(
        "--inference-pools",
        action="store_true",
        help="also an InferencePool per tier (Gateway API Inference Extension; off by default)",
    )
    k8s.add_argument(
        "--endpoint-picker-port",
        type=int,
        default=DEFAULTS.endpoint_picker_port,
        help="the port of each pool's endpoint picker Service, tier-<name>-epp",
    )


def options_of(args: argparse.Namespace) -> KubeOptions:
    return KubeOptions(
        namespace=args.namespace,
        image=args.image,
        tier_engine=args.tier_engine,
        tier_image=args.tier_image,
        engine=args.engine,
        tier_cpus=args.tier_cpus,
        gateway_replicas=args.gateway_replicas,
        max_gateway_replicas=args.max_gateway_replicas,
        shape=args.shape,
        redis_url=args.redis_url or None,
        secret_name=args.secret_name,
        variants_claim=args.variants_claim,
        gpu_device_class=args.gpu_device_class,
        inference_pools=args.inference_pools,
        endpoint_picker_port=args.endpoint_picker_port,
    )


def render_files(
    spec_path: Path, variants: Path | None, policy: Path, options: KubeOptions
) -> dict[str, str]:
    """File name → text of everything ``--output`` gets; raises the one-line errors."""
    spec = load_spec(spec_path)
    folder = variants or spec.variants_dir
    if folder is None:
        raise _no_variants(spec)
    PolicyStore(policy, [t.name for t in spec.tiers]).load()  # the gateway's own checks
    policy_text = policy.read_text(encoding="utf-8")
    sources = Sources(policy_text=policy_text, guard_text=GUARD_SOURCE.read_text(encoding="utf-8"))
    facts = read_variants(spec, {options.tier_engine: folder}, options.tier_engine)
    objects = render(spec, facts, sources, options)
    return rendered_files(objects, secret_example(options.namespace, options.secret_name))


def _no_variants(spec: DeploymentSpec) -> SpecError:
    return spec_error(
        spec,
        ("variants_dir",),
        "null: give --variants DIR, the variants the pods mount (their kv_cache_config.json "
        "fills the fields the spec leaves null)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        options = options_of(args)
        files = render_files(
            Path(args.spec),
            Path(args.variants) if args.variants else None,
            Path(args.policy),
            options,
        )
        write_all(files, Path(args.output))
    except (SpecError, PolicyError, OptionsError, OutputError) as exc:
        print(f"model-optimizer: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"model-optimizer: error: cannot write {args.output}: {exc}", file=sys.stderr)
        return 1
    objects = len(files) - 1
    print(
        f"deploy: wrote {objects} objects to {args.output} ({options.shape}); apply with "
        f"kubectl apply -f {args.output} once the Secret {options.secret_name} exists"
    )
    return 0
