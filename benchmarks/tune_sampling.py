"""Choose the embedded model's default temperature on tuning questions, never on the README's.

The README's first request ("What is the capital of France?", no sampling fields) is answered
at the model's own defaults (its generation_config.json). This script measures, straight on a
tier, how often short factual questions are answered right and how often an answer runs past
``--max-tokens`` without ending, at each temperature of ``--temperatures`` (top_p fixed at the
model card's 0.9), ``--samples`` answers per question (one for temperature 0: greedy is one
answer). The questions are measure/data/sampling_tuning.jsonl: tuning data, written for this and
used for nothing else; it holds no question of the README, of the admission probes or of any
evaluation set. The README's figure is then measured on its own question with
benchmarks/bench_first_answer.py.

The rule, fixed before any run: the highest share right wins; among temperatures within one
standard error of it, the one whose answers end most often, then the highest (closest to the
model card's 0.2).

    ./mo up --tier-port 18100                  # in another terminal
    $(python3 -m model_optimizer.envs path gateway)/bin/python benchmarks/tune_sampling.py \
        --tier-base http://127.0.0.1:18100 --json benchmarks/results/sampling-tuning-avx2.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from measure.vllm_client import served_model  # noqa: E402

QUESTIONS = ROOT / "measure" / "data" / "sampling_tuning.jsonl"


@dataclass
class Cell:
    """Answers at one temperature."""

    temperature: float
    answers: int = 0
    right: int = 0
    unended: int = 0  # finish_reason "length": still going at --max-tokens
    wrong_examples: list[str] = field(default_factory=list)

    @property
    def share_right(self) -> float:
        return self.right / self.answers if self.answers else 0.0

    @property
    def stderr(self) -> float:
        p = self.share_right
        return math.sqrt(p * (1 - p) / self.answers) if self.answers else 1.0

    @property
    def share_ended(self) -> float:
        return 1 - self.unended / self.answers if self.answers else 0.0


def names_any(text: str, expected: list[str]) -> bool:
    """Whether ``text`` names one of ``expected`` as a whole word (case-insensitive)."""
    return any(
        re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text, re.IGNORECASE) for word in expected
    )


def choose(cells: list[Cell]) -> Cell:
    """The rule in the module's docstring."""
    best = max(cells, key=lambda c: c.share_right)
    close = [c for c in cells if c.share_right >= best.share_right - best.stderr]
    return max(close, key=lambda c: (c.share_ended, c.temperature))


async def measure(
    client: httpx.AsyncClient,
    model: str,
    questions: list[dict],
    temperature: float,
    samples: int,
    max_tokens: int,
    concurrency: int,
) -> Cell:
    cell = Cell(temperature)
    gate = asyncio.Semaphore(concurrency)
    n = 1 if temperature == 0 else samples

    async def one(question: dict) -> None:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": question["text"]}],
            "temperature": temperature,
            "top_p": 0.9,
            "n": n,
            "max_tokens": max_tokens,
        }
        async with gate:
            response = await client.post("/v1/chat/completions", json=body)
        response.raise_for_status()
        for choice in response.json()["choices"]:
            text = choice["message"]["content"] or ""
            cell.answers += 1
            cell.unended += choice["finish_reason"] == "length"
            if names_any(text, question["expect"]):
                cell.right += 1
            elif len(cell.wrong_examples) < 5:
                cell.wrong_examples.append(f"{question['text']} -> {text[:80]!r}")
        print(f"\rT={temperature}: {cell.answers} answers", end="", file=sys.stderr)

    await asyncio.gather(*(one(q) for q in questions))
    print(file=sys.stderr)
    return cell


async def measure_all(
    base: str, questions: list[dict], temperatures: list[float], args: argparse.Namespace
) -> list[Cell]:
    """Every temperature in turn, on one client."""
    async with httpx.AsyncClient(base_url=base, timeout=900) as client:
        model = await served_model(client, base)
        return [
            await measure(
                client, model, questions, t, args.samples, args.max_tokens, args.concurrency
            )
            for t in temperatures
        ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier-base", default="http://127.0.0.1:8100", help="the fp16 tier")
    parser.add_argument("--temperatures", default="0,0.05,0.1,0.2")
    parser.add_argument("--samples", type=int, default=5, help="answers per question (n)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    try:
        temperatures = [float(t) for t in args.temperatures.split(",")]
    except ValueError:
        parser.error(f"--temperatures: not a comma-separated list of numbers: {args.temperatures}")
    if args.samples < 1 or args.max_tokens < 1 or args.concurrency < 1:
        parser.error("--samples, --max-tokens and --concurrency must be at least 1")
    questions = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line]
    cells = asyncio.run(measure_all(args.tier_base.rstrip("/"), questions, temperatures, args))
    print(f"{len(questions)} tuning questions, top_p 0.9, max_tokens {args.max_tokens}")
    print("| temperature | answers | right | ended within max_tokens |")
    print("|---|---|---|---|")
    for c in cells:
        print(
            f"| {c.temperature} | {c.answers} | {c.share_right:.1%} ± {c.stderr:.1%} "
            f"| {c.share_ended:.1%} |"
        )
    chosen = choose(cells)
    print(f"chosen by the rule: temperature {chosen.temperature}")
    if args.json:
        payload = {
            "questions": str(QUESTIONS.relative_to(ROOT)),
            "top_p": 0.9,
            "max_tokens": args.max_tokens,
            "samples": args.samples,
            "cells": [asdict(c) | {"share_right": c.share_right} for c in cells],
            "chosen": chosen.temperature,
        }
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
