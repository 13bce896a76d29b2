"""Routes on live figures against a tier made slower on purpose: does the route move away from it
within 2 minutes of live traffic, and come back once it recovers? (issue 32's target)

    ./mo setup && $(python3 -m model_optimizer.envs path gateway)/bin/python \\
        benchmarks/bench_live_routes.py [--slow 2] [--concurrency 1] [--settle 60]

It starts ``model-optimizer up`` (loopback, the default model, the spec's tiers) with the
shipped policy and ``live_routes`` turned on, then sends chit-chat (the tolerant class) through
the gateway for the whole run, streamed, ``--max-tokens`` each, ``--concurrency`` at once. The
tier first in the tolerant route is the one slowed: after ``--settle`` seconds its server is
stopped and continued (SIGSTOP/SIGCONT, a 100 ms period, stopped ``1 - 1/slow`` of it) until the
route moves away from it or ``--limit`` seconds pass; then it runs freely again until the route
comes back or ``--limit`` passes. Printed: the CPU, the tiers' calibration, the slow-down the
throttle really gave (the per-token time of the slowed tier's answers before and during, as the
client saw them), and the seconds each move took, with the route changes' reasons. Progress on
stderr, markdown on stdout.

With ``--steady SECONDS`` nothing is slowed: chit-chat and code requests alternate (two
classes, two first tiers, sharing the machine's cores) for that long, and it counts the route
changes the live figures made: on a machine whose tiers run as calibrated there should be
none. Both modes end with the gateway's own ``live routes:`` log lines.

The prompts below are load, not evaluation data: nothing is scored on them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from up_stack import ROOT, Stack, cpu_model, server_pid, up_stack

MODEL = "SmolLM2-135M-Instruct"
PROMPTS = [
    "Tell me something cheerful about autumn.",
    "Say hello to my friend Sam in a friendly way.",
    "What is a nice name for a grey cat?",
    "Write two lines about the sea at night.",
    "Give me a fun fact about otters.",
    "How do I greet someone politely in French?",
]
CODE = [
    "Write a Python function that reverses a list without using reversed().",
    "Fix this JavaScript: for (i = 0; i < n; i++) { total += a[i] }",
    "Write a SQL query that counts orders per customer.",
]


@dataclass(frozen=True)
class Answer:
    start: float  # monotonic
    end: float
    tier: str
    tpot: float | None  # seconds per output token after the first, as the client saw it


def say(text: str) -> None:
    print(f"bench_live_routes: {text}", file=sys.stderr, flush=True)


def live_policy(folder: Path) -> Path:
    policy = yaml.safe_load((ROOT / "policies" / "routing.yaml").read_text())
    policy["live_routes"] = {**policy.get("live_routes", {}), "enabled": True}
    path = folder / "routing-live.yaml"
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    return path


def one(client: httpx.Client, url: str, prompt: str, max_tokens: int) -> Answer | None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.monotonic()
    first, tokens = None, 0
    try:
        with client.stream("POST", f"{url}/v1/chat/completions", json=body) as answer:
            if answer.status_code != 200:
                return None
            tier = answer.headers.get("x-route-tier", "?")
            for line in answer.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and first is None:
                    first = time.monotonic()
                if chunk.get("usage"):
                    tokens = int(chunk["usage"].get("completion_tokens") or 0)
    except httpx.HTTPError:
        return None
    end = time.monotonic()
    tpot = (end - first) / (tokens - 1) if first is not None and tokens > 1 else None
    return Answer(start, end, tier, tpot)


def traffic(url: str, worker: int, args: argparse.Namespace, stop: threading.Event,
            out: list[Answer]) -> None:  # fmt: skip
    mixed = [p for pair in zip(PROMPTS, CODE * 2, strict=True) for p in pair]
    prompts = mixed if args.steady else PROMPTS
    with httpx.Client(timeout=300) as client:
        for i in range(1_000_000):
            if stop.is_set():
                return
            found = one(client, url, prompts[(worker + i) % len(prompts)], args.max_tokens)
            if found is not None:
                out.append(found)


def throttle(pid: int, slow: float, stop: threading.Event) -> None:
    """Stop and continue ``pid`` so it runs ``1/slow`` of every 100 ms (continued at the end)."""
    run = 0.1 / slow
    try:
        while not stop.is_set():
            os.kill(pid, signal.SIGCONT)
            time.sleep(run)
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.1 - run)
    finally:
        os.kill(pid, signal.SIGCONT)


def wait_for(stack: Stack, cls: str, want_first: bool, tier: str, limit: float) -> float | None:
    """Seconds until ``tier`` is (want_first) or is not first in ``cls``'s route."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        first = stack.chains()[cls][0]
        if (first == tier) == want_first:
            return time.monotonic() - start
        time.sleep(2)
    return None


def tpot_ms(answers: list[Answer], tier: str, since: float, until: float) -> str:
    values = [a.tpot for a in answers if a.tier == tier and since <= a.start < until and a.tpot]
    if not values:
        return "none"
    return f"{statistics.median(values) * 1000:.1f} ms (n={len(values)})"


def last_change(stack: Stack, cls: str) -> list[str]:
    changed = stack.admin("/admin/routes")["classes"][cls].get("last_change")
    return [json.dumps(changed)] if changed else []


def seconds(value: float | None) -> str:
    return f"{value:.0f} s" if value is not None else "no"


def report(
    args: argparse.Namespace,
    calibration: dict[str, Any],
    chain: list[str],
    after_move: list[str],
    answers: list[Answer],
    marks: tuple[float, float, float, float],
    moves: tuple[float | None, float | None],
) -> None:
    t0, t1, t2, t3 = marks
    slowed = chain[0]
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; class {args.cls}, concurrency "
          f"{args.concurrency}, max_tokens {args.max_tokens}, slowed {args.slow}x\n")  # fmt: skip
    print("| tier | calibration TPOT ms | TTFT ms |\n|---|---|---|")
    for name, figures in sorted(calibration.items()):
        cal = figures.get("calibration") or {}
        print(f"| {name} | {cal.get('tpot_ms', '-')} | {cal.get('ttft_ms', '-')} |")
    print(f"\nroute before: {' -> '.join(chain)}; after the throttle: {' -> '.join(after_move)}")
    print(f"{slowed}'s answers, per-token time as the client saw it: "
          f"before {tpot_ms(answers, slowed, t0, t1)}, throttled {tpot_ms(answers, slowed, t1, t2)}"
          f", after {tpot_ms(answers, slowed, t2, t3)}")  # fmt: skip
    print(f"moved away from {slowed} after {seconds(moves[0])} of throttled traffic, back "
          f"{seconds(moves[1])} after it ran freely (limit {args.limit:.0f} s each)")  # fmt: skip


def gateway_lines(log: Path) -> list[str]:
    """The gateway's ``live routes:`` log lines (what it saw and did, in its words)."""
    lines = log.read_text(errors="replace").splitlines()
    return [line.split("live routes: ", 1)[1] for line in lines if "live routes: " in line]


def throttled(args: argparse.Namespace, stack: Stack) -> int:
    calibration = stack.admin("/admin/routes")["tiers"]
    chain = stack.chains()[args.cls]
    slowed = chain[0]
    say(f"{args.cls} route: {' -> '.join(chain)}; slowing {slowed}")
    port = urlsplit(stack.admin("/admin/tiers")["tiers"][slowed]["base_url"]).port
    pid = server_pid(int(port or 0))
    answers: list[Answer] = []
    stop, stop_throttle = threading.Event(), threading.Event()
    workers = [
        threading.Thread(target=traffic, args=(stack.url, w, args, stop, answers))
        for w in range(args.concurrency)
    ]
    for worker in workers:
        worker.start()
    throttler = threading.Thread(target=throttle, args=(pid, args.slow, stop_throttle))
    try:
        t0 = time.monotonic()
        time.sleep(args.settle)
        t1 = time.monotonic()
        say(f"throttling {slowed} (pid {pid}) {args.slow}x ...")
        throttler.start()
        moved = wait_for(stack, args.cls, False, slowed, args.limit)
        t2 = time.monotonic()
        after_move = stack.chains()[args.cls]
        reason_away = last_change(stack, args.cls)
        stop_throttle.set()
        throttler.join()
        say(f"moved away after {moved} s; {slowed} runs freely again ...")
        back = wait_for(stack, args.cls, True, slowed, args.limit) if moved else None
        t3 = time.monotonic()
        say(f"back after {back} s")
        reason_back = last_change(stack, args.cls)
    finally:
        stop_throttle.set()
        stop.set()
        for worker in workers:
            worker.join(timeout=330)
    report(args, calibration, chain, after_move, answers, (t0, t1, t2, t3), (moved, back))
    for line in reason_away + reason_back:
        print(f"- change: {line}")
    served = {t: sum(1 for a in answers if a.tier == t) for t in {a.tier for a in answers}}
    print(f"\nanswers served: {served}")
    return 0 if moved is not None and back is not None else 1


def steady(args: argparse.Namespace, stack: Stack) -> int:
    before = stack.chains()
    answers: list[Answer] = []
    stop = threading.Event()
    workers = [
        threading.Thread(target=traffic, args=(stack.url, w, args, stop, answers))
        for w in range(args.concurrency)
    ]
    for worker in workers:
        worker.start()
    say(f"steady mixed traffic for {args.steady:.0f} s, nothing slowed ...")
    try:
        time.sleep(args.steady)
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=330)
    history = stack.admin("/admin/routes")["history"]
    live = [c for c in history if str(c.get("reason", "")).startswith("live figures")]
    served = {t: sum(1 for a in answers if a.tier == t) for t in {a.tier for a in answers}}
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; chit-chat and code alternating, "
          f"concurrency {args.concurrency}, max_tokens {args.max_tokens}, "
          f"{args.steady:.0f} s\n")  # fmt: skip
    print(f"answers served: {served}")
    print(f"routes before: {before}\nroutes after:  {stack.chains()}")
    print(f"route changes made by the live figures: {len(live)}")
    for change in live:
        print(f"- {json.dumps(change)}")
    return 0 if not live else 1


def run(args: argparse.Namespace, folder: Path) -> int:
    say("starting model-optimizer up with live routes on (the first run builds the variants) ...")
    with up_stack(folder / "up.log", ["--policy", str(live_policy(folder))]) as stack:
        code = steady(args, stack) if args.steady else throttled(args, stack)
    print("\nthe gateway's live routes log:")
    for line in gateway_lines(stack.log):
        print(f"    {line}")
    return code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", type=float, default=2.0, help="how much slower (> 1)")
    parser.add_argument("--cls", default="tolerant", help="the class whose route is watched")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--settle", type=float, default=60.0, help="seconds before the throttle")
    parser.add_argument("--limit", type=float, default=600.0, help="seconds a move may take")
    parser.add_argument("--steady", type=float, default=0.0, help="seconds of mixed load alone")
    args = parser.parse_args()
    if args.slow <= 1:
        parser.error("--slow must be above 1")
    with tempfile.TemporaryDirectory(prefix="bench-live-routes-") as folder:
        return run(args, Path(folder))


if __name__ == "__main__":
    sys.exit(main())
