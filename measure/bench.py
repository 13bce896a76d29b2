"""``model-optimizer bench``: a concurrency sweep per target, with peak memory and Ctrl-C.

For each target (a gateway or a tier, ``measure.targets``) and each concurrency level: warm-up
requests (dropped), then ``num_prompts`` prompts of ``input_len`` tokens asking for
``output_len`` tokens each, at most ``concurrency`` in flight, while the backends' memory is
sampled. A level is one run; its figures are ``measure.serving_stats``'s. Through a gateway the
run also counts which tier answered (the gateway's ``gateway_requests_total`` before and after;
other traffic at the same time counts too).

Ctrl-C stops at once: the requests finished so far in the current level make a run flagged
``partial``, the result is flagged ``partial``, and the caller writes what there is (exit 130).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tqdm import tqdm

from measure.loadgen import Prompt, Recorder, run_level, warm_up
from measure.memory import PeakMemory, PeakSampler
from measure.serving_stats import RequestResult, ServingStats, compute_stats
from measure.targets import Target

DEFAULT_CONCURRENCY = (4, 8, 16)


@dataclass(frozen=True)
class BenchConfig:
    input_len: int = 512
    output_len: int = 128
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    num_prompts: int | None = None  # per level; None: twice the level's concurrency
    seed: int = 0
    num_warmups: int = 1

    def prompts_at(self, concurrency: int) -> int:
        return self.num_prompts if self.num_prompts is not None else 2 * concurrency


@dataclass(frozen=True)
class RunResult:
    """One target at one concurrency level."""

    label: str
    url: str
    kind: str  # "gateway" | "tier"
    model_id: str
    max_concurrency: int
    num_prompts: int
    input_len: int
    output_len: int
    partial: bool  # interrupted: the figures cover the requests that finished
    stats: ServingStats
    peak_memory: list[PeakMemory]
    served_by: dict[str, int] | None  # gateway runs: requests answered per tier


@dataclass
class BenchResult:
    model_id: str
    config: BenchConfig
    started_at: str
    runs: list[RunResult] = field(default_factory=list)
    partial: bool = False


def parse_concurrency(text: str) -> tuple[int, ...]:
    """``"4,8,16"`` → (4, 8, 16); ``ValueError`` (one line) for anything else (pure)."""
    try:
        levels = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--concurrency must be a list like 4,8,16, not {text!r}") from None
    if not levels or any(level < 1 for level in levels):
        raise ValueError(f"--concurrency levels must be positive integers, not {text!r}")
    return levels


def requests_by_tier(metrics_text: str) -> dict[str, int]:
    """Sum of ``gateway_requests_total`` per ``tier`` label in a gateway's /metrics text."""
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "gateway_requests_total":
                tier = sample.labels.get("tier", "")
                counts[tier] = counts.get(tier, 0) + int(sample.value)
    return counts


def _scrape_counts(url: str) -> dict[str, int] | None:
    try:
        answer = httpx.get(f"{url}/metrics", timeout=10.0, trust_env=False)
        answer.raise_for_status()
        return requests_by_tier(answer.text)
    except (httpx.HTTPError, ValueError):
        return None


def _served_by(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, int]:
    if before is None or after is None:
        return {}
    grown = {tier: n - before.get(tier, 0) for tier, n in after.items()}
    return {tier: n for tier, n in sorted(grown.items()) if n > 0}


def measure_level(
    target: Target,
    model: str,
    prompts: Sequence[Prompt],
    config: BenchConfig,
    concurrency: int,
    runs: list[RunResult],
    on_done: Callable[[RequestResult], None] = lambda _: None,
) -> RunResult:
    """Run one level and append its result to ``runs`` — also when interrupted (then flagged
    partial, when at least one request finished, and the KeyboardInterrupt goes on)."""
    recorder = Recorder()
    before = _scrape_counts(target.url) if target.kind == "gateway" else None
    interrupted = False
    with PeakSampler(target.backends) as sampler:
        try:
            asyncio.run(
                run_level(
                    target.url, model, prompts, config.output_len, concurrency, recorder, on_done
                )
            )
        except KeyboardInterrupt:
            interrupted = True
    results = recorder.ordered()
    if interrupted and not results:
        raise KeyboardInterrupt
    served = _served_by(before, _scrape_counts(target.url)) if before is not None else None
    run = RunResult(
        label=target.label,
        url=target.url,
        kind=target.kind,
        model_id=model,
        max_concurrency=concurrency,
        num_prompts=len(prompts),
        input_len=config.input_len,
        output_len=config.output_len,
        partial=interrupted,
        stats=compute_stats(results, recorder.duration()),
        peak_memory=sampler.peaks(),
        served_by=served,
    )
    runs.append(run)
    if interrupted:
        raise KeyboardInterrupt
    return run


def prompts_needed(targets: int, config: BenchConfig) -> int:
    """Prompts for a sweep: every warm-up and every run gets its own, so no request finds its
    prompt in a tier's prefix cache from an earlier one."""
    per_target = config.num_warmups + sum(config.prompts_at(c) for c in config.concurrency)
    return targets * per_target


def sweep(
    targets: Sequence[Target],
    model: str,
    prompts: Sequence[Prompt],
    config: BenchConfig,
    runs: list[RunResult],
    progress: Any = None,
) -> None:
    """Every target at every level, in that order; results appended to ``runs`` as they come.
    ``prompts`` holds ``prompts_needed`` prompts, used in turn; ``progress`` is a tqdm bar (or
    ``None``) counting requests."""
    if len(prompts) < prompts_needed(len(targets), config):
        raise ValueError(f"{len(prompts)} prompts, fewer than the sweep needs")
    pool = iter(prompts)
    for target in targets:
        if config.num_warmups:
            _describe(progress, f"{target.label} warm-up")
            for _ in range(config.num_warmups):
                asyncio.run(warm_up(target.url, model, next(pool), config.output_len, 1))
        for level in config.concurrency:
            _describe(progress, f"{target.label} c={level}")
            run = measure_level(
                target,
                model,
                [next(pool) for _ in range(config.prompts_at(level))],
                config,
                level,
                runs,
                on_done=lambda _: progress.update(1) if progress is not None else None,
            )
            _say(summary_line(run))


def summary_line(run: RunResult) -> str:
    """One line per finished level, for the console."""
    s = run.stats
    ttft = "-" if s.median_ttft_ms is None else f"{s.median_ttft_ms:.0f}"
    tpot = "-" if s.median_tpot_ms is None else f"{s.median_tpot_ms:.1f}"
    return (
        f"bench: {run.label} c={run.max_concurrency}: {s.completed} ok, {s.failed} failed, "
        f"TTFT p50 {ttft} ms, TPOT p50 {tpot} ms, {s.output_throughput:.1f} out tok/s"
    )


def _say(text: str) -> None:
    tqdm.write(text, file=sys.stderr)


def _describe(progress: Any, text: str) -> None:
    if progress is not None:
        progress.set_description(text)


def new_progress(total: int) -> Any:
    """A tqdm bar on stderr counting requests (disabled when stderr is not a terminal)."""
    return tqdm(total=total, unit="req", file=sys.stderr, disable=None, dynamic_ncols=True)


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
