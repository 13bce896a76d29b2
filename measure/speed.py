"""A short speed calibration of each tier, with the load generator ``bench`` uses.

Per tier, alone (tiers are measured one after another: on a shared machine a tier measured
while another works would look slower than it is): ``requests`` prompts of ``input_len``
tokens, ``output_len`` generated (``ignore_eos``), at concurrency 1 and at ``concurrency``.
Figures: TTFT and TPOT medians at concurrency 1, output tokens per second at the higher one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from measure.loadgen import Prompt, Recorder, run_level, warm_up
from measure.prompts import load_tokenizer, make_prompts
from measure.serving_stats import compute_stats


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
    requests: int = 4
    concurrency: int = 4
    seed: int = 0


async def _level(
    url: str, model: str, prompts: Sequence[Prompt], opts: SpeedOptions, c: int
) -> Recorder:
    recorder = Recorder()
    await run_level(url, model, prompts, opts.output_len, c, recorder)
    return recorder


async def measure_tier(
    name: str, url: str, model: str, tokenizer_dir: Path, opts: SpeedOptions
) -> TierSpeed:
    tokenizer = load_tokenizer(tokenizer_dir)
    prompts = make_prompts(tokenizer, opts.requests, opts.input_len, opts.seed)
    await warm_up(url, model, prompts[0], opts.output_len, 1)
    alone = await _level(url, model, prompts, opts, 1)
    loaded = await _level(url, model, prompts, opts, opts.concurrency)
    one = compute_stats(list(alone.results.values()), alone.ended - alone.started)
    many = compute_stats(list(loaded.results.values()), loaded.ended - loaded.started)
    return TierSpeed(
        tier=name,
        ttft_s=(one.median_ttft_ms or 0.0) / 1000,
        tpot_s=(one.median_tpot_ms or 0.0) / 1000,
        throughput_tok_s=many.output_throughput,
        concurrency=opts.concurrency,
        failed=one.failed + many.failed,
    )


def calibrate(
    tiers: Mapping[str, str], model: str, tokenizer_dir: Path, opts: SpeedOptions | None = None
) -> dict[str, TierSpeed]:
    """Every tier's speed, one tier at a time (synchronous, for ``up``)."""
    options = opts or SpeedOptions()

    async def main() -> dict[str, TierSpeed]:
        out = {}
        for name, url in tiers.items():
            out[name] = await measure_tier(name, url, model, tokenizer_dir, options)
        return out

    return asyncio.run(main())
