"""The gateway's prompt count over a conversation, with and without its count cache.

    ./mo setup && $(python3 -m model_optimizer.envs path gateway)/bin/python \\
        benchmarks/bench_prompt_count.py [--turns 10] [--conversations 20] [--rounds 5]

A chat client sends the whole conversation at every turn; the gateway counts its prompt tokens
(gateway/request/tokens/limits.py, the default model's tokenizer and chat template) before routing.
Conversations are built from measure/data/gsm8k_eval.jsonl (test data, not used to tune
anything here): each turn a question as the user and its reference answer as the assistant;
turn k sends the first 2k - 1 messages. Each round counts every turn of every conversation once
with a fresh cache (what a replica's cache does, requests arriving in order) and once without
one (``cache_chars=0``), interleaved, and prints the time per request (median over rounds),
per turn depth, and the ratio side by side. Counts are checked equal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_gateway import find_tokenizer_dir  # noqa: E402
from gateway.request.tokens.limits import TokenCounter  # noqa: E402

DATA = ROOT / "measure" / "data" / "gsm8k_eval.jsonl"
LIMIT = 32_768  # the counts are exact up to here: every conversation below fits


def conversations(turns: int, count: int) -> list[list[dict[str, Any]]]:
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line]
    out = []
    for c in range(count):
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a patient math tutor. Show each step."}
        ]
        for t in range(turns):
            row = rows[(c * turns + t) % len(rows)]
            messages += [
                {"role": "user", "content": row["question"]},
                {"role": "assistant", "content": row["answer"]},
            ]
        out.append(messages)
    return out


def run(
    folder: Path, chats: list[list[dict[str, Any]]], turns: int, cache_chars: int
) -> tuple[list[float], list[int]]:
    """Seconds per request at each turn depth (summed over conversations), and the counts."""
    counter = TokenCounter.from_model_dir(folder)
    counter = TokenCounter(counter.tokenizer, counter.chat_template, cache_chars=cache_chars)
    seconds, counts = [0.0] * turns, []
    for chat in chats:
        for t in range(turns):
            sent = chat[: 2 + 2 * t]  # system, then t answered turns and the new question
            began = time.perf_counter()
            counts.append(counter.count_chat(sent, limit=LIMIT))
            seconds[t] += time.perf_counter() - began
    return [s / len(chats) for s in seconds], counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if min(args.turns, args.conversations, args.rounds) < 1:
        parser.error("--turns, --conversations and --rounds must be positive")
    folder = find_tokenizer_dir()
    if folder is None:
        print("bench_prompt_count: no model folder with a tokenizer.json; run ./mo setup first",
              file=sys.stderr)  # fmt: skip
        return 2
    chats = conversations(args.turns, args.conversations)
    results: dict[str, list[list[float]]] = {"cached": [], "uncached": []}
    for _ in range(args.rounds):
        for name, chars in (("cached", 4_000_000), ("uncached", 0)):
            per_turn, counts = run(folder, chats, args.turns, chars)
            results[name].append(per_turn)
            if name == "cached":
                expected = counts
            elif counts != expected:
                raise SystemExit("the counts differ with and without the cache")
    print(f"prompt count per request, {args.conversations} conversations, median of "
          f"{args.rounds} interleaved rounds ({folder.name}'s tokenizer)")  # fmt: skip
    print("| turn | prompt tokens | uncached µs | cached µs | uncached / cached |")
    print("|---|---|---|---|---|")
    tokens = [statistics.median(expected[t :: args.turns]) for t in range(args.turns)]
    for t in range(args.turns):
        plain = statistics.median(r[t] for r in results["uncached"]) * 1e6
        cached = statistics.median(r[t] for r in results["cached"]) * 1e6
        print(f"| {t + 1} | {tokens[t]:.0f} | {plain:.0f} | {cached:.0f} | {plain / cached:.1f}x |")
    total = {name: statistics.median(sum(r) for r in rs) for name, rs in results.items()}
    print(f"whole conversation ({args.turns} requests): uncached {total['uncached'] * 1e3:.2f} ms,"
          f" cached {total['cached'] * 1e3:.2f} ms, "
          f"{total['uncached'] / total['cached']:.1f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
