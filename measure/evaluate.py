"""``model-optimizer eval``: every tier against the reference (fp16) tier, straight to vLLM.

1. prepare (once): the texts' token ids (the reference tier's ``/tokenize``; every tier
   serves the same tokenizer); the general category's continuations are the reference tier's
   greedy answers to its general-chat prompts (none a calibration text), generated now;
2. per run, per tier: score every text with ``prompt_logprobs`` (perplexity of the
   continuation, top-1 tokens), answer the GSM8K questions (exact match) and complete the
   HumanEval prompts (pass@1 in measure/sandbox.py);
3. the figures (measure/eval_report.py): per tier x category, over the runs.

Each run repeats every request: with greedy decoding the runs normally agree exactly, and
the spread says whether they did.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import httpx
from tqdm import tqdm

from measure import vllm_client as api
from measure.eval_data import CodeItem, MathItem, load_general, load_gsm8k, load_humaneval
from measure.logprobs import Scored
from measure.quality import exact_match
from measure.sandbox import run_program

CATEGORIES = ("code", "math", "general")
# Codex's stop sequences for HumanEval less "\n#" (vLLM takes at most 4): the body ends
# at the next top-level line.
HUMANEVAL_STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(")
T = TypeVar("T")


@dataclass(frozen=True)
class EvalOptions:
    tiers: dict[str, str]  # name -> base URL, in report order
    reference: str
    model: str | None = None  # None: the reference tier's served model
    runs: int = 3
    seed: int = 0
    limit: int = 10  # items per category
    max_tokens: int = 256  # generated tokens per answer
    concurrency: int = 4
    sandbox_timeout: float = 10.0
    request_timeout: float = 600.0


@dataclass(frozen=True)
class Text:
    category: str
    item_id: str
    prompt_ids: tuple[int, ...]
    continuation_ids: tuple[int, ...]


@dataclass(frozen=True)
class Prepared:
    model: str
    texts: tuple[Text, ...]
    math: tuple[MathItem, ...]
    code: tuple[CodeItem, ...]


@dataclass(frozen=True)
class TierRun:
    """One tier's results in one run; ``scores`` in the order of ``Prepared.texts``."""

    tier: str
    run: int
    scores: tuple[Scored, ...]
    math_correct: tuple[bool, ...]
    code_passed: tuple[bool, ...]


def math_prompt(question: str) -> str:
    return f"Question: {question}\nAnswer:\n"


async def _gather(
    label: str, calls: Sequence[Callable[[], Awaitable[T]]], concurrency: int
) -> list[T]:
    """Run ``calls`` at most ``concurrency`` at a time, in order, with a progress bar."""
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(calls), desc=label, file=sys.stderr, leave=False, dynamic_ncols=True)

    async def one(call: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            result = await call()
        bar.update(1)
        return result

    try:
        return list(await asyncio.gather(*(one(c) for c in calls)))
    finally:
        bar.close()


async def prepare(client: httpx.AsyncClient, opts: EvalOptions) -> Prepared:
    ref = opts.tiers[opts.reference]
    model = opts.model or await api.served_model(client, ref)
    code, math, general = (
        load_humaneval(opts.limit),
        load_gsm8k(opts.limit),
        load_general(opts.limit),
    )

    def tok(text: str) -> Callable[[], Awaitable[list[int]]]:
        return lambda: api.tokenize(client, ref, model, text)

    def chat_tok(question: str) -> Callable[[], Awaitable[list[int]]]:
        return lambda: api.tokenize(client, ref, model, chat=question)

    pieces = [p for c in code for p in (c.prompt, c.solution)]
    pieces += [p for m in math for p in (math_prompt(m.question), m.solution)]
    ids = await _gather("tokenize", [tok(p) for p in pieces], opts.concurrency)
    ids += await _gather("tokenize", [chat_tok(g.question) for g in general], opts.concurrency)
    texts = [
        Text("code", c.task_id, tuple(ids[2 * i]), tuple(ids[2 * i + 1]))
        for i, c in enumerate(code)
    ]
    at = 2 * len(code)
    texts += [
        Text("math", m.item_id, tuple(ids[at + 2 * i]), tuple(ids[at + 2 * i + 1]))
        for i, m in enumerate(math)
    ]
    chat_ids = ids[at + 2 * len(math) :]

    def answer(prompt: list[int]) -> Callable[[], Awaitable[api.Answer]]:
        return lambda: api.complete(client, ref, model, prompt, opts.max_tokens, opts.seed)

    answers = await _gather(
        f"{opts.reference} answers", [answer(p) for p in chat_ids], opts.concurrency
    )
    for item, prompt, ans in zip(general, chat_ids, answers, strict=True):
        if not ans.token_ids:
            raise api.EndpointError(f"{ref}: no token_ids in the answer (vLLM's return_token_ids)")
        texts.append(Text("general", item.item_id, tuple(prompt), ans.token_ids))
    return Prepared(model, tuple(texts), tuple(math), tuple(code))


async def run_tier(
    client: httpx.AsyncClient, opts: EvalOptions, prepared: Prepared, tier: str, run: int
) -> TierRun:
    base, model, n = opts.tiers[tier], prepared.model, opts.concurrency
    tag = f"run {run} {tier}"

    def scorer(t: Text) -> Callable[[], Awaitable[Scored]]:
        return lambda: api.score(client, base, model, t.prompt_ids, t.continuation_ids, opts.seed)

    def asker(m: MathItem) -> Callable[[], Awaitable[api.Answer]]:
        return lambda: api.chat(client, base, model, m.question, opts.max_tokens, opts.seed)

    def coder(c: CodeItem) -> Callable[[], Awaitable[api.Answer]]:
        return lambda: api.complete(
            client, base, model, c.prompt, opts.max_tokens, opts.seed, HUMANEVAL_STOP
        )

    scores = await _gather(f"{tag} score", [scorer(t) for t in prepared.texts], n)
    answers = await _gather(f"{tag} gsm8k", [asker(m) for m in prepared.math], n)
    correct = tuple(
        exact_match(a.text, m.answer) for a, m in zip(answers, prepared.math, strict=True)
    )
    completions = await _gather(f"{tag} humaneval", [coder(c) for c in prepared.code], n)
    passed = []
    for item, completion in zip(prepared.code, completions, strict=True):
        program = humaneval_program(item, completion.text)
        result = await asyncio.to_thread(run_program, program, opts.sandbox_timeout)
        passed.append(result.passed)
    return TierRun(tier, run, tuple(scores), correct, tuple(passed))


def humaneval_program(item: CodeItem, completion: str) -> str:
    """HumanEval's check: the prompt, the model's body, the tests, ``check(entry_point)``."""
    return f"{item.prompt}{completion}\n\n{item.test}\n\ncheck({item.entry_point})\n"


async def evaluate(opts: EvalOptions) -> tuple[Prepared, list[TierRun]]:
    timeout = httpx.Timeout(opts.request_timeout, connect=10.0)
    limits = httpx.Limits(max_connections=opts.concurrency * 2)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        prepared = await prepare(client, opts)
        runs = []
        for run in range(1, opts.runs + 1):
            for tier in opts.tiers:
                runs.append(await run_tier(client, opts, prepared, tier, run))
                print(f"eval: run {run}/{opts.runs}: {tier} done", file=sys.stderr, flush=True)
    return prepared, runs
