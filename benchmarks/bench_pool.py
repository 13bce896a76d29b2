"""Tier-pool benchmark: the prefix-cache hit rate of multi-turn conversations with and without
session affinity, how requests split between two replicas, and latency/throughput through one
replica against two, measured side by side in one interleaved run.

    ./mo setup && $(python3 -m model_optimizer.envs path gateway)/bin/python \\
        benchmarks/bench_pool.py [--replica URL --replica URL] [--conversations 8] [--turns 4]
        [--rounds 2] [--requests 24] [--concurrency 4] [--max-tokens 32] [--json OUT]

Without --replica it starts what it needs and stops it at the end: ``model-optimizer up --tiers
int4`` on free loopback ports (the default model) and a second vLLM server with the int4 tier's
own command line and environment on another port, bound to another core
(VLLM_CPU_OMP_THREADS_BIND). Two ``python -m gateway`` processes (no Redis) then front them:
"pool" over both replicas, "single" over the first; their policy is the shipped one with
pinning allowed (every request pins int4) and no scheduled resets.

Cache (measure/conversations.py): each of --rounds rounds runs --conversations conversations
per mode (a ~500-token system prompt opened by a nonce of its own, --turns user turns of ~150
tokens, each resending the history, 16 tokens greedy per answer), two at a time through the
pool gateway: ``affinity`` (one x-session-id per conversation), ``spread`` (a new random key per
turn: spread like a balancer without affinity), ``none`` (no key: the least loaded replica); the
mode order rotates per round. The hit rate is the replicas' own counters:
vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total, deltas around each phase.

One vs two replicas: --requests chat requests (a Vicuna question behind a nonce of its own,
--max-tokens tokens with ignore_eos) at --concurrency, through "single", through "pool" without
a session key and through "pool" with a random key per request, in turn each round.

Markdown on stdout, progress on stderr, every figure in --json.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.process import free_port  # noqa: E402
from gateway.request.route.endpoint_choice import SESSION_HEADER, endpoint_id  # noqa: E402
from measure.conversations import (  # noqa: E402
    MODES,
    Phase,
    Plan,
    Turn,
    converse,
    plan,
    pool_cache,
    questions,
    scrape,
    settled,
)
from measure.serving_stats import percentile  # noqa: E402
from model_optimizer.envs import cache_root  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
PIN = {"x-route-tier": "int4"}
TARGETS = ("single", "pool, no key", "pool, key per request")


def say(text: str) -> None:
    print(f"bench_pool: {text}", file=sys.stderr, flush=True)


def cpu() -> dict[str, object]:
    text = Path("/proc/cpuinfo").read_text()
    model = next((x.split(":", 1)[1].strip() for x in text.splitlines() if "model name" in x), "")
    return {"model": model, "cores": os.cpu_count(), "avx512": " avx512f " in text}


def wait_http(url: str, process: subprocess.Popen[bytes], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"bench_pool: {what} exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"bench_pool: {what} not ready in {timeout:.0f} s")


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Last started first: SIGINT to ``up``'s and the replica's process groups (their vLLM
    children too), SIGTERM to the gateways; SIGKILL past two minutes."""
    for process in reversed(procs):
        if process.poll() is None:
            if os.getpgid(process.pid) == process.pid:  # started in a session of its own
                os.killpg(process.pid, signal.SIGINT)
            else:
                process.terminate()
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def start_replicas(folder: Path, procs: list[subprocess.Popen[bytes]]) -> list[str]:
    """``up --tiers int4``, then the int4 server again on another port and core."""
    port, tier_port = free_port(), free_port()
    args = ["up", "--port", str(port), "--tier-port", str(tier_port), "--tiers", "int4"]
    with (folder / "up.log").open("wb") as log:
        up = subprocess.Popen(
            [sys.executable, "-m", "model_optimizer.cli", *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    procs.append(up)
    say("starting model-optimizer up --tiers int4 (the first run builds the variants) ...")
    wait_http(f"http://127.0.0.1:{port}/readyz", up, "model-optimizer up", 1800)
    first = f"http://127.0.0.1:{tier_port}"
    server = next(
        p
        for p in psutil.Process(up.pid).children(recursive=True)
        if "--port" in p.cmdline()
        and p.cmdline()[p.cmdline().index("--port") + 1] == str(tier_port)
    )
    argv, env = server.cmdline(), server.environ()
    second_port = free_port()
    argv[argv.index("--port") + 1] = str(second_port)
    cores = os.cpu_count() or 1
    bound = env.get("VLLM_CPU_OMP_THREADS_BIND", "")
    if bound.isdigit() and cores > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str((int(bound) + 1) % cores)
    say(f"starting the second replica (cores {env.get('VLLM_CPU_OMP_THREADS_BIND')}) ...")
    with (folder / "replica.log").open("wb") as log:
        replica = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    procs.append(replica)
    second = f"http://127.0.0.1:{second_port}"
    wait_http(f"{second}/health", replica, "the second replica", 300)
    return [first, second]


def start_gateway(
    folder: Path, name: str, tier: dict[str, object], procs: list[subprocess.Popen[bytes]]
) -> str:
    policy = yaml.safe_load((ROOT / "policies" / "routing.yaml").read_text())
    policy["pinning"]["allow"] = True
    policy["resets"]["enabled"] = False
    (folder / "routing.yaml").write_text(yaml.safe_dump(policy))
    config = {
        "model_name": MODEL,
        "tiers": [{"name": "int4", "max_model_len": 2048, **tier}],
        "policy_extra_tiers": ["fp16", "int8"],
        "policy_path": str(folder / "routing.yaml"),
        "tokenizer_dir": str(cache_root() / "variants" / MODEL / "fp16"),
        "metrics_interval": 0.5,
    }
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    command = [sys.executable, "-m", "gateway", "--config", str(folder / f"{name}.yaml")]
    with (folder / f"{name}.log").open("wb") as log:
        gateway = subprocess.Popen(
            [*command, "--port", str(port)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
    procs.append(gateway)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/readyz", gateway, f"gateway {name}", 60)
    return url


def cache_round(
    gateway: str, replicas: list[str], phases: dict[str, Phase], args: argparse.Namespace, r: int
) -> None:
    texts, order = questions(), [*MODES[r % 3 :], *MODES[: r % 3]]
    with httpx.Client(timeout=30) as reader, ThreadPoolExecutor(2) as clients:
        for mode in order:
            nonce = secrets.token_hex(4)
            plans = [
                plan(r * 31 + i, f"{nonce}-{i}", texts, args.turns)
                for i in range(args.conversations)
            ]
            n = len(plans)
            before = scrape(reader, replicas, MODEL)
            talks = list(clients.map(talk, [gateway] * n, plans, [mode] * n))
            sent = sum(t.status == 200 for turns in talks for t in turns)
            after = settled(lambda: scrape(reader, replicas, MODEL), before, sent)
            phases[mode].conversations += talks
            phases[mode].cache.append(pool_cache(before, after))
            rate = phases[mode].cache[-1].hit_rate
            say(f"round {r + 1} {mode}: hit rate {'-' if rate is None else f'{rate:.3f}'}")


def talk(gateway: str, conversation: Plan, mode: str) -> list[Turn]:
    with httpx.Client(timeout=300) as client:
        return converse(client, gateway, conversation, mode, model=MODEL, headers=PIN)


def load_round(
    url: str, keyed: bool, args: argparse.Namespace, texts: list[str]
) -> tuple[list[tuple[int, float, int, str]], float]:
    """--requests requests at --concurrency: (status, seconds, completion tokens, endpoint)."""

    def one(i: int) -> tuple[int, float, int, str]:
        content = f"[{secrets.token_hex(4)}] {texts[i % len(texts)]}"
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": args.max_tokens,
            "ignore_eos": True,
            "temperature": 0,
        }
        headers = {**PIN, **({SESSION_HEADER: secrets.token_hex(8)} if keyed else {})}
        started = time.monotonic()
        try:
            with httpx.Client(timeout=300) as client:
                answer = client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
        except httpx.HTTPError:
            return -1, time.monotonic() - started, 0, ""
        seconds = time.monotonic() - started
        tokens = answer.json()["usage"]["completion_tokens"] if answer.status_code == 200 else 0
        return answer.status_code, seconds, tokens, answer.headers.get("x-route-endpoint", "")

    started = time.monotonic()
    with ThreadPoolExecutor(args.concurrency) as clients:
        results = list(clients.map(one, range(args.requests)))
    return results, time.monotonic() - started


def ms(values: list[float], p: float) -> str:
    return f"{percentile(values, p, empty=float('nan')) * 1000:.0f}"


def cache_table(phases: dict[str, Phase], names: dict[str, str], replicas: list[str]) -> list[str]:
    lines = [
        "| mode | conversations | turns | failed | mean prompt tokens | hit rate | hit / queried "
        "tokens | turns per replica (vLLM) | kept on one replica | turn p50 ms | turn p90 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, p in phases.items():
        ok = [t for t in p.turns if t.status == 200]
        hits, queries = sum(c.hits for c in p.cache), sum(c.queries for c in p.cache)
        split = " / ".join(f"{sum(c.finished[u] for c in p.cache):.0f}" for u in replicas)
        rate = f"{p.hit_rate:.3f}" if p.hit_rate is not None else "-"
        prompt = statistics.fmean(t.prompt_tokens for t in ok) if ok else float("nan")
        seconds = [t.seconds for t in ok]
        lines.append(
            f"| {mode} | {len(p.conversations)} | {len(p.turns)} | {len(p.turns) - len(ok)} | "
            f"{prompt:.0f} | {rate} | {hits:.0f} / {queries:.0f} | {split} | "
            f"{p.kept()} of {len(p.conversations)} | {ms(seconds, 50)} | {ms(seconds, 90)} |"
        )
    lines.append(f"\nreplicas: {', '.join(f'{names[endpoint_id(u)]} {u}' for u in replicas)}")
    return lines


Run = tuple[list[tuple[int, float, int, str]], float]  # (status, s, tokens, endpoint)s, wall s


def load_table(runs: dict[str, list[Run]], names: dict[str, str]) -> list[str]:
    lines = [
        "| target | requests | failed | split | req/s | out tok/s | p50 ms | p90 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for target, rounds in runs.items():
        results = [r for rs, _ in rounds for r in rs]
        wall = sum(seconds for _, seconds in rounds)
        ok = [r for r in results if r[0] == 200]
        split = Counter(names.get(r[3], r[3]) for r in ok)
        tokens = sum(r[2] for r in ok)
        seconds = [r[1] for r in ok]
        lines.append(
            f"| {target} | {len(results)} | {len(results) - len(ok)} | "
            f"{' / '.join(f'{k} {v}' for k, v in sorted(split.items()))} | "
            f"{len(ok) / wall:.2f} | {tokens / wall:.1f} | {ms(seconds, 50)} | {ms(seconds, 90)} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replica", action="append", help="a running int4 server (twice)")
    parser.add_argument("--conversations", type=int, default=8, help="per mode and round")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=24, help="per target and round")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.replica is not None and len(args.replica) != 2:
        parser.error("give --replica twice (or not at all)")
    folder = Path(tempfile.mkdtemp(prefix="bench-pool-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        replicas = args.replica or start_replicas(folder, procs)
        replicas = [u.rstrip("/") for u in replicas]
        names = {endpoint_id(u): n for u, n in zip(replicas, "AB", strict=True)}
        pool = start_gateway(folder, "pool", {"endpoints": replicas}, procs)
        single = start_gateway(folder, "single", {"base_url": replicas[0]}, procs)
        with httpx.Client(timeout=30) as reader:
            config = {
                names[endpoint_id(u)]: f"enabled {m.prefix_caching_enabled}, block {m.block_size}"
                for u, m in scrape(reader, replicas, MODEL).items()
            }
        phases = {mode: Phase(mode) for mode in MODES}
        runs: dict[str, list[Run]] = {t: [] for t in TARGETS}
        texts = questions()
        for r in range(args.rounds):
            cache_round(pool, replicas, phases, args, r)
            targets = zip(TARGETS, (single, pool, pool), (False, False, True), strict=True)
            for target, url, keyed in targets:
                runs[target].append(load_round(url, keyed, args, texts))
                results, wall = runs[target][-1]
                say(f"round {r + 1} {target}: {len(results) / wall:.2f} req/s")
    finally:
        stop(procs)
    lines = [*cache_table(phases, names, replicas), "", *load_table(runs, names)]
    lines.append(f"\nprefix caching: {config}")
    machine = cpu()
    lines.append(
        f"\nCPU: {machine['model']}, {machine['cores']} cores, AVX-512 {machine['avx512']}"
    )
    print("\n".join(lines))
    if args.json is not None:
        figures = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "cpu": machine,
            "cache": {
                mode: {
                    "hit_rate": p.hit_rate,
                    "rounds": [c.__dict__ for c in p.cache],
                    "kept": p.kept(),
                    "conversations": len(p.conversations),
                    "turns": [t.__dict__ for t in p.turns],
                }
                for mode, p in phases.items()
            },
            "load": {
                t: [{"wall": w, "results": rs} for rs, w in rounds] for t, rounds in runs.items()
            },
            "replicas": replicas,
            "prefix_caching": config,
            "table": "\n".join(lines),
        }
        args.json.write_text(json.dumps(figures, indent=1))
    say(f"logs in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
