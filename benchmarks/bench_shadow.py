"""Shadow-sampling run: output deviation of int4 and int8 against fp16, and the per-tier signals,
measured through a gateway of its own over running tiers.

    ./mo setup && $(python3 -m model_optimizer.envs path gateway)/bin/python \\
        benchmarks/bench_shadow.py --tier fp16=http://127.0.0.1:18100 \\
        --tier int8=http://127.0.0.1:18101 --tier int4=http://127.0.0.1:18102 [--requests 30]

It starts ``python -m gateway`` on a free loopback port with a copy of policies/routing.yaml
where ``shadow.fraction`` is 1.0 and pinning is allowed, sends --requests greedy chat requests
one at a time (the first questions of measure/data/vicuna_bench_questions.jsonl, alternately
pinned to int4 and int8, --max-tokens each; each after the previous comparison ended, unless
--overlap), waits for every comparison to end, and prints a
Markdown table from the gateway's /metrics (sampled every 0.5 s meanwhile, so the largest KV
tokens per running request seen is reported too). Progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.process import free_port  # noqa: E402
from measure.eval_data import VICUNA  # noqa: E402
from model_optimizer.envs import cache_root  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
QUESTIONS = VICUNA  # the copy the repo ships (measure/data, with its license)
SHADOWED = ("int4", "int8")
Seen = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def values(url: str) -> Seen:
    """The gateway's /metrics samples by (name, sorted labels)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def pick(seen: Seen, name: str, **labels: str) -> float:
    want = tuple(sorted(labels.items()))
    return sum(v for (n, ls), v in seen.items() if n == name and all(p in ls for p in want))


def shadows_running(url: str) -> bool:
    return values(url).get(("gateway_shadow_in_flight", ()), 0.0) > 0


def signal_row(seen: Seen, tier: str, peak_kv: float | None) -> str:
    """One Markdown row of a tier's signals at the end of the run."""

    def one(name: str) -> float | None:
        return seen.get((name, (("tier", tier),)))

    def mib(name: str) -> str:
        value = one(name)
        return f"{value / 2**20:.0f}" if value else "-"

    usage, capacity = one("gateway_tier_kv_usage_ratio"), one("gateway_tier_kv_capacity_tokens")
    return (
        f"| {tier} | {usage} | {capacity} | {peak_kv if peak_kv is not None else '-'} "
        f"| {one('gateway_tier_preemptions_total')} "
        f"| {mib('gateway_tier_memory_bytes')} | {mib('gateway_tier_peak_memory_bytes')} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", action="append", required=True, help="NAME=URL, e.g. fp16=...")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--questions", type=Path, default=QUESTIONS)
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="shadow.timeout_seconds (s) for the run"
    )
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="send the next request at once instead of after the last comparison ended "
        "(comparisons then compete with the traffic and some are dropped)",
    )
    args = parser.parse_args()
    tiers = [dict(zip(("name", "base_url"), t.split("=", 1), strict=True)) for t in args.tier]
    questions = [json.loads(line)["turns"][0] for line in args.questions.read_text().splitlines()]
    folder = Path(tempfile.mkdtemp(prefix="bench-shadow-"))
    policy = yaml.safe_load((ROOT / "policies" / "routing.yaml").read_text())
    policy["pinning"]["allow"] = True
    policy["shadow"].update(fraction=1.0, max_tokens=args.max_tokens, timeout_seconds=args.timeout)
    (folder / "routing.yaml").write_text(yaml.safe_dump(policy))
    config = {
        "model_name": MODEL,
        "tiers": tiers,
        "policy_path": str(folder / "routing.yaml"),
        "tokenizer_dir": str(cache_root() / "variants" / MODEL / "fp16"),
        "metrics_interval": 0.5,
    }
    (folder / "gateway.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (folder / "gateway.log").open("wb")
    command = [sys.executable, "-m", "gateway", "--config", str(folder / "gateway.yaml")]
    gateway = subprocess.Popen(
        [*command, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
    )
    peak_kv: dict[str, float] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            try:
                seen = values(url)
            except httpx.HTTPError:
                continue
            for (name, labels), value in seen.items():
                if name == "gateway_tier_kv_tokens_per_request":
                    tier = dict(labels)["tier"]
                    peak_kv[tier] = max(peak_kv.get(tier, 0.0), value)

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or gateway.poll() is not None:
                print(f"gateway did not start; see {folder / 'gateway.log'}", file=sys.stderr)
                return 1
            time.sleep(0.3)
        threading.Thread(target=sample, daemon=True).start()
        with httpx.Client(timeout=300) as client:
            for i in range(args.requests):
                tier = SHADOWED[i % 2]
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": questions[i % len(questions)]}],
                    "max_tokens": args.max_tokens,
                    "temperature": 0,
                }
                answer = client.post(
                    f"{url}/v1/chat/completions", json=body, headers={"x-route-tier": tier}
                )
                print(f"{i + 1}/{args.requests} {tier}: {answer.status_code}", file=sys.stderr)
                while not args.overlap and shadows_running(url):
                    time.sleep(0.5)
        while shadows_running(url):
            time.sleep(0.5)
        time.sleep(1.5)  # one more scrape of the tiers
        seen = values(url)
    finally:
        stop.set()
        gateway.terminate()
        gateway.wait(timeout=30)
    print("| tier | comparisons | deviations | deviation rate | mean agreement | dropped |")
    print("|---|---|---|---|---|---|")
    for tier in SHADOWED:
        compared = pick(seen, "gateway_shadow_comparisons_total", tier=tier)
        deviated = pick(seen, "gateway_shadow_deviations_total", tier=tier)
        total = pick(seen, "gateway_shadow_agreement_sum", tier=tier)
        dropped = {
            dict(ls)["reason"]: v
            for (n, ls), v in seen.items()
            if n == "gateway_shadow_dropped_total" and dict(ls)["tier"] == tier
        }
        rate = f"{deviated / compared:.2f}" if compared else "-"
        mean = f"{total / compared:.3f}" if compared else "-"
        print(f"| {tier} | {compared:.0f} | {deviated:.0f} | {rate} | {mean} | {dropped or 0} |")
    print()
    print(
        "| tier | KV usage | KV capacity (tokens) | max KV tokens / running request seen "
        "| preemptions | memory (MiB) | peak memory (MiB) |"
    )
    print("|---|---|---|---|---|---|---|")
    for tier in (t["name"] for t in tiers):
        print(signal_row(seen, tier, peak_kv.get(tier)))
    print(f"\ngateway log: {folder / 'gateway.log'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
