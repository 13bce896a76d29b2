"""The cascade's second stage: the band, the reason, a missing or corrupt model, and the bound.

A tiny first-stage weights file (as in test_gateway_classify_model.py) and a tiny band-model
file make the arithmetic known; the flood tests use a slow stand-in model.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path

import pytest

from common.band_features import band_buckets
from common.class_categories import CODE, TOLERANT
from gateway.policy.classes import SecondStageRule
from gateway.policy.schema import PolicyError, parse_policy
from gateway.request.classify.band_model import BandModel
from gateway.request.classify.classes import CompiledClasses, classify_request
from gateway.request.classify.second_stage import SecondStage, settle

FIRST = {
    "format": "model-optimizer/prompt-model",
    "format_version": 1,
    "name": "tiny",
    "version": 1,
    "window": {"head_chars": 200, "tail_chars": 100},
    "precise": {"bias": -2.0, "weights": {"w:python": 6.0, "w:maybe": 2.0, "w:poem": -6.0}},
    "code": {"bias": 0.0, "weights": {"w:python": 5.0}},
}
BITS = 12
ROUTES = "tiers: [t]\nroutes: {tolerant: [t], code: [t], math: [t], long: [t]}\n"


def _band_file(path: Path, word: str, weight: float) -> None:
    """A band model whose only weight is ``word``'s."""
    bucket = band_buckets(word, 200, 100, BITS)
    only = {str(b): weight for b in bucket}
    path.write_text(
        json.dumps(
            {
                "format": "model-optimizer/band-model",
                "format_version": 1,
                "name": "tiny-band",
                "version": 1,
                "window": {"head_chars": 200, "tail_chars": 100},
                "bits": BITS,
                "bias": -1.0,
                "weights": only,
            }
        )
    )


def _rules(tmp_path: Path, band: str = "band.json", **extra: float) -> CompiledClasses:
    (tmp_path / "tiny.json").write_text(json.dumps(FIRST))
    second = {"weights": band, "threshold": 0.5, "sure_tolerant": 0.05, "sure_precise": 0.9}
    second.update(extra)
    text = (
        ROUTES
        + "classes:\n  long: {min_tokens: 1000}\n"
        + f"  model: {{weights: tiny.json, threshold: 0.5, second_stage: {json.dumps(second)}}}\n"
    )
    policy = parse_policy(text, str(tmp_path / "p.yaml"))
    return CompiledClasses.build(policy.classes, tmp_path)


def _body(text: str) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": text}]}


def test_sure_prompts_are_decided_by_the_first_stage(tmp_path: Path) -> None:
    _band_file(tmp_path / "band.json", "maybe", 8.0)
    rules = _rules(tmp_path)
    sure = classify_request(_body("python python"), 10, rules)
    assert sure.cls == CODE and sure.band is None
    assert sure.reason.startswith("code: stage 1 p(precise) 0.904 >= 0.9 sure (tiny v1: +python)")
    poem = classify_request(_body("a poem"), 10, rules)
    assert poem.cls == TOLERANT and poem.band is None and "< 0.05 sure" in poem.reason


def test_the_band_goes_to_the_second_stage_which_names_itself(tmp_path: Path) -> None:
    _band_file(tmp_path / "band.json", "maybe", 8.0)
    rules = _rules(tmp_path)
    first = classify_request(_body("maybe"), 10, rules)  # logit 0: p 0.5, in [0.05, 0.9)
    assert first.band is not None and first.cls == CODE  # the cautious answer until settled
    found = asyncio.run(settle(first.band))
    assert found.cls == CODE
    assert found.reason.startswith("code: stage 2 p(precise) 1.000 >= 0.5 (tiny-band v1)")
    assert "(tiny-band v1); stage 1 p(precise) 0.500 in band [0.05, 0.9)" in found.reason
    other = classify_request(_body("hello there"), 10, rules)  # p 0.12: in the band
    assert other.band is not None
    settled = asyncio.run(settle(other.band))
    assert settled.cls == TOLERANT and settled.reason.startswith("tolerant: stage 2 p(precise)")


@pytest.mark.parametrize("content", [None, "{not json", '{"format": "other"}'])
def test_a_missing_or_corrupt_second_stage_leaves_the_first_serving(
    tmp_path: Path, content: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    if content is not None:
        (tmp_path / "band.json").write_text(content)
    with caplog.at_level(logging.WARNING):
        rules = _rules(tmp_path)
    lines = [r for r in caplog.records if r.name == "gateway.request.classify.second_stage"]
    assert len(lines) == 1 and "band.json" in lines[0].getMessage()
    assert "\n" not in lines[0].getMessage()
    assert rules.second is None and rules.model is not None
    found = classify_request(_body("maybe"), 10, rules)  # the first stage at its threshold
    assert found.band is None and found.reason.startswith("code: p(precise) 0.500 >= 0.5")


def test_the_band_must_be_ordered(tmp_path: Path) -> None:
    _band_file(tmp_path / "band.json", "maybe", 8.0)
    with pytest.raises(PolicyError, match="sure_tolerant must be below sure_precise"):
        _rules(tmp_path, sure_tolerant=0.9, sure_precise=0.5)


class _Slow:
    """A stand-in model: each call waits ``seconds`` (off the loop, like a real model's work)."""

    label = "slow v1"

    def __init__(self, seconds: float) -> None:
        self.seconds, self.calls, self.running, self.most = seconds, 0, 0, 0
        self._lock = threading.Lock()

    def p_precise(self, text: str) -> float:
        with self._lock:
            self.calls += 1
            self.running += 1
        time.sleep(self.seconds)
        with self._lock:
            self.most = max(self.most, self.running)
            self.running -= 1
        return 0.0


def _stage(model: _Slow, pending: int, budget_ms: float) -> SecondStage:
    rule = SecondStageRule(
        weights="x", threshold=0.5, sure_tolerant=0.1, sure_precise=0.9,
        max_pending=pending, budget_ms=budget_ms,
    )  # fmt: skip
    return SecondStage(model, rule)  # type: ignore[arg-type]


def test_a_flood_keeps_the_bound_and_the_loop(tmp_path: Path) -> None:
    model = _Slow(0.02)
    stage = _stage(model, pending=2, budget_ms=1000)

    async def flood() -> tuple[list[float | None], float]:
        lags: list[float] = []

        async def ticker() -> None:
            for _ in range(20):
                start = time.perf_counter()
                await asyncio.sleep(0.005)
                lags.append(time.perf_counter() - start - 0.005)

        tick = asyncio.create_task(ticker())
        answers = await asyncio.gather(*(stage.p_precise(f"p{i}") for i in range(200)))
        await tick
        return answers, max(lags)

    answers, lag = asyncio.run(flood())
    assert model.calls == 2  # two slots: the other 198 keep the cautious answer at once
    assert answers.count(None) == 198 and model.most == 1  # one thread
    assert lag < 0.05  # the loop kept turning while the model worked
    assert stage._slots.acquire(blocking=False)  # the slots came back


def test_a_late_answer_keeps_precise_within_the_budget() -> None:
    model = _Slow(0.3)
    stage = _stage(model, pending=4, budget_ms=20)

    async def late() -> tuple[float | None, float]:
        start = time.perf_counter()
        answer = await stage.p_precise("anything")
        return answer, time.perf_counter() - start

    answer, took = asyncio.run(late())
    assert answer is None and took < 0.2


def test_band_model_weights_outside_the_buckets_are_refused(tmp_path: Path) -> None:
    _band_file(tmp_path / "band.json", "maybe", 1.0)
    data = json.loads((tmp_path / "band.json").read_text())
    data["weights"] = {str(1 << BITS): 1.0}
    (tmp_path / "band.json").write_text(json.dumps(data))
    with pytest.raises(Exception, match="outside"):
        BandModel.load(tmp_path / "band.json")
