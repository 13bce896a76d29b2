"""The ``model-optimizer`` command line: parse, dispatch, turn known failures into one line.

Usage errors (bad model path, a file that is not a model, a port in use) exit with 2;
failures while running (a tier that dies during start) exit with 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from backends.process import TierStartError
from backends.spec import SpecError, load_spec
from common.class_categories import CLASS_NAMES
from gateway.measured import MeasuredError, MeasuredStack, measured_path, read_measured
from gateway.policy.chain_check import check_chains, route_lines
from gateway.policy.derive import derive_routes
from gateway.policy.schema import PolicyError, RoutingPolicy
from gateway.policy.store import PolicyStore
from measure import command as bench_command
from measure import eval_cli
from measure.vllm_client import EndpointError
from model_optimizer import __version__
from model_optimizer import classifier as classifier_command
from model_optimizer import deploy as deploy_command
from model_optimizer import routes as routes_command
from model_optimizer.models import AlreadyReported, ModelError
from model_optimizer.optimize import run_check, run_optimize
from model_optimizer.serving_check import admission_probes, check_tiers
from model_optimizer.soak import kill_tier, render, soak
from model_optimizer.stack import run_up
from model_optimizer.tier_setup import DEFAULT_POLICY, DEFAULT_SPEC, StackLauncher, UpOptions

DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
DEFAULT_GATEWAY_PORT = 8000


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="model-optimizer",
        description="Serve one LLM at several precisions behind one OpenAI-compatible endpoint.",
    )
    parser.add_argument("--version", action="version", version=f"model-optimizer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    up = sub.add_parser("up", help="run the model's tier(s) and the gateway on 127.0.0.1")
    up.add_argument("--model", default="default", help="'default', an HF folder or a GGUF file")
    up.add_argument("--served-model-name", default=None, help="public model id")
    up.add_argument(
        "--port", type=int, default=DEFAULT_GATEWAY_PORT, help="gateway port (default 8000)"
    )
    up.add_argument(
        "--tier-port", type=int, default=None, help="first tier's port, the others follow"
    )
    up.add_argument("--tiers", default="", help="a subset of the spec's tiers, e.g. fp16,int4")
    up.add_argument("--spec", default=None, help="deployment spec (policies/deploy/tiers.yaml)")
    up.add_argument("--recipe", default=None, help="optimizer recipe for the variants")
    up.add_argument(
        "--variants", default=None, help="serve pre-built variants (fp16/ int8/ int4/) as they are"
    )
    up.add_argument("--policy", default=None, help="routing policy (policies/routing.yaml)")
    up.add_argument(
        "--engine",
        choices=("auto", "vllm", "llama.cpp"),
        default=None,
        help="the tiers' engine (default: the spec's, auto: vLLM on a GPU, llama.cpp on a CPU)",
    )
    up.add_argument(
        "--redis-url", default=DEFAULT_REDIS, help=f"shared state ('' for none; {DEFAULT_REDIS})"
    )
    up.add_argument(
        "--no-gateway-measurement",
        action="store_true",
        help="measure the tiers once at start only (the gateway does not measure them again)",
    )
    opt = sub.add_parser("optimize", help="write FP16/INT8/INT4 variants of a model")
    _optimize_args(opt)
    chk = sub.add_parser("check", help="precision-check a variant folder against its model")
    chk.add_argument("--model", default="default", help="the original the variant came from")
    chk.add_argument("--variant", default=None, help="a variant folder (has metadata.json)")
    chk.add_argument("--recipe", default=None, help="thresholds (default recipe if omitted)")
    chk.add_argument(
        "--serving",
        action="store_true",
        help="instead: check running tiers against the reference in the engine (admission)",
    )
    chk.add_argument("--tier-base", default="http://127.0.0.1:8101", help="with --serving")
    chk.add_argument("--tier-names", default="fp16,int8,int4", help="with --serving")
    chk.add_argument("--tier-urls", default=None, help="with --serving: fp16=URL,int8=URL,...")
    chk.add_argument("--spec", default=None, help="with --serving: floors (tiers.yaml)")
    pol = sub.add_parser("policy", help="routing policy tools")
    pol_sub = pol.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    pol_chk = pol_sub.add_parser("check", help="validate a routing policy as the gateway would")
    pol_chk.add_argument("file", metavar="FILE", help="routing policy (policies/routing.yaml)")
    pol_chk.add_argument(
        "--deploy", default=None, help="also require its tiers in this deployment spec"
    )
    pol_chk.add_argument(
        "--measured",
        default=None,
        help="warn where a static route contradicts these measurements (default: the file up "
        f"wrote for a gateway on port {DEFAULT_GATEWAY_PORT}, <cache>/measured/gateway-PORT.json)",
    )
    pol_chk.add_argument(
        "--strict", action="store_true", help="exit 1 when there is any warning (default: 0)"
    )
    sk = sub.add_parser("soak", help="steady load through a running gateway, with a reset")
    sk.add_argument("--gateway", default="http://127.0.0.1:8000", help="a loopback gateway URL")
    sk.add_argument("--model", default="SmolLM2-135M-Instruct", help="the served model id")
    sk.add_argument("--clients", type=int, default=4)
    sk.add_argument("--minutes", type=float, default=10.0)
    sk.add_argument("--gateway-pid", type=int, default=None, help="for RSS at start and end")
    sk.add_argument("--reset-tier", default=None, help="reset this tier halfway (admin key)")
    sk.add_argument("--kill-tier", default=None, help="SIGKILL this tier's server (admin key)")
    sk.add_argument("--kill-every", type=float, default=60.0, help="seconds between kills")
    bench = sub.add_parser("bench", help="serving benchmark of a gateway or tier")
    bench_command.add_arguments(bench)
    eval_cli.add_parser(sub)  # `eval` and `eval routing FILE`
    classifier_command.add_parser(sub)  # `classifier train` and `classifier evaluate`
    deploy_command.add_parser(sub)  # `deploy kubernetes`
    routes_command.add_parser(sub)  # `routes`: a running gateway's /admin/routes
    return parser


def _optimize_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default", help="'default', an HF folder or a GGUF")
    parser.add_argument("--recipe", default=None, help="recipe YAML (policies/recipes/...)")
    parser.add_argument("--output", required=True, help="folder for the variants")
    parser.add_argument("--quantize", default=None, help="only this variant: fp16, int8, int4")
    parser.add_argument("--compile-level", type=int, default=1, choices=(1, 2, 3))
    parser.add_argument(
        "--target-framework", default=None, help="engine the variants target, e.g. vllm==0.32.0"
    )


def _seeds_form(argv: list[str]) -> bool:
    """The seeds' form has no subcommand: ``model-optimizer --model M --quantize Q --output D``."""
    return bool(argv) and argv[0].startswith("--") and argv[0] not in ("--version", "--help", "-h")


def _optimize(args: argparse.Namespace) -> int:
    return run_optimize(
        model=args.model,
        output=args.output,
        recipe=args.recipe,
        quantize=args.quantize,
        compile_level=args.compile_level,
        target_framework=args.target_framework,
    )


def _up(args: argparse.Namespace) -> int:
    return run_up(
        UpOptions(
            model=args.model,
            served_model_name=args.served_model_name,
            gateway_port=args.port,
            tier_port=args.tier_port,
            tiers=tuple(t for t in args.tiers.split(",") if t),
            spec=Path(args.spec) if args.spec else DEFAULT_SPEC,
            recipe=args.recipe,
            variants=Path(args.variants) if args.variants else None,
            policy=Path(args.policy) if args.policy else DEFAULT_POLICY,
            redis_url=args.redis_url or None,
            engine=args.engine,
            gateway_measures=not args.no_gateway_measurement,
        )
    )


def _soak(args: argparse.Namespace) -> int:
    """``soak``: the long version of the soak test; the admin key from MO_GATEWAY_ADMIN_KEYS."""
    if args.clients < 1 or args.minutes <= 0:
        print("model-optimizer: error: --clients and --minutes must be positive", file=sys.stderr)
        return 2
    key = os.environ.get("MO_GATEWAY_ADMIN_KEYS", "").split(",")[0].strip() or None
    if (args.reset_tier or args.kill_tier) and key is None:
        which = "--reset-tier" if args.reset_tier else "--kill-tier"
        print(f"model-optimizer: error: {which} needs MO_GATEWAY_ADMIN_KEYS", file=sys.stderr)
        return 2
    if args.kill_every <= 0:
        print("model-optimizer: error: --kill-every must be positive", file=sys.stderr)
        return 2
    url = args.gateway.rstrip("/")
    kill = kill_tier(url, args.kill_tier, key or "") if args.kill_tier else None
    try:
        result = soak(
            url,
            args.model,
            clients=args.clients,
            seconds=args.minutes * 60,
            gateway_pid=args.gateway_pid,
            reset_tier=args.reset_tier,
            admin_key=key,
            kill_every=args.kill_every,
            kill=kill,
            say=lambda text: print(f"soak: {text}", file=sys.stderr, flush=True),
        )
    except ValueError as exc:
        print(f"model-optimizer: error: {exc}", file=sys.stderr)
        return 2
    print(render(result))
    return 0 if result.lost == 0 else 1


def _serving_check(args: argparse.Namespace) -> int:
    """``check --serving``: the admission check of ``up`` on running tiers, on demand. Exit 0
    when every tier passes every category, 1 when one does not (or the reference fails)."""
    try:
        tiers = eval_cli.parse_tiers(args.tier_urls, args.tier_base, args.tier_names)
        spec = load_spec(args.spec or DEFAULT_SPEC).admission
        if spec.reference not in tiers:
            raise eval_cli.UsageError(f"the reference tier {spec.reference} is not among them")
    except (eval_cli.UsageError, SpecError) as exc:
        print(f"model-optimizer: error: {exc}", file=sys.stderr)
        return 2
    try:
        result = check_tiers(tiers, spec, admission_probes())
    except EndpointError as exc:
        print(f"model-optimizer: error: {exc}", file=sys.stderr)
        return 1
    if result.reference_problems:
        print(
            f"check: the reference {spec.reference} answers wrong: {result.reference_problems[0]}",
            file=sys.stderr,
        )
        return 1
    for verdict in result.verdicts.values():
        print(f"check: {verdict.summary()}")
    return 0 if all(v.passed for v in result.verdicts.values()) else 1


def _policy_check(args: argparse.Namespace) -> int:
    """``policy check FILE [--deploy SPEC] [--measured FILE] [--strict]``: the gateway's own
    load path, offline; then the static routes against what ``up`` measured (warnings on
    stderr, one a line; exit 0 unless ``--strict``)."""
    path = Path(args.measured) if args.measured else measured_path(DEFAULT_GATEWAY_PORT)
    try:
        known = [tier.name for tier in load_spec(args.deploy).tiers] if args.deploy else None
        policy = PolicyStore(args.file, known).load().policy
        measured = read_measured(path)
        warnings = _chain_warnings(args.file, policy, measured)
    except (PolicyError, SpecError, MeasuredError) as exc:
        print(f"model-optimizer: error: {exc}", file=sys.stderr)
        return 2
    routes = []
    for cls in CLASS_NAMES:
        route = policy.routes.for_class(cls)
        if route is not None:
            how = "most_free_kv of " if route.strategy == "most_free_kv" else ""
            if route.derive is not None:
                goal = route.derive
                how += f"derived (floor {goal.floor:g}, {goal.minimise}) from "
            routes.append(f"{cls} -> {how}{', '.join(route.tiers)}")
    checked = f"; all in {args.deploy}" if args.deploy else ""
    summary = f"tiers {', '.join(policy.tiers)}; routes {'; '.join(routes)}{checked}"
    print(f"{args.file}: ok ({summary})")
    if measured is None:
        note = f"no measurements at {path} (written by up): routes not checked against them"
        print(f"policy check: {note}", file=sys.stderr)
        return 0
    when = f"up on port {measured.gateway_port} at {measured.written_at}"
    print(f"policy check: against {path} ({when}): {len(warnings)} warning(s)", file=sys.stderr)
    for warning in warnings:
        print(warning, file=sys.stderr)
    _, derived = derive_routes(policy, measured.figures(), measured.reference)
    for chain in derived.values():
        print(f"policy check: derived here: {chain.describe()}", file=sys.stderr)
    return 1 if warnings and args.strict else 0


def _chain_warnings(file: str, policy: RoutingPolicy, measured: MeasuredStack | None) -> list[str]:
    """Each static route's contradictions with ``measured`` (gateway/policy/chain_check.py)."""
    if measured is None:
        return []
    lines = route_lines(Path(file).read_text(encoding="utf-8"), file)
    found = check_chains(policy, measured.figures(), measured.reference, measured.floors, lines)
    return [w.render(file) for w in found]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if _seeds_form(argv):
        seeds = argparse.ArgumentParser(prog="model-optimizer")
        _optimize_args(seeds)
        return _optimize(seeds.parse_args(argv))
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_usage(sys.stderr)
        print("model-optimizer: error: a command is required", file=sys.stderr)
        return 2
    if args.command == "optimize":
        return _optimize(args)
    if args.command == "check" and args.serving:
        return _serving_check(args)
    if args.command == "check" and args.variant is None:
        print("model-optimizer: error: check needs --variant DIR (or --serving)", file=sys.stderr)
        return 2
    if args.command == "check":
        return run_check(args.model, args.variant, args.recipe)
    if args.command == "policy":
        return _policy_check(args)
    if args.command == "soak":
        return _soak(args)
    if args.command == "bench":
        return bench_command.run(args, StackLauncher())
    if args.command == "eval":
        return eval_cli.run(args)
    if args.command == "classifier":
        return classifier_command.run(args)
    if args.command == "deploy":
        return deploy_command.run(args)
    if args.command == "routes":
        return routes_command.run(args)
    try:
        return _up(args)
    except AlreadyReported as exc:
        return exc.code
    except (ModelError, SpecError, PolicyError) as exc:
        print(f"model-optimizer: error: {exc}", file=sys.stderr)
        return 2
    except TierStartError as exc:
        code = 2 if "already in use" in str(exc) else 1
        print(f"\nmodel-optimizer: error: {exc}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
