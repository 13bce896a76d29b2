"""A short speed calibration of each tier, with the load generator ``bench`` uses.

Per tier: ``requests`` prompts of ``input_len`` tokens, ``output_len`` generated
(``ignore_eos``), at concurrency 1 and at ``concurrency``. Figures: TTFT and TPOT medians at
concurrency 1, output tokens per second at the higher one. A tier is never measured while
another works (that would make it look slower than it is), and the requests alone are
interleaved across tiers (prompt 1 to every tier, the order rotating, then prompt 2 ...): the
routes are derived from these figures' ratios, and on a shared machine whose load changes over
the seconds of a calibration, measuring one tier after the other once sent a class to a tier
only because the machine was busier while the other was measured.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from measure.loadgen import Prompt, Recorder, run_level, warm_up
from measure.prompts import load_tokenizer, make_prompts
from measure.serving_stats import RequestResult, compute_stats


@dataclass(frozen=True)
class TierSpeed:
    tier: str
    ttft_s: float  # median, one request alone
    tpot_s: float  # median, one request alone
    throughput_tok_s: float  # output tokens/s at ``concurrency``
    concurrency: int
    failed: int = 0


@dataclass(frozen=True)
class SpeedOptions:
    input_len: int = 128
    output_len: int = 32
    requests: int = 8  # alone: medians of 4 moved 10 % between identical tiers on a shared VM
    concurrency: int = 4
    seed: int = 0


Headers = dict[str, str] | None


async def _level(
    url: str, model: str, prompts: Sequence[Prompt], opts: SpeedOptions, c: int, headers: Headers
) -> Recorder:
    recorder = Recorder()
    await run_level(url, model, prompts, opts.output_len, c, recorder, headers=headers)
    return recorder


def alone_order(names: Sequence[str], requests: int) -> list[tuple[int, str]]:
    """(prompt index, tier) in the order the requests alone are sent: every tier gets prompt i
    before any gets prompt i + 1, and the tier that goes first rotates."""
    order = []
    for i in range(requests):
        shift = i % len(names) if names else 0
        order += [(i, name) for name in [*names[shift:], *names[:shift]]]
    return order


async def _alone(
    tiers: Mapping[str, str],
    model: str,
    prompts: Sequence[Prompt],
    opts: SpeedOptions,
    headers: Headers,
) -> dict[str, list[RequestResult]]:
    results: dict[str, list[RequestResult]] = {name: [] for name in tiers}
    for index, name in alone_order(list(tiers), len(prompts)):
        recorder = await _level(tiers[name], model, [prompts[index]], opts, 1, headers)
        results[name] += recorder.ordered()
    return results


async def measure_tiers(
    tiers: Mapping[str, str],
    model: str,
    tokenizer_dir: Path,
    opts: SpeedOptions,
    headers: Headers = None,
) -> dict[str, TierSpeed]:
    tokenizer = load_tokenizer(tokenizer_dir)
    prompts = make_prompts(tokenizer, opts.requests, opts.input_len, opts.seed)
    for url in tiers.values():
        await warm_up(url, model, prompts[0], opts.output_len, 1, headers)
    alone = await _alone(tiers, model, prompts, opts, headers)
    out = {}
    for name, url in tiers.items():
        loaded = await _level(url, model, prompts, opts, opts.concurrency, headers)
        one = compute_stats(alone[name], sum(r.latency for r in alone[name]) or 1e-9)
        many = compute_stats(list(loaded.results.values()), loaded.ended - loaded.started)
        out[name] = TierSpeed(
            tier=name,
            ttft_s=(one.median_ttft_ms or 0.0) / 1000,
            tpot_s=(one.median_tpot_ms or 0.0) / 1000,
            throughput_tok_s=many.output_throughput,
            concurrency=opts.concurrency,
            failed=one.failed + many.failed,
        )
    return out


def calibrate(
    tiers: Mapping[str, str],
    model: str,
    tokenizer_dir: Path,
    opts: SpeedOptions | None = None,
    headers: Headers = None,
) -> dict[str, TierSpeed]:
    """Every tier's speed (synchronous, for ``up``); ``headers`` carry the tiers' key."""
    return asyncio.run(measure_tiers(tiers, model, tokenizer_dir, opts or SpeedOptions(), headers))
