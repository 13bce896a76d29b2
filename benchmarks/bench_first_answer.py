"""The README's first request, many times: how often does the answer name Paris?

The README's curl example asks a running gateway "What is the capital of France?" with no
sampling fields, so the tier samples at the model's own defaults (the embedded model's
generation_config.json: temperature 0.2, top_p 0.9). This script sends exactly that body
``--tries`` times through the official ``openai`` client (no seed: each answer is a fresh
sample; ``--concurrency`` at once) and prints how many answers name Paris, with a Wilson 95 %
interval, the tier that answered each (``x-route-tier``), how long the answers ran (completion
tokens, finish reasons: with no ``max_tokens`` an answer may run to the context's end) and the
answers that missed.

    ./mo up                                   # in another terminal
    $(python3 -m model_optimizer.envs path gateway)/bin/python benchmarks/bench_first_answer.py \
        --gateway http://127.0.0.1:8000 --tries 50

The question is the README's own; it is not used to tune anything (the sampling defaults are the
model card's, not chosen from these answers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field

import openai

QUESTION = "What is the capital of France?"


@dataclass
class Tally:
    tries: int = 0
    hits: int = 0
    tiers: Counter[str] = field(default_factory=Counter)
    finish: Counter[str] = field(default_factory=Counter)
    completion_tokens: list[int] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # requests that got no answer (not tries)

    def add(self, text: str, tier: str, finish: str = "?", tokens: int = 0) -> None:
        self.tries += 1
        self.tiers[tier] += 1
        self.finish[finish] += 1
        self.completion_tokens.append(tokens)
        if "paris" in text.lower():
            self.hits += 1
        else:
            self.misses.append(text)


def wilson(hits: int, tries: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95 % by default)."""
    if tries == 0:
        return (0.0, 1.0)
    p = hits / tries
    denom = 1 + z * z / tries
    centre = (p + z * z / (2 * tries)) / denom
    half = z * math.sqrt(p * (1 - p) / tries + z * z / (4 * tries * tries)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


async def run(gateway: str, model: str, tries: int, api_key: str, concurrency: int) -> Tally:
    client = openai.AsyncOpenAI(
        base_url=f"{gateway}/v1", api_key=api_key, timeout=600, max_retries=0
    )
    tally = Tally()
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            try:
                raw = await client.chat.completions.with_raw_response.create(
                    model=model, messages=[{"role": "user", "content": QUESTION}]
                )
            except openai.APIError as exc:
                tally.errors.append(f"{type(exc).__name__}: {exc}")
                return
        answer = raw.parse()
        choice = answer.choices[0]
        tokens = answer.usage.completion_tokens if answer.usage else 0
        tier = raw.headers.get("x-route-tier", "?")
        tally.add(choice.message.content or "", tier, choice.finish_reason or "?", tokens)
        done = tally.tries + len(tally.errors)
        print(f"\r{done}/{tries} named Paris {tally.hits}", end="", file=sys.stderr, flush=True)

    await asyncio.gather(*(one() for _ in range(tries)))
    await client.close()
    print(file=sys.stderr)
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--tries", type=int, default=50)
    parser.add_argument("--api-key", default="unused")
    parser.add_argument("--concurrency", type=int, default=1, help="requests at once")
    parser.add_argument("--json", default=None, help="also write the tally here")
    args = parser.parse_args()
    if args.tries < 1 or args.concurrency < 1:
        parser.error("--tries and --concurrency must be at least 1")
    tally = asyncio.run(
        run(args.gateway.rstrip("/"), args.model, args.tries, args.api_key, args.concurrency)
    )
    low, high = wilson(tally.hits, tally.tries)
    if tally.tries == 0:
        print(f"no answer in {args.tries} requests: {tally.errors[0][:200]}")
        return 1
    print(
        f"named Paris in {tally.hits} of {tally.tries} "
        f"({tally.hits / tally.tries:.0%}; 95% interval {low:.0%}-{high:.0%}); "
        f"tiers: {dict(tally.tiers)}"
    )
    tokens = sorted(tally.completion_tokens)
    print(
        f"completion tokens: median {tokens[len(tokens) // 2]}, max {tokens[-1]}; "
        f"finish reasons: {dict(tally.finish)}"
    )
    for text in tally.misses:
        print(f"  missed: {text[:120]!r}")
    for error in tally.errors:
        print(f"  no answer: {error[:200]}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({**asdict(tally), "interval95": [low, high]}, out, indent=2)
    return 1 if tally.errors or tally.tries == 0 else 0


if __name__ == "__main__":
    raise SystemExit(main())
