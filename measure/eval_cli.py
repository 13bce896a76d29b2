"""The ``eval`` command's arguments and its run: ``eval`` (quality per tier) and
``eval routing FILE`` (the gateway's routing on a labeled prompt set).

``routing`` is an action of ``eval`` rather than a command of its own: both evaluate the
deployment's quality against fp16 with the same tier flags, and ``eval`` alone stays the
issue's ``model-optimizer eval``.

Tiers: ``--tiers fp16=URL,int8=URL,...`` or ``--tier-base URL`` (the first tier's URL, the
others on the following ports, named by ``--tier-names``, as ``up --tier-port`` lays them).
Bad input: one line, exit 2; an unusable server: one line, exit 1. Outputs go to ``--output``
all at once (a temporary folder renamed into place).

``eval`` runs the code the tiers answer to HumanEval prompts (in measure/sandbox.py's
sandbox, which must work here: exit 1 otherwise): a tier URL whose host is not this machine's
loopback is refused unless ``--allow-remote-code`` says the operator trusts that server.
``eval routing`` runs no generated code; its cost axis needs the tiers' speeds as ``up``
measured them (``--measured``, by default the file ``up`` wrote for the gateway's port): none,
or none for a tier evaluated, is a usage error (exit 2) rather than a made-up cost.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import sys
from pathlib import Path
from urllib.parse import urlsplit

from gateway.measured import MeasuredError, measured_path, read_measured
from measure import eval_report, routing_eval
from measure.eval_data import EvalDataError
from measure.evaluate import EvalOptions, evaluate
from measure.frontier import Speed
from measure.sandbox import SandboxUnavailable, check_sandbox
from measure.vllm_client import EndpointError

DEFAULT_BASE = "http://127.0.0.1:8101"  # policies/deploy/tiers.yaml's first tier


class UsageError(ValueError):
    pass


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ev = sub.add_parser("eval", help="quality per tier against fp16; `eval routing FILE`")
    _common(ev)
    ev.add_argument("--runs", type=int, default=3, help="repeat every figure (default 3)")
    ev.add_argument("--limit", type=int, default=10, help="items per category (default 10)")
    ev.add_argument("--max-tokens", type=int, default=256, help="per generated answer")
    ev.add_argument("--sandbox-timeout", type=float, default=10.0, help="s per HumanEval test")
    ev.add_argument(
        "--allow-remote-code",
        action="store_true",
        help="run HumanEval code answered by tiers that are not on this machine's loopback",
    )
    ev.add_argument("--output", default="eval-out", help="folder for eval.json and eval.md")
    actions = ev.add_subparsers(dest="eval_action", metavar="ACTION")
    rt = actions.add_parser("routing", help="replay a labeled prompt set through the gateway")
    rt.add_argument("file", metavar="FILE", help="JSONL rows {prompt, label}")
    _common(rt)
    rt.add_argument("--gateway", default="http://127.0.0.1:8000", help="the gateway's URL")
    rt.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    rt.add_argument("--max-tokens", type=int, default=64, help="per answer (default 64)")
    rt.add_argument("--output", default="routing-out", help="routing.json, .md, frontier.png")
    rt.add_argument(
        "--measured",
        default=None,
        help="the tiers' measured speeds (default: the file up wrote for a loopback --gateway's "
        "port, <cache>/measured/gateway-PORT.json)",
    )


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tiers", default="", help="name=URL,... (the reference among them)")
    parser.add_argument("--tier-base", default=DEFAULT_BASE, help="first tier URL (no --tiers)")
    parser.add_argument("--tier-names", default="fp16,int8,int4", help="with --tier-base")
    parser.add_argument("--reference", default="fp16", help="the tier others are compared to")
    parser.add_argument("--model", default=None, help="model id (default: the tier's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=4, help="requests at once")


def parse_tiers(tiers: str, base: str, names: str) -> dict[str, str]:
    """``name=URL,...``; or ``names`` on consecutive ports from ``base``."""
    out: dict[str, str] = {}
    if tiers:
        for part in tiers.split(","):
            name, sep, url = part.partition("=")
            if not sep or not name.strip() or not url.strip():
                raise UsageError(f"--tiers: {part!r} is not name=URL")
            if name.strip() in out:
                raise UsageError(f"--tiers: {name.strip()} named twice")
            out[name.strip()] = _url(url.strip(), "--tiers")
        return out
    split = urlsplit(_url(base, "--tier-base"))
    if split.port is None:
        raise UsageError(f"--tier-base: {base!r} has no port")
    for i, name in enumerate(n.strip() for n in names.split(",")):
        if not name or name in out:
            raise UsageError(f"--tier-names: empty or repeated name in {names!r}")
        out[name] = f"{split.scheme}://{split.hostname}:{split.port + i}"
    return out


def _url(url: str, flag: str) -> str:
    split = urlsplit(url)
    if split.scheme not in ("http", "https") or not split.hostname:
        raise UsageError(f"{flag}: {url!r} is not an http(s) URL")
    return url.rstrip("/")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def remote_tiers(tiers: dict[str, str]) -> list[str]:
    """The tiers whose URL's host is not this machine's loopback (127.0.0.0/8, ::1, localhost)."""
    return [name for name, url in tiers.items() if not _loopback(urlsplit(url).hostname or "")]


def _positive(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive")


def run(args: argparse.Namespace) -> int:
    try:
        tiers = parse_tiers(args.tiers, args.tier_base, args.tier_names)
        if args.reference not in tiers:
            raise UsageError(f"--reference {args.reference} is not among the tiers")
        _positive(args, "limit", "max_tokens", "concurrency")
        output = Path(args.output)
        if output.exists() and (not output.is_dir() or any(output.iterdir())):
            raise UsageError(f"--output {output}: exists and is not an empty folder")
        if args.eval_action == "routing":
            return _routing(args, tiers, output)
        _positive(args, "runs", "sandbox_timeout")
        remote = remote_tiers(tiers)
        if remote and not args.allow_remote_code:
            name = remote[0]
            raise UsageError(
                f"tier {name} at {tiers[name]} is not on this machine, and eval runs the code "
                "it answers (HumanEval): pass --allow-remote-code to trust it"
            )
        return _quality(args, tiers, output)
    except UsageError as exc:
        return _fail(str(exc), 2)
    except KeyboardInterrupt:
        return 130


def _fail(message: str, code: int) -> int:
    print(f"model-optimizer: error: {message}", file=sys.stderr)
    return code


def _quality(args: argparse.Namespace, tiers: dict[str, str], output: Path) -> int:
    try:
        check_sandbox()  # before any tier is asked: no sandbox, no HumanEval
    except SandboxUnavailable as exc:
        return _fail(str(exc), 1)
    opts = EvalOptions(
        tiers=tiers,
        reference=args.reference,
        model=args.model,
        runs=args.runs,
        seed=args.seed,
        limit=args.limit,
        max_tokens=args.max_tokens,
        concurrency=args.concurrency,
        sandbox_timeout=args.sandbox_timeout,
    )
    try:
        prepared, runs = asyncio.run(evaluate(opts))
    except EvalDataError as exc:
        return _fail(str(exc), 2)
    except EndpointError as exc:
        return _fail(str(exc), 1)
    data = eval_report.report(opts, prepared, runs)
    md = eval_report.markdown(data)
    files = {"eval.json": eval_report.json_bytes(data), "eval.md": md.encode()}
    eval_report.write_atomically(output, files)
    print(md, end="")
    print(f"eval: wrote {output}/eval.json and eval.md", file=sys.stderr)
    return 0


def measured_speeds(
    gateway: str, flag: str | None, tiers: dict[str, str]
) -> tuple[dict[str, Speed], str]:
    """The tiers' speeds from ``--measured`` or the file ``up`` wrote for the gateway's port
    (a loopback gateway only: the file describes this machine's stack); notes on stderr."""
    split = urlsplit(gateway)
    if flag is not None:
        path = Path(flag)
    elif _loopback(split.hostname or ""):
        path = measured_path(split.port or (443 if split.scheme == "https" else 80))
    else:
        raise UsageError(f"--gateway {gateway} is not on this machine: pass --measured FILE")
    try:
        measured = read_measured(path)
    except MeasuredError as exc:
        raise UsageError(str(exc)) from None
    if measured is None:
        raise UsageError(
            f"no measured tier speeds at {path} (up writes it for the stack it starts): "
            "start the stack with `model-optimizer up`, or pass --measured FILE"
        )
    try:
        speeds, source, notes = routing_eval.speeds_from(measured, tiers, path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for note in notes:
        print(f"eval routing: note: {note}", file=sys.stderr)
    return speeds, source


def _routing(args: argparse.Namespace, tiers: dict[str, str], output: Path) -> int:
    gateway = _url(args.gateway, "--gateway")
    try:
        prompts = routing_eval.load_prompts(Path(args.file), args.limit)
    except EvalDataError as exc:
        return _fail(str(exc), 2)
    speeds, source = measured_speeds(gateway, args.measured, tiers)
    opts = routing_eval.RoutingOptions(
        file=Path(args.file),
        gateway=gateway,
        tiers=tiers,
        reference=args.reference,
        speeds=speeds,
        speed_source=source,
        model=args.model,
        seed=args.seed,
        max_tokens=args.max_tokens,
        concurrency=args.concurrency,
    )
    try:
        data = routing_eval.run(opts, prompts)
    except EndpointError as exc:
        return _fail(str(exc), 1)
    md = routing_eval.markdown(data, "frontier.png")
    files = {
        "routing.json": eval_report.json_bytes(data),
        "routing.md": md.encode(),
        "frontier.png": routing_eval.plot(data),
    }
    eval_report.write_atomically(output, files)
    print(md, end="")
    print(f"eval routing: wrote {output}/routing.json, routing.md, frontier.png", file=sys.stderr)
    return 0
