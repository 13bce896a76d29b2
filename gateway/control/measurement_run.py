"""One measurement run: the in-engine admission check and the speed calibration of one
endpoint per tier (tier -> URL, the reference among them), with measure/'s own code.

``measure_run`` calls ``measure.admission_run.check_tiers`` (every tier against the reference,
on the held-aside probes of optimizer/data/probes.jsonl and the factual probes of
measure/data/admission_facts.jsonl) and then ``measure.speed.measure_tiers`` (the calibration
``up`` runs: prompts alone interleaved across the tiers, then a little load). It raises
``RunFailed`` when the figures cannot be trusted whole: the reference answers wrong, a tier
stops answering mid-run, a calibration request fails. Nothing partial comes out of a run:
the caller keeps the last good figures.

``run_figures`` (pure) turns a check and a calibration into what the shared record takes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from gateway.config import MeasuredTier, MeasurementConfig
from measure import vllm_client
from measure.admission import AdmissionProbe, load_facts
from measure.admission_run import CheckOptions, CheckResult, check_tiers
from measure.speed import SpeedOptions, TierSpeed, measure_tiers

# The precision check's held-aside probes (category, text), read as data: the gateway does not
# import the optimizer package.
SHIPPED_PROBES = Path(__file__).resolve().parents[2] / "optimizer" / "data" / "probes.jsonl"
EVERY_CATEGORY = {"chat": 1.0, "code": 1.0, "math": 1.0}


class RunFailed(Exception):
    """A run whose figures cannot be used; ``str()`` is one line saying why."""


@dataclass(frozen=True)
class RunTarget:
    """What a run needs to know of the tiers beyond their URLs."""

    tiers: Mapping[str, str]  # tier -> the endpoint measured
    engines: Mapping[str, str]  # tier -> vllm | llama.cpp
    emulated: frozenset[str]  # tiers served emulated (the reference's arithmetic)
    api_key: str | None
    tokenizer_dir: Path | None  # the calibration's prompts are made with it


@dataclass(frozen=True)
class RunFigures:
    tiers: dict[str, MeasuredTier]
    classes: dict[str, list[str] | None]  # tier -> admitted classes (None: every class)
    verdicts: dict[str, tuple[bool, str]]  # tier -> (passed, the verdict's line)


def check_probes(path: str | Path | None = None) -> list[AdmissionProbe]:
    """The held-aside probes (JSONL ``{"category", "text"}``) and the factual probes."""
    file = Path(path) if path is not None else SHIPPED_PROBES
    probes = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict) or not all(
            isinstance(row.get(k), str) and row[k].strip() for k in ("category", "text")
        ):
            raise ValueError(f"{file}:{number}: needs string fields category and text")
        probes.append(AdmissionProbe(row["category"], row["text"]))
    return [*probes, *load_facts()]


def speed_options(settings: MeasurementConfig) -> SpeedOptions:
    return SpeedOptions(
        input_len=settings.speed_input_len,
        output_len=settings.speed_output_len,
        requests=settings.speed_requests,
        concurrency=settings.speed_concurrency,
    )


async def measure_run(
    target: RunTarget, settings: MeasurementConfig, probes: Sequence[AdmissionProbe]
) -> RunFigures:
    """The check, then the calibration, of ``target.tiers`` (see the module docstring)."""
    if target.tokenizer_dir is None:
        raise RunFailed("the calibration needs the gateway's tokenizer_dir")
    headers = {"authorization": f"Bearer {target.api_key}"} if target.api_key else None
    opts = CheckOptions(
        tiers=dict(target.tiers),
        reference=settings.reference,
        floors=dict(settings.floors),
        max_tokens=settings.max_tokens,
        modes={t: "emulated" for t in target.emulated},
        engines=dict(target.engines),
        timeout=settings.run_timeout_s,
        api_key=target.api_key,
    )
    reference_url = target.tiers[settings.reference]
    try:
        async with httpx.AsyncClient(
            timeout=settings.run_timeout_s, trust_env=False, headers=headers
        ) as client:
            check = await check_tiers(client, opts, probes)
            model = await vllm_client.served_model(client, reference_url)
        if check.reference_problems:
            raise RunFailed(f"the reference answers wrong: {check.reference_problems[0]}")
        speeds = await measure_tiers(
            dict(target.tiers), model, target.tokenizer_dir, speed_options(settings), headers
        )
    except RunFailed:
        raise
    except Exception as exc:  # any tier's fault mid-run: httpx, a refused probe, a bad answer
        raise RunFailed(" ".join(f"{type(exc).__name__}: {exc}".split())[:300]) from None
    return run_figures(check, speeds, target.emulated)


def run_figures(
    check: CheckResult, speeds: Mapping[str, TierSpeed], emulated: frozenset[str]
) -> RunFigures:
    """The shared record's part of one run (``RunFailed`` when a calibration request failed:
    a median over fewer prompts, unpaired across tiers, is not the figure it claims to be)."""
    failed = [f"{name} ({s.failed})" for name, s in speeds.items() if s.failed]
    if failed:
        raise RunFailed(f"calibration requests failed on {', '.join(failed)}")
    tiers, classes, verdicts = {}, {}, {}
    for name, speed in speeds.items():
        verdict = check.verdicts.get(name)
        quality = (
            {c.category: c.forced_agreement for c in verdict.categories}
            if verdict is not None
            else dict(EVERY_CATEGORY)
        )
        tiers[name] = MeasuredTier(
            quality=quality,
            ttft_s=speed.ttft_s,
            tpot_s=speed.tpot_s,
            throughput_tok_s=speed.throughput_tok_s,
            ttfts_s=list(speed.ttfts_s),
            tpots_s=list(speed.tpots_s),
            emulated=name in emulated,
            concurrency=speed.concurrency,
        )
        classes[name] = list(verdict.admitted_classes()) if verdict is not None else None
        verdicts[name] = (verdict.passed, verdict.summary()) if verdict else (True, "reference")
    return RunFigures(tiers, classes, verdicts)
