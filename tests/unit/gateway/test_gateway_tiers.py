from gateway.config import TierEndpoint
from gateway.tiers import available_tiers

TIERS = [
    TierEndpoint(name=n, base_url=f"http://127.0.0.1:{p}")
    for n, p in (("fp16", 1), ("int8", 2), ("int4", 3))
]


def test_without_states_every_tier_is_a_candidate() -> None:
    assert available_tiers(TIERS, None) == TIERS


def test_only_ready_tiers_in_order() -> None:
    states = {"fp16": "draining", "int8": "ready", "int4": "ready"}
    assert [t.name for t in available_tiers(TIERS, states)] == ["int8", "int4"]


def test_unknown_or_down_tiers_are_skipped() -> None:
    assert available_tiers(TIERS, {"fp16": "down", "int8": "starting"}) == []
