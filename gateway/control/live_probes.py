"""Probes of a tier the live routes moved away from: how it finds out that the tier recovered.

A tier whose live figures made it slower than calibrated (gateway/control/live_routes.py) gets
no traffic once the routes move away from it, so nothing would tell that it is fast again but
the end of its hold (``hold_s``, 15 minutes by default). With ``live_routes.probe_s`` set, the
live routes' loop sends such a tier — one with a factor above 1 in the routes now, and no
answer in the last ``probe_s`` seconds — ``min_samples`` short streamed requests, one at a
time, at most once every ``probe_s`` seconds. Their answers go into the tier's live figures as
any answer does (``LiveFigures.observe``), and the tier's factor is then judged on the answers
from the probe on (the older ones tell of the tier before it was probed): as calibrated, the
factor goes back to 1 and the routes are derived again in the same look; still slow, the tier
stays where it is until the next probe. A probe that got fewer than ``min_samples`` answers
changes nothing (the tier keeps its held factor).

A probe is what the calibration asks (measure/loadgen.py: ``/v1/completions``, greedy,
``ignore_eos``, exactly ``probe_tokens`` tokens), alone on that tier: its per-token time is the
figure the calibration's is. A probe costs ``min_samples x probe_tokens`` decode steps of an
otherwise idle tier per ``probe_s`` (8 x 16 tokens a minute by default); none is sent to a tier
that is not ready.

``probes_due`` is pure; ``probe_tier`` is the I/O (one endpoint, its own short-lived client,
as the measurements' runs: gateway/control/measurement_run.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from gateway.control.live_figures import Answered
from gateway.policy.live import LiveRoutesPolicy
from measure import vllm_client
from measure.loadgen import Prompt, one_request

PROBE_PROMPT = Prompt("Count from one to one hundred, in words, separated by commas:", 0)


def probes_due(
    applied: Mapping[str, float],
    latest: Mapping[str, float],
    last_probe: Mapping[str, float],
    now: float,
    settings: LiveRoutesPolicy,
) -> list[str]:
    """The tiers to probe now: slowed in the routes (factor > 1), with no answer (``latest``:
    the time of each tier's newest) and no probe in the last ``probe_s`` (None: none)."""
    if settings.probe_s is None:
        return []
    never = float("-inf")
    return [
        tier
        for tier, factor in sorted(applied.items())
        if factor > 1.0
        and now - latest.get(tier, never) >= settings.probe_s
        and now - last_probe.get(tier, never) >= settings.probe_s
    ]


async def probe_tier(
    tier: str, url: str, api_key: str | None, settings: LiveRoutesPolicy, timeout: float = 60.0
) -> list[Answered]:
    """``min_samples`` probes of ``url``, one after another; the answers as the live figures
    take them (a failed probe is left out: it says nothing of the tier's speed)."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else None
    answers = []
    async with httpx.AsyncClient(timeout=timeout, trust_env=False, headers=headers) as client:
        model = await vllm_client.served_model(client, url)
        for _ in range(settings.min_samples):
            result = await one_request(client, url, model, PROBE_PROMPT, settings.probe_tokens)
            if not result.success or result.output_tokens < 2:
                continue
            answers.append(
                Answered(
                    tier=tier,
                    status=200,
                    duration=result.latency,
                    ttft=result.ttft,
                    sent=0.0,
                    input_tokens=result.prompt_len or None,
                    output_tokens=result.output_tokens,
                    load=1,
                    endpoint=url,
                )
            )
    return answers
