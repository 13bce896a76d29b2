"""KV-pool reset benchmark: reset duration per tier, and request latency during resets against
latency outside them, measured in one run under steady load through the gateway.

    ./mo setup && $(python3 -m model_optimizer.envs path gateway)/bin/python \\
        benchmarks/bench_resets.py [--concurrency 2] [--settle 20] [--gateway URL --admin-key K]

Without ``--gateway`` it starts its own stack (``model-optimizer up`` on free loopback ports,
the default model, the three tiers) and stops it at the end. Load: --concurrency clients send
short chat requests (half chit-chat, half code, max_tokens 8) through the gateway for the whole
run; after --settle seconds of load alone, each tier is reset in turn through
``POST /admin/resets/{tier}`` with --settle seconds of load alone between resets. Each request
is then counted as "during" when it overlapped a reset (the tier was drained, reset and warmed
up) and "outside" otherwise. Markdown on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.process import free_port  # noqa: E402
from measure.serving_stats import percentile  # noqa: E402
from model_optimizer.soak import ResetNotDone, reset_now  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
PROMPTS = ["Hi! How are you today?", "Write a Python function that adds two numbers."]
KEY = "bench-resets-admin-key"


@dataclass(frozen=True)
class Sample:
    start: float  # epoch seconds
    end: float
    status: int


def say(text: str) -> None:
    print(f"bench_resets: {text}", file=sys.stderr, flush=True)


def start_stack() -> tuple[subprocess.Popen[bytes], str]:
    port, tier_port = free_port(), free_port()
    args = ["up", "--port", str(port), "--tier-port", str(tier_port)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MO_GATEWAY_ADMIN_KEYS": KEY}
    process = subprocess.Popen(
        [sys.executable, "-m", "model_optimizer.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"model-optimizer up exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    os.killpg(process.pid, signal.SIGINT)
    raise SystemExit("the stack did not become ready in 30 minutes")


def load(url: str, worker: int, stop: threading.Event, out: list[Sample]) -> None:
    with httpx.Client(timeout=120) as client:
        for i in range(100_000):
            if stop.is_set():
                return
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": PROMPTS[(worker + i) % 2]}],
                "max_tokens": 8,
            }
            start = time.time()
            try:
                status = client.post(f"{url}/v1/chat/completions", json=body).status_code
            except httpx.HTTPError:
                status = -1
            out.append(Sample(start, time.time(), status))


def report(samples: list[Sample], records: list[dict[str, object]]) -> str:
    spans = [
        (float(str(r["started_at"])), float(str(r["started_at"])) + float(str(r["seconds"])))
        for r in records
    ]

    def during(sample: Sample) -> bool:
        return any(sample.start < end and sample.end > start for start, end in spans)

    inside = [(s.end - s.start) * 1000 for s in samples if during(s) and s.status == 200]
    outside = [(s.end - s.start) * 1000 for s in samples if not during(s) and s.status == 200]
    failed = sum(1 for s in samples if s.status != 200)
    lines = [
        "| tier | reset s | outcome | detail |",
        "|---|---|---|---|",
        *(
            f"| {r['tier']} | {float(str(r['seconds'])):.1f} | {r['outcome']} | {r['detail']} |"
            for r in records
        ),
        "",
        "| requests | count | p50 ms | p90 ms | p99 ms | mean ms |",
        "|---|---|---|---|---|---|",
    ]
    for name, values in (("outside resets", outside), ("during a reset", inside)):
        mean = statistics.fmean(values) if values else float("nan")
        p50, p90, p99 = (percentile(values, p, empty=math.nan) for p in (50, 90, 99))
        lines.append(f"| {name} | {len(values)} | {p50:.0f} | {p90:.0f} | {p99:.0f} | {mean:.0f} |")
    lines.append(f"\nfailed requests: {failed} of {len(samples)}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", default=None, help="a running gateway (else start a stack)")
    parser.add_argument("--admin-key", default=KEY)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--settle", type=float, default=20.0, help="seconds of load alone")
    parser.add_argument("--tiers", default="fp16,int8,int4")
    args = parser.parse_args()
    process = None
    if args.gateway is None:
        say("starting model-optimizer up (the first run builds the variants) ...")
        process, url = start_stack()
    else:
        url = args.gateway.rstrip("/")
    samples: list[Sample] = []
    stop = threading.Event()
    workers = [
        threading.Thread(target=load, args=(url, w, stop, samples), daemon=True)
        for w in range(args.concurrency)
    ]
    records = []
    try:
        for worker in workers:
            worker.start()
        for tier in args.tiers.split(","):
            time.sleep(args.settle)
            say(f"resetting {tier} under load ...")
            try:
                records.append(reset_now(url, tier, args.admin_key))
            except ResetNotDone as exc:
                raise SystemExit(f"bench_resets: {exc}") from None
            say(f"{tier}: {records[-1]['outcome']} in {float(str(records[-1]['seconds'])):.1f} s")
        time.sleep(args.settle)
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=150)
        if process is not None:
            os.killpg(process.pid, signal.SIGINT)
            process.wait(timeout=120)
    print(report(samples, records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
