"""The in-engine admission check, I/O part: probes sent to running vLLM tiers.

1. the reference tier answers every probe greedily (chat template applied by its
   ``/tokenize``; every tier serves the same tokenizer);
2. every other tier scores those answers teacher-forced (``prompt_logprobs``) and answers the
   same prompts greedily itself;
3. measure/admission.py judges the figures.

Tiers are separate servers: they are asked concurrently, a few requests each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from measure import vllm_client as api
from measure.admission import (
    AdmissionProbe,
    ProbeFigures,
    TierVerdict,
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
    timeout: float = 300.0


@dataclass(frozen=True)
class ReferenceAnswer:
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class CheckResult:
    reference: str
    reference_problems: tuple[str, ...]  # non-empty: the reference itself answers wrong
    verdicts: dict[str, TierVerdict]


async def reference_answers(
    client: httpx.AsyncClient,
    base: str,
    model: str,
    probes: Sequence[AdmissionProbe],
    max_tokens: int,
    concurrency: int,
) -> list[ReferenceAnswer]:
    limit = asyncio.Semaphore(concurrency)

    async def one(probe: AdmissionProbe) -> ReferenceAnswer:
        async with limit:
            ids = await api.tokenize(client, base, model, chat=probe.text)
            answer = await api.complete(client, base, model, ids, max_tokens, SEED)
        return ReferenceAnswer(tuple(ids), answer.token_ids, answer.text)

    return list(await asyncio.gather(*(one(p) for p in probes)))


async def tier_figures(
    client: httpx.AsyncClient,
    base: str,
    model: str,
    probes: Sequence[AdmissionProbe],
    references: Sequence[ReferenceAnswer],
    max_tokens: int,
    concurrency: int,
) -> list[ProbeFigures]:
    limit = asyncio.Semaphore(concurrency)

    async def one(probe: AdmissionProbe, ref: ReferenceAnswer) -> ProbeFigures:
        async with limit:
            answer = await api.complete(client, base, model, ref.prompt_ids, max_tokens, SEED)
            forced, positions = 1.0, 0
            if ref.token_ids:
                scored = await api.score(client, base, model, ref.prompt_ids, ref.token_ids, SEED)
                positions = len(scored.top1)
                same = sum(a == b for a, b in zip(scored.top1, ref.token_ids, strict=False))
                forced = same / positions if positions else 1.0
        return ProbeFigures(
            category=probe.category,
            forced_agreement=forced,
            positions=positions,
            free_agreement=sequence_agreement(answer.token_ids, ref.token_ids),
            first_divergence=first_divergence(answer.token_ids, ref.token_ids),
            expect=probe.expect,
            answer=answer.text,
            reference_answer=ref.text,
        )

    return list(await asyncio.gather(*(one(p, r) for p, r in zip(probes, references, strict=True))))


async def check_tiers(
    client: httpx.AsyncClient, opts: CheckOptions, probes: Sequence[AdmissionProbe]
) -> CheckResult:
    """Every tier but the reference judged against the reference (see the module docstring)."""
    ref_base = opts.tiers[opts.reference]
    model = await api.served_model(client, ref_base)
    refs = await reference_answers(
        client, ref_base, model, probes, opts.max_tokens, opts.concurrency
    )
    problems = reference_problems([(p, r.text) for p, r in zip(probes, refs, strict=True)])
    if problems:
        return CheckResult(opts.reference, tuple(problems), {})
    others = [name for name in opts.tiers if name != opts.reference]
    figures = await asyncio.gather(
        *(
            tier_figures(
                client, opts.tiers[n], model, probes, refs, opts.max_tokens, opts.concurrency
            )
            for n in others
        )
    )
    verdicts = {
        name: judge(name, opts.reference, figs, opts.floors, opts.modes.get(name, "native"))
        for name, figs in zip(others, figures, strict=True)
    }
    return CheckResult(opts.reference, (), verdicts)


def run_check(opts: CheckOptions, probes: Sequence[AdmissionProbe]) -> CheckResult:
    """``check_tiers`` from synchronous code (``up``, the CLI)."""

    async def main() -> CheckResult:
        async with httpx.AsyncClient(timeout=opts.timeout, trust_env=False) as client:
            return await check_tiers(client, opts, probes)

    return asyncio.run(main())
