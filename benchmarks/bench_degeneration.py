"""How often the escalation detectors flag each tier's own streamed answers.

    ./mo up &        # the default stack (tiers on 127.0.0.1:8001.., or see /admin/tiers)
    $(python3 -m model_optimizer.envs path gateway)/bin/python benchmarks/bench_degeneration.py \\
        --tier fp16=http://127.0.0.1:8001 --tier int8=http://127.0.0.1:8002 \\
        --tier int4=http://127.0.0.1:8003 [--reference fp16] [--prompts 80] [--max-tokens 160] \\
        [--json benchmarks/results/degeneration.json]

Every prompt (the first ``--prompts`` of measure/data/routing_prompts.jsonl and
measure/data/gsm8k_eval.jsonl, alternately: test data, never used to choose the detectors'
settings, which are the shipped policy's defaults, set before this was run) is streamed from
every tier directly, tiers interleaved per prompt, at the model's default sampling (no
temperature sent), as a client would ask. Each answer's events go through the gateway's own
``StreamWatch`` with the policy's detectors (gateway/request/stream_watch.py), as a watched
stream would. The reference tier's flags are false positives (its answers are what the others
are measured against); a lower tier's flags are the answers escalation would have continued
elsewhere. Prints a table; ``--json`` keeps each flagged answer's text and verdict.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.policy.escalation import EscalationPolicy  # noqa: E402
from gateway.policy.schema import load_policy  # noqa: E402
from gateway.request.continuation import complete_events  # noqa: E402
from gateway.request.stream_watch import StreamWatch  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"


def prompts(count: int) -> list[str]:
    data = ROOT / "measure" / "data"
    chat = [json.loads(line)["prompt"] for line in (data / "routing_prompts.jsonl").open()]
    math = [json.loads(line)["question"] for line in (data / "gsm8k_eval.jsonl").open()]
    mixed = [p for pair in zip(chat, math, strict=False) for p in pair]
    return mixed[:count]


def watch_answer(
    url: str, prompt: str, max_tokens: int, escalation: EscalationPolicy
) -> dict[str, object]:
    watch = StreamWatch(
        escalation.loop.check() if escalation.loop else None,
        escalation.scripts.check() if escalation.scripts else None,
        0,
        chat=True,
    )
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    pending = b""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as answer:
        answer.raise_for_status()
        for chunk in answer.iter_raw():
            events, pending = complete_events(pending + chunk)
            if not events:
                continue
            watch.feed(events)
            if watch.verdict is not None:
                break
    verdict = watch.verdict
    return {
        "flagged": verdict is not None,
        "kind": verdict.kind if verdict else None,
        "detail": verdict.detail if verdict else None,
        "text": watch.text if verdict is None else None,
        "kept": watch.text if verdict else None,
    }


def flagged_of(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    return [row for row in rows if row["flagged"]]


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
    args = parser.parse_args()
    tiers = dict(item.split("=", 1) for item in args.tier)
    asked = prompts(args.prompts)
    escalation = load_policy(args.policy).escalation
    results: dict[str, list[dict[str, object]]] = {name: [] for name in tiers}
    started = time.monotonic()
    for i, prompt in enumerate(asked, 1):
        for name, url in tiers.items():
            outcome = watch_answer(url, prompt, args.max_tokens, escalation)
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
    if args.json is not None:
        kept = {n: flagged_of(rs) for n, rs in results.items()}
        summary = {"prompts": len(asked), "max_tokens": args.max_tokens, "flagged": kept}
        args.json.write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
