"""Derived routes vs all-reference vs the old static chains, side by side in one run.

Against a running ``model-optimizer up`` (its gateway serves the shipped policy with routes
derived from this machine's measurements), this script starts two more gateways over the same
tiers (``python -m gateway``, loopback): one whose routes are the shipped lists as written (the
old static chains) and one that sends every class to the reference tier. It then replays the
labeled routing set (``measure/data/routing_prompts.jsonl``: test data, never used to write
rules or derive routes) through the three, interleaved (prompt i goes to all three before
prompt i+1, the order rotating), greedy, ``--max-tokens`` each, ``--concurrency`` at once.

Per policy it prints: requests/s and output tokens/s over its own busy time, p50/p99 latency,
and per class the token agreement of its answers with the reference tier's (the all-reference
gateway's answer is the reference), plus the share of each tier.

    ./mo up --port 18000 --tier-port 18100  # with MO_GATEWAY_ADMIN_KEYS=bench-admin and
    #                                         MO_TIER_API_KEY set (llama.cpp tiers: --tokenizer-dir)
    python benchmarks/bench_routes.py --gateway http://127.0.0.1:18000 --admin-key bench-admin
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backends.process import free_port  # noqa: E402
from gateway.config import TIER_KEY_ENV  # noqa: E402
from measure import vllm_client as api  # noqa: E402
from measure.eval_data import load_labeled  # noqa: E402
from measure.quality import sequence_agreement  # noqa: E402
from measure.serving_stats import percentile  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from up_stack import wait_ready  # noqa: E402

PROMPTS = ROOT / "measure" / "data" / "routing_prompts.jsonl"
POLICY = ROOT / "policies" / "routing.yaml"


def _admin(url: str, path: str, key: str) -> dict[str, Any]:
    answer = httpx.get(f"{url}{path}", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    answer.raise_for_status()
    return dict(answer.json())


def variant_policies(reference: str) -> dict[str, str]:
    """The shipped policy's routes as written (no ``derive``), and all to the reference."""
    shipped = yaml.safe_load(POLICY.read_text())
    static = json.loads(json.dumps(shipped))
    for route in static["routes"].values():
        if isinstance(route, dict):
            route.pop("derive", None)
    everything = json.loads(json.dumps(shipped))
    everything["routes"] = {cls: [reference] for cls in shipped["routes"]}
    return {"static": yaml.safe_dump(static), "all-reference": yaml.safe_dump(everything)}


def _tokenizer_dir(tiers: dict[str, Any]) -> str | None:
    """The model folder a tier names in ``/v1/models`` (vLLM's ``root``; llama-server names
    none), asked with the tiers' key (``MO_TIER_API_KEY``, which the extra gateways inherit)."""
    key = os.environ.get(TIER_KEY_ENV, "").strip()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    for tier in tiers.values():
        answer = httpx.get(f"{tier['base_url']}/v1/models", headers=headers, timeout=10)
        data = answer.json().get("data") if answer.status_code == 200 else None
        root = data[0].get("root") if data else None
        if isinstance(root, str) and Path(root).is_dir():
            return root
    return None


@contextmanager
def gateways(
    tiers: dict[str, Any], model: str, tokenizer: str, folder: Path
) -> Iterator[dict[str, str]]:
    """A ``python -m gateway`` per variant policy, ready, stopped on exit."""
    reference = "fp16" if "fp16" in tiers else next(iter(tiers))
    running: list[subprocess.Popen[bytes]] = []
    urls: dict[str, str] = {}
    try:
        for name, text in variant_policies(reference).items():
            policy = folder / f"{name}.yaml"
            policy.write_text(text)
            config = {
                "model_name": model,
                "tiers": [
                    {"name": n, "base_url": t["base_url"], "max_model_len": t["max_model_len"]}
                    | ({"classes": t["classes"]} if t.get("classes") is not None else {})
                    for n, t in tiers.items()
                ],
                "policy_path": str(policy),
                "tokenizer_dir": tokenizer,
            }
            path = folder / f"{name}-gateway.yaml"
            path.write_text(yaml.safe_dump(config))
            port = free_port()
            log = (folder / f"{name}.log").open("wb")
            running.append(
                subprocess.Popen(
                    [sys.executable, "-m", "gateway", "--config", str(path), "--port", str(port)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=ROOT,
                    env={**os.environ, "PYTHONPATH": str(ROOT)},
                )
            )
            urls[name] = f"http://127.0.0.1:{port}"
        for url in urls.values():
            wait_ready(url, 60, what=f"bench_routes: gateway {url}")
        yield urls
    finally:
        for process in running:
            process.terminate()
        for process in running:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


async def replay(
    targets: dict[str, str],
    prompts: list[Any],
    model: str,
    max_tokens: int,
    concurrency: int,
    tokenizer: Tokenizer,
) -> dict[str, list[dict[str, Any]]]:
    """Every prompt through every target, interleaved; per target its answers in file order.
    An answer's tokens are the ids vLLM returns, or its text tokenized (llama-server returns
    no ids)."""
    out: dict[str, list[dict[str, Any]]] = {name: [{}] * len(prompts) for name in targets}
    busy: dict[str, float] = defaultdict(float)
    gate = asyncio.Semaphore(concurrency)
    names = list(targets)
    done, total = 0, len(prompts) * len(targets)
    async with httpx.AsyncClient(timeout=600) as client:

        async def one(name: str, i: int) -> None:
            nonlocal done
            async with gate:
                start = time.perf_counter()
                answer = await api.chat(
                    client, targets[name], model, prompts[i].prompt, max_tokens, 0
                )
                seconds = time.perf_counter() - start
            busy[name] += seconds
            done += 1
            print(f"\rbench_routes: {done}/{total} answers", end="", file=sys.stderr)
            out[name][i] = {
                "seconds": seconds,
                "tier": answer.headers.get("x-route-tier", ""),
                "ids": answer.token_ids
                or tuple(tokenizer.encode(answer.text, add_special_tokens=False).ids),
                "tokens": answer.completion_tokens,
            }

        jobs = []
        for i in range(len(prompts)):
            order = names[i % len(names) :] + names[: i % len(names)]
            jobs += [one(name, i) for name in order]
        await asyncio.gather(*jobs)
    print(file=sys.stderr)
    for name in targets:
        for row in out[name]:
            row["busy_total"] = busy[name]
    return out


def summarize(
    answers: dict[str, list[dict[str, Any]]], prompts: list[Any], reference: str
) -> dict[str, dict[str, Any]]:
    ref = answers[reference]
    table: dict[str, dict[str, Any]] = {}
    for name, rows in answers.items():
        busy = rows[0]["busy_total"] if rows else 0.0
        latencies = [r["seconds"] for r in rows]
        tokens = sum(r["tokens"] for r in rows)
        agreement: dict[str, list[float]] = defaultdict(list)
        tiers: dict[str, int] = defaultdict(int)
        for p, r, base in zip(prompts, rows, ref, strict=True):
            agreement[p.label].append(sequence_agreement(r["ids"], base["ids"]))
            tiers[r["tier"]] += 1
        table[name] = {
            "requests": len(rows),
            "req_per_busy_s": len(rows) / busy if busy else 0.0,
            "out_tok_per_busy_s": tokens / busy if busy else 0.0,
            "p50_s": percentile(latencies, 50),
            "p99_s": percentile(latencies, 99),
            "agreement": {c: sum(v) / len(v) for c, v in sorted(agreement.items())},
            "tiers": {t: n / len(rows) for t, n in sorted(tiers.items())},
        }
    return table


def markdown(table: dict[str, dict[str, Any]]) -> str:
    classes = sorted({c for row in table.values() for c in row["agreement"]})
    head = "| routes | req/s | out tok/s | p50 s | p99 s | " + " | ".join(
        f"agreement {c}" for c in classes
    )
    lines = [head + " | tiers |", "|" + "---|" * (6 + len(classes))]
    for name, row in table.items():
        agree = " | ".join(f"{row['agreement'].get(c, 0):.3f}" for c in classes)
        tiers = ", ".join(f"{t} {s:.0%}" for t, s in row["tiers"].items())
        lines.append(
            f"| {name} | {row['req_per_busy_s']:.2f} | {row['out_tok_per_busy_s']:.1f} | "
            f"{row['p50_s']:.2f} | {row['p99_s']:.2f} | {agree} | {tiers} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway", default="http://127.0.0.1:8000", help="up's gateway")
    parser.add_argument("--admin-key", default=os.environ.get("MO_GATEWAY_ADMIN_KEYS", ""))
    parser.add_argument("--prompts", default=str(PROMPTS))
    parser.add_argument("--limit", type=int, default=None, help="the first N prompts")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--output", default=None, help="write the JSON here")
    parser.add_argument(
        "--tokenizer-dir",
        default=None,
        help="a variant folder with the tokenizer (default: what a vLLM tier's /v1/models names)",
    )
    args = parser.parse_args(argv)
    if not args.admin_key:
        print("bench_routes: --admin-key (or MO_GATEWAY_ADMIN_KEYS) is needed", file=sys.stderr)
        return 2
    key = args.admin_key.split(",")[0]
    tiers = _admin(args.gateway, "/admin/tiers", key)["tiers"]
    derived = _admin(args.gateway, "/admin/policy", key)
    prompts = load_labeled(Path(args.prompts))[: args.limit]
    model = httpx.get(f"{args.gateway}/v1/models", timeout=10).json()["data"][0]["id"]
    tokenizer_dir = args.tokenizer_dir or _tokenizer_dir(tiers)
    if tokenizer_dir is None:
        print("bench_routes: the tiers do not name their model folder: give --tokenizer-dir",
              file=sys.stderr)  # fmt: skip
        return 2
    with (
        tempfile.TemporaryDirectory() as tmp,
        gateways(tiers, model, tokenizer_dir, Path(tmp)) as urls,
    ):
        targets = {"derived": args.gateway, **urls}
        tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
        started = time.perf_counter()
        answers = asyncio.run(
            replay(targets, prompts, model, args.max_tokens, args.concurrency, tokenizer)
        )
        wall = time.perf_counter() - started
    table = summarize(answers, prompts, "all-reference")
    print(f"bench_routes: {len(prompts)} prompts x {len(targets)} policies in {wall:.0f}s")
    for entry in derived.get("derived_routes", {}).values():
        print(f"  derived {entry['line']}")
    print(markdown(table))
    if args.output:
        Path(args.output).write_text(json.dumps({"table": table, "derived": derived}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
