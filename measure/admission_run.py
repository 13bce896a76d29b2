"""The in-engine admission check, I/O part: probes sent to running tiers (vLLM or llama.cpp).

1. the reference tier answers every probe greedily (chat template applied by the reference
   tier itself; every tier serves the same tokenizer);
2. every other tier scores those answers teacher-forced and answers the same prompts greedily
   itself. vLLM scores a whole answer in one request (``prompt_logprobs``); llama-server has no
   prompt log-probabilities, so it is asked one greedy token after each prefix of the answer,
   its prefix cache making each step one token's work (measure/llama_client.py);
3. measure/admission.py judges the figures.

Tiers are separate servers: they are asked concurrently, a few requests each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from measure import llama_client as llama
from measure import vllm_client as api
from measure.admission import (
    AdmissionProbe,
    ProbeFigures,
    TierVerdict,
    fact_kept,
    first_divergence,
    judge,
    reference_problems,
)
from measure.quality import sequence_agreement

SEED = 0


@dataclass(frozen=True)
class CheckOptions:
    tiers: Mapping[str, str]  # name -> base URL; the reference among them
    reference: str
    floors: Mapping[str, float]
    max_tokens: int = 32
    concurrency: int = 4  # requests in flight per tier
    modes: Mapping[str, str] = field(default_factory=dict)  # tier -> native | emulated
    engines: Mapping[str, str] = field(default_factory=dict)  # tier -> vllm (default) | llama.cpp
    timeout: float = 300.0
    api_key: str | None = field(default=None, repr=False)  # the tiers' key (llama.cpp wants it)


@dataclass(frozen=True)
class ReferenceAnswer:
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str
    pieces: tuple[str, ...] = ()  # each token's text (where a fact's word sits)


@dataclass(frozen=True)
class CheckResult:
    reference: str
    reference_problems: tuple[str, ...]  # non-empty: the reference itself answers wrong
    verdicts: dict[str, TierVerdict]


LLAMA_CPP = "llama.cpp"


async def chat_ids(
    client: httpx.AsyncClient, base: str, model: str, engine: str, text: str
) -> list[int]:
    if engine == LLAMA_CPP:
        return await llama.chat_prompt_ids(client, base, text)
    return await api.tokenize(client, base, model, chat=text)


async def greedy(
    client: httpx.AsyncClient,
    base: str,
    model: str,
    engine: str,
    ids: Sequence[int],
    n: int,
    pieces: bool = False,
) -> api.Answer:
    if engine == LLAMA_CPP:
        return await llama.complete(client, base, ids, n, SEED, pieces=pieces)
    return await api.complete(client, base, model, ids, n, SEED, pieces=pieces)


async def top1(
    client: httpx.AsyncClient,
    base: str,
    model: str,
    engine: str,
    prompt: Sequence[int],
    continuation: Sequence[int],
    slot: int | None = None,
) -> tuple[int, ...]:
    """The tier's top-1 token at each position of ``continuation`` (teacher-forced)."""
    if engine == LLAMA_CPP:
        return await llama.top1_along(client, base, prompt, continuation, SEED, slot)
    return (await api.score(client, base, model, prompt, continuation, SEED)).top1


async def reference_answers(
    client: httpx.AsyncClient,
    base: str,
    model: str,
    engine: str,
    probes: Sequence[AdmissionProbe],
    max_tokens: int,
    concurrency: int,
) -> list[ReferenceAnswer]:
    limit = asyncio.Semaphore(concurrency)

    async def one(probe: AdmissionProbe) -> ReferenceAnswer:
        async with limit:
            ids = await chat_ids(client, base, model, engine, probe.text)
            answer = await greedy(client, base, model, engine, ids, max_tokens, bool(probe.expect))
        return ReferenceAnswer(tuple(ids), answer.token_ids, answer.text, answer.pieces)

    return list(await asyncio.gather(*(one(p) for p in probes)))


async def tier_figures(
    client: httpx.AsyncClient,
    base: str,
    model: str,
    engine: str,
    probes: Sequence[AdmissionProbe],
    references: Sequence[ReferenceAnswer],
    max_tokens: int,
    concurrency: int,
) -> list[ProbeFigures]:
    slots: asyncio.Queue[int] = asyncio.Queue()
    for slot in range(concurrency):  # llama.cpp: each probe in flight keeps to its own slot
        slots.put_nowait(slot)

    async def one(probe: AdmissionProbe, ref: ReferenceAnswer) -> ProbeFigures:
        slot = await slots.get()
        try:
            answer = await greedy(client, base, model, engine, ref.prompt_ids, max_tokens)
            forced, positions = 1.0, 0
            tops: tuple[int, ...] = ()
            if ref.token_ids:
                tops = await top1(client, base, model, engine, ref.prompt_ids, ref.token_ids, slot)
                positions = len(tops)
                same = sum(a == b for a, b in zip(tops, ref.token_ids, strict=False))
                forced = same / positions if positions else 1.0
        finally:
            slots.put_nowait(slot)
        return ProbeFigures(
            category=probe.category,
            forced_agreement=forced,
            positions=positions,
            free_agreement=sequence_agreement(answer.token_ids, ref.token_ids),
            first_divergence=first_divergence(answer.token_ids, ref.token_ids),
            expect=probe.expect,
            answer=answer.text,
            reference_answer=ref.text,
            fact_kept=fact_kept(ref.pieces, ref.token_ids, tops, probe.expect)
            if probe.expect
            else None,
        )

    return list(await asyncio.gather(*(one(p, r) for p, r in zip(probes, references, strict=True))))


async def check_tiers(
    client: httpx.AsyncClient, opts: CheckOptions, probes: Sequence[AdmissionProbe]
) -> CheckResult:
    """Every tier but the reference judged against the reference (see the module docstring)."""
    ref_base = opts.tiers[opts.reference]
    model = await api.served_model(client, ref_base)
    ref_engine = opts.engines.get(opts.reference, "vllm")
    refs = await reference_answers(
        client, ref_base, model, ref_engine, probes, opts.max_tokens, opts.concurrency
    )
    problems = reference_problems([(p, r.text) for p, r in zip(probes, refs, strict=True)])
    if problems:
        return CheckResult(opts.reference, tuple(problems), {})
    others = [name for name in opts.tiers if name != opts.reference]

    def figures_of(name: str) -> Awaitable[list[ProbeFigures]]:
        return tier_figures(
            client,
            opts.tiers[name],
            model,
            opts.engines.get(name, "vllm"),
            probes,
            refs,
            opts.max_tokens,
            opts.concurrency,
        )

    # All at once: vLLM tiers on CPU keep to their own core, llama.cpp tiers run one thread
    # each (backends/llama_args.py), so the tiers do not stall one another.
    figures = list(await asyncio.gather(*(figures_of(name) for name in others)))
    verdicts = {
        name: judge(name, opts.reference, figs, opts.floors, opts.modes.get(name, "native"))
        for name, figs in zip(others, figures, strict=True)
    }
    return CheckResult(opts.reference, (), verdicts)


def run_check(opts: CheckOptions, probes: Sequence[AdmissionProbe]) -> CheckResult:
    """``check_tiers`` from synchronous code (``up``, the CLI)."""

    async def main() -> CheckResult:
        headers = {"authorization": f"Bearer {opts.api_key}"} if opts.api_key else None
        async with httpx.AsyncClient(
            timeout=opts.timeout, trust_env=False, headers=headers
        ) as client:
            return await check_tiers(client, opts, probes)

    return asyncio.run(main())
