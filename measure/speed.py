"""A short speed calibration of each tier, with the load generator ``bench`` uses.

Per tier: ``requests`` prompts of ``input_len`` tokens, ``output_len`` generated
(``ignore_eos``), at concurrency 1 and at ``concurrency``. Figures: TTFT and TPOT medians at
concurrency 1, output tokens per second at the higher one. A tier is never measured while
another works (that would make it look slower than it is), and the requests alone are
interleaved across tiers (prompt 1 to every tier, the order rotating, then prompt 2 ...): the
routes are derived from these figures' ratios, and on a shared machine whose load changes over
the seconds of a calibration, measuring one tier after the other once sent a class to a tier
only because the machine was busier while the other was measured. Each tier's TTFT and TPOT
per prompt alone are kept too (``TierSpeed.ttfts_s``, ``tpots_s``): paired by prompt, they give
the route derivation an interval on a tier's gain, not only two medians.
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
    # Per prompt of the requests alone, in prompt order (prompt i went to every tier back to
    # back, so index i pairs the tiers: gateway/policy/confidence.py); None: that one failed.
    ttfts_s: tuple[float | None, ...] = ()
    tpots_s: tuple[float | None, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> TierSpeed:
        """As ``dataclasses.asdict`` wrote it (lists for the samples; absent in old files)."""
        fields = dict(data)
        for key in ("ttfts_s", "tpots_s"):
            values = fields.get(key, ())
            if not isinstance(values, list | tuple):
                raise TypeError(f"{key} must be a list, not {type(values).__name__}")
            fields[key] = tuple(None if v is None else float(v) for v in values)
        return cls(**fields)  # type: ignore[arg-type]


def samples(results: Sequence[RequestResult]) -> tuple[list[float | None], list[float | None]]:
    """Each request's TTFT and TPOT (seconds), ``None`` where it failed (TPOT also where it
    produced fewer than two tokens): the per-prompt samples, in the order given."""
    ttfts: list[float | None] = []
    tpots: list[float | None] = []
    for r in results:
        ttfts.append(r.ttft if r.success else None)
        ok = r.success and r.output_tokens > 1
        tpots.append((r.latency - r.ttft) / (r.output_tokens - 1) if ok else None)
    return ttfts, tpots


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
        ttfts, tpots = samples(alone[name])
        out[name] = TierSpeed(
            tier=name,
            ttft_s=(one.median_ttft_ms or 0.0) / 1000,
            tpot_s=(one.median_tpot_ms or 0.0) / 1000,
            throughput_tok_s=many.output_throughput,
            concurrency=opts.concurrency,
            failed=one.failed + many.failed,
            ttfts_s=tuple(ttfts),
            tpots_s=tuple(tpots),
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
