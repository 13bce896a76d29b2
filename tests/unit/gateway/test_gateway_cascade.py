"""The cascade through the real gateway: a prompt in the first stage's band is decided by the
second stage, which x-route-reason names; without a usable second stage the first serves."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config import hash_key

ROOT = Path(__file__).resolve().parents[3]
WEIGHTS = ROOT / "classifier" / "weights"
ADMIN = "cascade-admin-key"


def _policy(two_tier_policy: Any, band: Path) -> str:
    # A band as wide as it can be: every prompt goes to the second stage.
    second = f"{{weights: {band}, threshold: 0.5, sure_tolerant: 0.0001, sure_precise: 0.9999}}"
    model = (
        f"{{weights: {WEIGHTS / 'prompt-model-v4.json'}, threshold: 0.17, second_stage: {second}}}"
    )
    return str(two_tier_policy(classes=f"{{model: {model}}}"))


def _ask(client: httpx.Client, gateway: str, text: str) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": text}]}
    headers = {"Authorization": f"Bearer {ADMIN}"}  # an operator sees x-route-reason
    answer = client.post(f"{gateway}/v1/chat/completions", json=body, headers=headers)
    assert answer.status_code == 200, answer.text
    return answer


def test_the_second_stage_decides_the_band_and_says_so(
    stub: Any, start_gateway: Any, client: httpx.Client, two_tier_policy: Any
) -> None:
    policy = _policy(two_tier_policy, WEIGHTS / "band-model-v2.json")
    gateway = start_gateway(
        stub.url, stub.url, policy_path=policy, admin_key_hashes=[hash_key(ADMIN)]
    )
    poem = _ask(client, gateway, "Write a short poem about autumn in Paris.")
    assert poem.headers["x-route-class"] == "tolerant"
    assert poem.headers["x-route-reason"].startswith("tolerant: stage 2 p(precise) 0.")
    assert "(band-model v2); stage 1 p(precise)" in poem.headers["x-route-reason"]
    code = _ask(client, gateway, "How do I sort a list in Java?")
    assert code.headers["x-route-class"] == "code"
    assert code.headers["x-route-reason"].startswith("code: stage 2 p(precise) ")


def test_without_a_usable_second_stage_the_first_serves(
    stub: Any,
    start_gateway: Any,
    client: httpx.Client,
    two_tier_policy: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = tmp_path / "band.json"
    broken.write_text('{"format": "model-optimizer/band-model", "format_version": 1}')
    policy = _policy(two_tier_policy, broken)
    with caplog.at_level(logging.WARNING, logger="gateway.request.classify.second_stage"):
        gateway = start_gateway(
            stub.url, stub.url, policy_path=policy, admin_key_hashes=[hash_key(ADMIN)]
        )
        poem = _ask(client, gateway, "Write a short poem about autumn in Paris.")
    assert poem.headers["x-route-reason"].startswith("tolerant: p(precise) 0.")
    assert "< 0.17 (prompt-model v4" in poem.headers["x-route-reason"]
    lines = [r for r in caplog.records if r.name == "gateway.request.classify.second_stage"]
    assert lines and all("the first stage serves alone" in r.getMessage() for r in lines)
