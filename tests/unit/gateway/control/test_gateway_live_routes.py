"""Routes on live figures (gateway/control/live_routes.py, gateway/policy/live.py): the factor
from plain samples, the figures it scales, and the routes moving away from a tier made slow and
back once it is not."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.control.live_figures import Sample
from gateway.control.live_routes import LiveRoutes, live_factor, rounded
from gateway.policy.derive import TierFigures, apply_factors
from gateway.policy.live import LiveRoutesPolicy
from gateway.policy.store import PolicyStore

ON = LiveRoutesPolicy(enabled=True, recent_s=120, hold_s=900, min_samples=8)
# Per-prompt scatter of a calibration on a busy machine (shared by tiers measured back to back).
LOAD = [1.00, 1.12, 0.95, 1.30, 1.02, 0.98, 1.45, 1.05]


def stream(at: float, tpot: float) -> Sample:
    return Sample(at, "http://a", 1, 50, 0.05, tpot, None)


def spread(tpot: float, n: int, at: float) -> list[Sample]:
    """``n`` answers around ``tpot`` (+-4 %), the last at ``at``, one a second before."""
    wobble = [1.0, 1.04, 0.96, 1.02, 0.98, 1.03, 0.97, 1.01, 0.99]
    return [stream(at - i, tpot * wobble[i % len(wobble)]) for i in range(n)]


def tier(name: str, quality: float, tpot: float) -> TierFigures:
    cats = {"chat": quality, "code": quality, "math": quality}
    return TierFigures(name, cats, 0.05, tpot, 1 / tpot,
                       ttfts_s=tuple(0.05 * x for x in LOAD),
                       tpots_s=tuple(tpot * x for x in LOAD))  # fmt: skip


def test_a_tier_as_fast_as_calibrated_keeps_factor_one() -> None:
    found = live_factor(spread(0.020, 12, 1000.0), 0.020, 1000.0, ON)
    assert found is not None and found.factor == 1.0 and found.recent and found.n == 12


def test_a_tier_twice_as_slow_as_calibrated_gets_its_ratio() -> None:
    found = live_factor(spread(0.040, 12, 1000.0), 0.020, 1000.0, ON)
    assert found is not None and abs(found.factor - 2.0) < 0.05


def test_too_few_answers_leave_the_calibration_and_old_ones_are_held_then_dropped() -> None:
    assert live_factor(spread(0.040, 5, 1000.0), 0.020, 1000.0, ON) is None
    # No answer in the last 120 s, some within 900 s: their factor is held.
    held = live_factor(spread(0.040, 12, 1000.0), 0.020, 1000.0 + 300, ON)
    assert held is not None and not held.recent and held.factor > 1.9
    assert live_factor(spread(0.040, 12, 1000.0), 0.020, 1000.0 + 1000, ON) is None


def test_scaled_figures_keep_their_pairs_and_quality() -> None:
    figures = {"fp16": tier("fp16", 1.0, 0.030), "int4": tier("int4", 0.8, 0.015)}
    out = apply_factors(figures, {"int4": 2.0})
    assert out["fp16"] is figures["fp16"]
    assert out["int4"].tpot_s == 0.030 and out["int4"].quality == figures["int4"].quality
    assert out["int4"].tpots_s == tuple(2 * t for t in figures["int4"].tpots_s if t is not None)


POLICY = """\
tiers: [fp16, int8, int4]
routes:
  tolerant: {tiers: [int4, int8, fp16], derive: {floor: 0.6}}
  code: [fp16, int8]
  math: [fp16, int8]
  long: [fp16, int8, int4]
live_routes: {enabled: true, interval_s: 1, recent_s: 120, hold_s: 900, min_samples: 8}
"""


class Live:
    """The live figures' windows, as the runtime holds them."""

    def __init__(self) -> None:
        self.samples: dict[str, list[Sample]] = {}
        self.clock = lambda: 0.0

    def windows(self) -> dict[str, list[Sample]]:
        return self.samples


class FakeRuntime:
    def __init__(self, store: PolicyStore, live: Live) -> None:
        self.policies, self.live = store, live


def test_the_routes_move_away_from_a_tier_made_slow_and_come_back_when_it_recovers(
    tmp_path: Path,
) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(POLICY)
    figures = {"fp16": tier("fp16", 1.0, 0.030), "int4": tier("int4", 0.8, 0.015)}
    store = PolicyStore(path, measured=figures, reference="fp16")
    store.load()
    live, now = Live(), [1000.0]
    loop = LiveRoutes(FakeRuntime(store, live), clock=lambda: now[0])  # type: ignore[arg-type]

    def first() -> str:
        return store.active.policy.routes.tolerant.tiers[0]

    async def main() -> list[tuple[bool, str]]:
        seen = [(await loop.tick(), first())]  # no traffic yet: calibration, int4 first
        live.samples["int4"] = spread(0.015, 12, now[0])  # as calibrated
        seen.append((await loop.tick(), first()))
        live.samples["int4"] = spread(0.040, 12, now[0])  # throttled: 2.7x slower
        seen.append((await loop.tick(), first()))
        now[0] += 300  # no traffic reaches int4 now: its factor is held
        seen.append((await loop.tick(), first()))
        now[0] += 60
        live.samples["int4"] += spread(0.015, 12, now[0])  # recovered (an operator's pin, a probe)
        seen.append((await loop.tick(), first()))
        return seen

    seen = asyncio.run(main())
    assert seen[0] == (False, "int4") and seen[1] == (False, "int4")
    assert seen[2] == (True, "fp16")  # moved away, within one look
    assert seen[3] == (False, "fp16")  # held, not back while nothing says it recovered
    assert seen[4] == (True, "int4")  # back
    changes = [c for c in store.history.changes() if c.cls == "tolerant"]
    assert "live figures: int4 x" in changes[-2].reason


def test_factors_are_rounded_and_a_factor_of_one_is_left_out() -> None:
    found = {
        "int4": live_factor(spread(0.040, 12, 0.0), 0.020, 0.0, ON),
        "int8": live_factor(spread(0.020, 12, 0.0), 0.020, 0.0, ON),
    }
    assert rounded({k: v for k, v in found.items() if v is not None}).keys() == {"int4"}
