"""The live guard (gateway/control/live_guard.py): pure windows, and through a gateway whose
served tier answers badly (stub tiers)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.config import hash_key
from gateway.control.live_guard import GuardSettings, LiveGuard, per_who_cap
from gateway.policy.schema import PolicyError, parse_policy
from tests.integration.conftest import wait_until
from tests.unit.gateway.conftest import StubTier
from tests.unit.gateway.control.test_gateway_shadow import metric_values

SETTINGS = GuardSettings(window=4, min_samples=3, floors={"tolerant": 0.5})


def test_a_tier_is_withheld_once_its_window_mean_drops_below_the_floor() -> None:
    guard = LiveGuard()
    assert not guard.record(SETTINGS, "int4", "tolerant", 0.2)
    assert not guard.record(SETTINGS, "int4", "tolerant", 0.3)  # 2 < min_samples
    assert guard.record(SETTINGS, "int4", "tolerant", 0.4)  # mean 0.3 < 0.5
    assert guard.classes_withheld("int4") == {"tolerant"}
    assert not guard.record(SETTINGS, "int4", "tolerant", 0.1)  # already withheld
    assert guard.restore("int4") == ["tolerant"]
    assert guard.classes_withheld("int4") == frozenset() and guard.samples("int4", "tolerant") == 0


def test_good_answers_keep_a_tier_and_unguarded_classes_are_ignored() -> None:
    guard = LiveGuard()
    for score in (0.9, 0.8, 0.1, 0.9, 0.9):  # one bad answer in a good window
        assert not guard.record(SETTINGS, "int8", "tolerant", score)
    for _ in range(10):
        assert not guard.record(SETTINGS, "int8", "code", 0.0)  # no floor for code
    assert guard.classes_withheld("int8") == frozenset()


def test_the_window_forgets_old_answers() -> None:
    guard = LiveGuard()
    for score in (0.0, 1.0, 1.0, 1.0, 1.0):  # window 4: the zero is gone at the end
        assert not guard.record(SETTINGS, "t", "tolerant", score)
    assert guard.mean("t", "tolerant") == 1.0


def test_one_asker_failing_again_and_again_does_not_move_the_class_many_do() -> None:
    """Issue 35, item 16: one asker's failing samples count at most ``per_who``."""
    capped = GuardSettings(window=10, min_samples=4, floors={"tolerant": 0.5}, per_who=2)
    guard = LiveGuard()
    for _ in range(50):  # one tenant asking for degenerate answers on purpose
        assert not guard.record(capped, "int4", "tolerant", 0.0, "escalation", "key:a")
    assert guard.samples("int4", "tolerant", "escalation") == 2
    for _ in range(20):  # everyone else's answers are fine: the class keeps its tier
        assert not guard.record(capped, "int4", "tolerant", 1.0, "escalation", "key:b")
    assert not guard.record(capped, "int4", "tolerant", 0.0, "escalation", "key:a")
    assert guard.classes_withheld("int4") == frozenset()
    tripped = [
        guard.record(capped, "int8", "tolerant", 0.0, "escalation", f"key:{i}") for i in range(4)
    ]
    assert tripped == [False, False, False, True]  # many tenants' failures: withheld
    uncapped = GuardSettings(window=10, min_samples=4, floors={"tolerant": 0.5})
    assert [guard.record(uncapped, "fp16", "tolerant", 0.0, "escalation", "key:a")
            for _ in range(4)] == [False, False, False, True]  # fmt: skip


def test_one_asker_alone_never_reaches_the_rate_that_trips() -> None:
    for max_rate, min_samples in ((0.5, 4), (0.2, 20), (0.3, 7), (0.01, 20)):
        cap = per_who_cap(max_rate, min_samples)
        assert cap >= 1 and (cap / min_samples <= max_rate or cap == 1)


def test_the_policy_checks_guard_classes_and_floors() -> None:
    base = "tiers: [t0]\nroutes: {tolerant: [t0], code: [t0], math: [t0], long: [t0]}\n"
    policy = parse_policy(base + "shadow: {guard: {floors: {tolerant: 0.4}}}\n")
    assert policy.shadow.guard.floors == {"tolerant": 0.4}
    with pytest.raises(PolicyError, match="unknown class chat"):
        parse_policy(base + "shadow: {guard: {floors: {chat: 0.4}}}\n")
    with pytest.raises(PolicyError, match=r"within 0\.\.1"):
        parse_policy(base + "shadow: {guard: {floors: {code: 1.5}}}\n")


def test_a_tier_answering_badly_is_taken_out_of_the_class_until_restored(
    tmp_path: Path,
    make_stub: Callable[[], StubTier],
    start_gateway: Callable[..., str],
    client: httpx.Client,
) -> None:
    reference, served = make_stub(), make_stub()
    served.answer_text = "L'Étoile, la Marseur, la France, la France, la France."
    policy = tmp_path / "routing.yaml"
    shadow = {
        "fraction": 1.0,
        "tiers": ["t1"],
        "reference": "t0",
        "max_concurrent": 8,
        "max_gateway_load": 1.0,
        "guard": {"window": 5, "min_samples": 3, "floors": {"tolerant": 0.5}},
    }
    policy.write_text(
        "tiers: [t0, t1]\n"
        "routes: {tolerant: [t1, t0], code: [t1], math: [t1], long: [t1]}\n"
        f"shadow: {json.dumps(shadow)}\n"
    )
    gateway = start_gateway(
        reference.url,
        served.url,
        policy_path=str(policy),
        metrics_interval=0.2,
        admin_key_hashes=[hash_key("guard-admin")],
    )
    admin = {"Authorization": "Bearer guard-admin"}
    body = {"messages": [{"role": "user", "content": "Capital of France?"}], "temperature": 0}
    for _ in range(3):
        answer = client.post(f"{gateway}/v1/chat/completions", json=body)
        assert answer.headers["x-route-tier"] == "t1"
    trips = "gateway_live_guard_trips_total{class=tolerant,tier=t1}"
    wait_until(lambda: metric_values(client, gateway).get(trips), 10)
    tiers = client.get(f"{gateway}/admin/tiers", headers=admin).json()["tiers"]
    assert tiers["t1"]["withheld"] == ["tolerant"]
    answer = client.post(f"{gateway}/v1/chat/completions", json=body)
    assert answer.status_code == 200 and answer.headers["x-route-tier"] == "t0"
    restored = client.post(f"{gateway}/admin/tiers/t1/restore", headers=admin).json()
    assert restored == {"tier": "t1", "restored": ["tolerant"]}
    assert client.post(f"{gateway}/v1/chat/completions", json=body).headers["x-route-tier"] == "t1"
