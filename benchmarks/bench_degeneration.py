"""How often the escalation detectors flag each tier's own streamed answers.

    ./mo up &        # the default stack (tiers on 127.0.0.1:8001.., or see /admin/tiers)
    $(python3 -m model_optimizer.envs path gateway)/bin/python benchmarks/bench_degeneration.py \\
        --tier fp16=http://127.0.0.1:8001 --tier int8=http://127.0.0.1:8002 \\
        --tier int4=http://127.0.0.1:8003 [--reference fp16] [--prompts 80] [--max-tokens 160] \\
        [--logprobs] [--json benchmarks/results/degeneration.json]

Every prompt (the first ``--prompts`` of measure/data/routing_prompts.jsonl and
measure/data/gsm8k_eval.jsonl, alternately: test data, never used to choose the detectors'
settings, which are the shipped policy's defaults, set before this was run) is streamed from
every tier directly, tiers interleaved per prompt, at the model's default sampling (no
temperature sent), as a client would ask. Each answer's events go through the gateway's own
``StreamWatch`` with the policy's detectors (gateway/request/stream/stream_watch.py), as a watched
stream would. The reference tier's flags are false positives (its answers are what the others
are measured against); a lower tier's flags are the answers escalation would have continued
elsewhere. Prints a table; ``--json`` keeps each flagged answer's text and verdict.

``--logprobs`` also asks each answer's token logprobs (sampling is unchanged) and reports,
per tier, the lowest mean logprob over any ``--window`` consecutive tokens of an answer: the
token-level signal escalation could use. A signal worth using would put a threshold under
which the reference's answers (almost) never fall and the flagged ones do.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.policy.escalation import EscalationPolicy  # noqa: E402
from gateway.policy.schema import load_policy  # noqa: E402
from gateway.request.events.chunk import read_chunk  # noqa: E402
from gateway.request.events.sse import EventBuffer, payloads  # noqa: E402
from gateway.request.stream.stream_watch import watch_for  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"


def prompts(count: int) -> list[str]:
    data = ROOT / "measure" / "data"
    chat = [json.loads(line)["prompt"] for line in (data / "routing_prompts.jsonl").open()]
    math = [json.loads(line)["question"] for line in (data / "gsm8k_eval.jsonl").open()]
    mixed = [p for pair in zip(chat, math, strict=False) for p in pair]
    return mixed[:count]


def lowest_window_mean(logprobs: list[float], window: int) -> float | None:
    """The lowest mean of ``window`` consecutive token logprobs (all of them when fewer)."""
    if not logprobs:
        return None
    size = min(window, len(logprobs))
    total = sum(logprobs[:size])
    lowest = total
    for i in range(size, len(logprobs)):
        total += logprobs[i] - logprobs[i - size]
        lowest = min(lowest, total)
    return lowest / size


def token_logprobs(events: bytes) -> list[float]:
    """The sampled tokens' logprobs in a chat stream's complete events."""
    found: list[float] = []
    for data in payloads(events):
        for choice in read_chunk(data, chat=True).choices:
            found += choice.logprobs
    return found


def watch_answer(
    url: str,
    prompt: str,
    max_tokens: int,
    escalation: EscalationPolicy,
    logprobs: bool = False,
    window: int = 16,
) -> dict[str, object]:
    watch = watch_for(escalation, 0, chat=True)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    if logprobs:
        body["logprobs"] = True
    seen: list[float] = []
    buffer = EventBuffer()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as answer:
        answer.raise_for_status()
        for chunk in answer.iter_raw():
            events = buffer.feed(chunk)
            if not events:
                continue
            watch.feed(events)
            seen += token_logprobs(events) if logprobs else []
            if watch.verdict is not None:
                break
    verdict = watch.verdict
    return {
        "flagged": verdict is not None,
        "kind": verdict.kind if verdict else None,
        "detail": verdict.detail if verdict else None,
        "text": watch.text if verdict is None else None,
        "kept": watch.text if verdict else None,
        "lowest_window_logprob": lowest_window_mean(seen, window),
    }


def flagged_of(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    return [row for row in rows if row["flagged"]]


def print_logprob_signal(results: dict[str, list[dict[str, object]]], window: int) -> None:
    """Per tier: the lowest {window}-token mean logprob of its answers, and the share of its
    answers under each threshold."""
    thresholds = (-1.5, -2.0, -2.5, -3.0, -4.0)
    print(f"\nlowest mean logprob over {window} tokens of an answer")
    head = " | ".join(f"< {t:g}" for t in thresholds)
    print(f"| tier | median | 5th pct | {head} | flagged answers' values |")
    print("|---|---|---|" + "---|" * len(thresholds) + "---|")
    for name, rows in results.items():
        values = sorted(
            float(v) for r in rows if isinstance(v := r["lowest_window_logprob"], float)
        )
        if not values:
            continue
        shares = [sum(1 for v in values if v < t) / len(values) for t in thresholds]
        fifth = values[max(int(0.05 * len(values)) - 1, 0)]
        flagged = ", ".join(
            f"{float(v):.2f}"
            for r in flagged_of(rows)
            if isinstance(v := r["lowest_window_logprob"], float)
        )
        cells = [name, f"{statistics.median(values):.2f}", f"{fifth:.2f}"]
        cells += [f"{share:.0%}" for share in shares] + [flagged or "-"]
        print("| " + " | ".join(cells) + " |")


def say(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tier", action="append", required=True, help="name=url, repeatable")
    parser.add_argument("--reference", default="fp16")
    parser.add_argument("--prompts", type=int, default=80)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--policy", type=Path, default=ROOT / "policies" / "routing.yaml")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--logprobs", action="store_true", help="the token-level signal too")
    parser.add_argument("--window", type=int, default=16, help="tokens a logprob mean spans")
    args = parser.parse_args()
    tiers = dict(item.split("=", 1) for item in args.tier)
    asked = prompts(args.prompts)
    escalation = load_policy(args.policy).escalation
    results: dict[str, list[dict[str, object]]] = {name: [] for name in tiers}
    started = time.monotonic()
    for i, prompt in enumerate(asked, 1):
        for name, url in tiers.items():
            outcome = watch_answer(
                url, prompt, args.max_tokens, escalation, args.logprobs, args.window
            )
            results[name].append({"prompt": prompt, **outcome})
        if i % 10 == 0 or i == len(asked):
            seconds = time.monotonic() - started
            counts = ", ".join(f"{n} {len(flagged_of(rs))}" for n, rs in results.items())
            say(f"{i}/{len(asked)} prompts, {seconds:.0f} s; flagged: {counts}")
    print("| tier | answers | flagged | loop | scripts | share |")
    print("|---|---|---|---|---|---|")
    for name, rows in results.items():
        flagged = flagged_of(rows)
        loops = sum(1 for r in flagged if r["kind"] == "loop")
        role = " (reference: false positives)" if name == args.reference else ""
        share = f"{len(flagged) / len(rows):.1%}" if rows else "-"
        cells = [f"{name}{role}", len(rows), len(flagged), loops, len(flagged) - loops, share]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    if args.logprobs:
        print_logprob_signal(results, args.window)
    if args.json is not None:
        kept = {n: flagged_of(rs) for n, rs in results.items()}
        summary: dict[str, object] = {
            "prompts": len(asked),
            "max_tokens": args.max_tokens,
            "flagged": kept,
        }
        if args.logprobs:
            summary["lowest_window_logprob"] = {
                n: [r["lowest_window_logprob"] for r in rs] for n, rs in results.items()
            }
        args.json.write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
