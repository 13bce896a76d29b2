"""Routes on live figures (gateway/control/live_routes.py, gateway/policy/live.py): the factor
from plain samples, the figures it scales, and the routes moving away from a tier made slow and
back once it is not."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.control.live_figures import Answered, Sample, sample_of
from gateway.control.live_probes import probe_tier, probes_due
from gateway.control.live_routes import (
    LiveFactor,
    LiveRoutes,
    LoadCurve,
    live_factor,
    relative_to_host,
    rounded,
)
from gateway.metrics import GatewayMetrics
from gateway.policy.derive import TierFigures, apply_factors
from gateway.policy.live import LiveRoutesPolicy
from gateway.policy.store import PolicyStore

ON = LiveRoutesPolicy(enabled=True, recent_s=120, hold_s=900, min_samples=8)
# Per-prompt scatter of a calibration on a busy machine (shared by tiers measured back to back).
LOAD = [1.00, 1.12, 0.95, 1.30, 1.02, 0.98, 1.45, 1.05]


def stream(at: float, tpot: float, load: int = 1) -> Sample:
    return Sample(at, "http://a", load, 50, 0.05, tpot, None)


def spread(tpot: float, n: int, at: float, load: int = 1) -> list[Sample]:
    """``n`` answers around ``tpot`` (+-4 %), the last at ``at``, one a second before."""
    wobble = [1.0, 1.04, 0.96, 1.02, 0.98, 1.03, 0.97, 1.01, 0.99]
    return [stream(at - i, tpot * wobble[i % len(wobble)], load) for i in range(n)]


def tier(name: str, quality: float, tpot: float) -> TierFigures:
    cats = {"chat": quality, "code": quality, "math": quality}
    return TierFigures(name, cats, 0.05, tpot, 1 / tpot,
                       ttfts_s=tuple(0.05 * x for x in LOAD),
                       tpots_s=tuple(tpot * x for x in LOAD))  # fmt: skip


def test_a_tier_as_fast_as_calibrated_keeps_factor_one() -> None:
    found = live_factor(spread(0.020, 12, 1000.0), LoadCurve(0.020), 1000.0, ON)
    assert found is not None and found.factor == 1.0 and found.recent and found.n == 12


def test_a_tier_twice_as_slow_as_calibrated_gets_its_ratio() -> None:
    found = live_factor(spread(0.040, 12, 1000.0), LoadCurve(0.020), 1000.0, ON)
    assert found is not None and abs(found.factor - 2.0) < 0.05


def test_the_load_curve_runs_from_alone_to_the_calibrations_concurrency_and_on() -> None:
    # Alone 20 ms/token; 4 at once gave 100 tokens/s in all: 40 ms/token each.
    figures = TierFigures("int4", {}, 0.05, 0.020, 100.0, concurrency=4)
    curve = LoadCurve.of(figures)
    assert curve.at(1) == 0.020 and abs(curve.at(4) - 0.040) < 1e-12
    assert abs(curve.at(2) - (0.020 + 0.020 / 3)) < 1e-12
    assert abs(curve.at(8) - 0.080) < 1e-12  # saturated: twice the requests, twice the time
    assert LoadCurve.of(TierFigures("x", {}, 0.05, 0.020, 0.0)).at(4) == 0.020  # no throughput


def test_a_tier_as_busy_as_calibrated_keeps_factor_one_and_is_judged_at_its_load() -> None:
    curve = LoadCurve.of(TierFigures("int4", {}, 0.05, 0.020, 100.0, concurrency=4))
    busy = spread(0.040, 12, 1000.0, load=4)  # 4 at once, as the calibration found them
    found = live_factor(busy, curve, 1000.0, ON)
    assert found is not None and found.factor == 1.0
    # Against the figure alone the same answers would look twice as slow.
    alone = live_factor(busy, LoadCurve(0.020), 1000.0, ON)
    assert alone is not None and abs(alone.factor - 2.0) < 0.05
    slowed = live_factor(spread(0.080, 12, 1000.0, load=4), curve, 1000.0, ON)
    assert slowed is not None and abs(slowed.factor - 2.0) < 0.05


def test_too_few_answers_leave_the_calibration_and_old_ones_are_held_then_dropped() -> None:
    assert live_factor(spread(0.040, 5, 1000.0), LoadCurve(0.020), 1000.0, ON) is None
    # No answer in the last 120 s, some within 900 s: their factor is held.
    held = live_factor(spread(0.040, 12, 1000.0), LoadCurve(0.020), 1000.0 + 300, ON)
    assert held is not None and not held.recent and held.factor > 1.9
    assert live_factor(spread(0.040, 12, 1000.0), LoadCurve(0.020), 1000.0 + 1000, ON) is None


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

    def __init__(self, clock: Callable[[], float] = lambda: 0.0) -> None:
        self.samples: dict[str, list[Sample]] = {}
        self.clock = clock

    def windows(self) -> dict[str, list[Sample]]:
        return self.samples

    def observe(self, answer: Answered) -> None:
        sample = sample_of(answer, self.clock())
        if sample is not None:
            self.samples.setdefault(answer.tier, []).append(sample)


async def no_probe(tier: str, settings: LiveRoutesPolicy) -> list[Answered]:
    return []


class FakeRuntime:
    def __init__(self, store: PolicyStore, live: Live) -> None:
        self.policies, self.live = store, live
        self.metrics = GatewayMetrics()


def test_the_routes_move_away_from_a_tier_made_slow_and_come_back_when_it_recovers(
    tmp_path: Path,
) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(POLICY)
    figures = {"fp16": tier("fp16", 1.0, 0.030), "int4": tier("int4", 0.8, 0.015)}
    store = PolicyStore(path, measured=figures, reference="fp16")
    store.load()
    live, now = Live(), [1000.0]
    loop = LiveRoutes(FakeRuntime(store, live), clock=lambda: now[0], prober=no_probe)  # type: ignore[arg-type]

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
        "int4": live_factor(spread(0.040, 12, 0.0), LoadCurve(0.020), 0.0, ON),
        "int8": live_factor(spread(0.020, 12, 0.0), LoadCurve(0.020), 0.0, ON),
    }
    assert rounded({k: v for k, v in found.items() if v is not None}).keys() == {"int4"}


def test_a_slowed_tier_without_answers_for_probe_s_is_probed_at_most_every_probe_s() -> None:
    settings = ON.model_copy(update={"probe_s": 60.0})
    assert probes_due({"int4": 2.0}, {"int4": 930.0}, {}, 1000.0, settings) == ["int4"]
    assert probes_due({"int4": 2.0}, {}, {}, 1000.0, settings) == ["int4"]  # no answer kept
    assert probes_due({"int4": 2.0}, {"int4": 950.0}, {}, 1000.0, settings) == []  # traffic
    assert probes_due({"int4": 2.0}, {"int4": 900.0}, {"int4": 950.0}, 1000.0, settings) == []
    assert probes_due({"int4": 2.0}, {"int4": 900.0}, {"int4": 940.0}, 1000.0, settings) == ["int4"]
    assert probes_due({"int4": 0.5}, {"int4": 900.0}, {}, 1000.0, settings) == []  # faster
    off = settings.model_copy(update={"probe_s": None})
    assert probes_due({"int4": 2.0}, {"int4": 900.0}, {}, 1000.0, off) == []


def test_factors_within_the_tolerance_of_one_are_left_out() -> None:
    found = {
        "int4": LiveFactor(1.04, 0.005, 300, True),
        "int8": LiveFactor(1.06, 0.006, 300, True),
        "fp16": LiveFactor(0.93, 0.009, 300, True),
    }
    assert rounded(found, 0.05) == {"int8": 1.06, "fp16": 0.93}
    assert rounded(found) == {"int4": 1.04, "int8": 1.06, "fp16": 0.93}


def probe_answers(tpot: float, n: int = 8) -> list[Answered]:
    """What ``probe_tier`` hands back: ``n`` answers of 16 tokens at ``tpot`` per token."""
    return [Answered("int4", 200, 0.05 + 15 * tpot, 0.05, 0.0, 12, 16, 1) for _ in range(n)]


def probing_loop(
    tmp_path: Path, speed: list[float], now: list[float], probed: list[float], n: int = 8
) -> tuple[PolicyStore, Live, LiveRoutes]:
    """Live routes over int4 (calibrated 15 ms/token) and fp16, whose prober answers ``n``
    probes at ``speed[0]`` per token and notes when it was called."""
    path = tmp_path / "routing.yaml"
    path.write_text(POLICY.replace("min_samples: 8}", "min_samples: 8, probe_s: 60}"))
    figures = {"fp16": tier("fp16", 1.0, 0.030), "int4": tier("int4", 0.8, 0.015)}
    store = PolicyStore(path, measured=figures, reference="fp16")
    store.load()
    live = Live(clock=lambda: now[0])

    async def prober(name: str, settings: LiveRoutesPolicy) -> list[Answered]:
        assert name == "int4" and settings.probe_tokens == 16
        probed.append(now[0])
        return probe_answers(speed[0], n)

    runtime = FakeRuntime(store, live)
    return store, live, LiveRoutes(runtime, clock=lambda: now[0], prober=prober)  # type: ignore[arg-type]


def test_probes_bring_a_recovered_tier_back_and_keep_a_slow_one_away(tmp_path: Path) -> None:
    now, speed, probed = [1000.0], [0.040], list[float]()
    store, live, loop = probing_loop(tmp_path, speed, now, probed)

    def first() -> str:
        return store.active.policy.routes.tolerant.tiers[0]

    async def main() -> list[tuple[bool, str]]:
        live.samples["int4"] = spread(0.040, 12, now[0])  # throttled: traffic tells
        seen = [(await loop.tick(), first())]
        now[0] += 40  # its last answer 40 s ago: not probed yet
        seen.append((await loop.tick(), first()))
        now[0] += 25  # 65 s: probed, still slow
        seen.append((await loop.tick(), first()))
        speed[0] = 0.015  # recovered
        now[0] += 35  # probed 35 s ago: not again yet
        seen.append((await loop.tick(), first()))
        now[0] += 30  # probed again: as calibrated, back in this look (the old answers aside)
        seen.append((await loop.tick(), first()))
        return seen

    seen = asyncio.run(main())
    assert seen == [(True, "fp16"), (False, "fp16"), (False, "fp16"), (False, "fp16"),
                    (True, "int4")]  # fmt: skip
    assert probed == [1065.0, 1130.0]
    assert not store.factors
    registry = loop.runtime.metrics.registry
    assert registry.get_sample_value("gateway_live_route_factor", {"tier": "int4"}) == 1.0
    judged = {"tier": "int4", "outcome": "judged"}
    assert registry.get_sample_value("gateway_live_probes_total", judged) == 2.0


def test_a_probe_the_tier_does_not_answer_keeps_the_tier_away(tmp_path: Path) -> None:
    now, speed, probed = [1000.0], [0.015], list[float]()
    store, live, loop = probing_loop(tmp_path, speed, now, probed, n=0)  # every probe failed

    async def main() -> list[str]:
        live.samples["int4"] = spread(0.040, 12, now[0])
        await loop.tick()
        seen = [store.active.policy.routes.tolerant.tiers[0]]
        now[0] += 70
        await loop.tick()
        return [*seen, store.active.policy.routes.tolerant.tiers[0]]

    assert asyncio.run(main()) == ["fp16", "fp16"]
    assert probed == [1070.0] and store.factors.get("int4", 1.0) > 2
    registry = loop.runtime.metrics.registry
    assert (registry.get_sample_value("gateway_live_route_factor", {"tier": "int4"}) or 0) > 2
    short = {"tier": "int4", "outcome": "short"}
    assert registry.get_sample_value("gateway_live_probes_total", short) == 1.0


def test_a_probe_is_the_calibrations_request_alone(make_stub: Callable[[], Any]) -> None:
    stub = make_stub()
    settings = ON.model_copy(update={"probe_tokens": 16, "min_samples": 4})
    answers = asyncio.run(probe_tier("int4", stub.url, "tier-secret", settings))
    assert len(answers) == 4 and len(stub.requests) == 4
    seen = stub.last_request
    body = seen["body"]
    assert seen["path"] == "/v1/completions"
    assert seen["headers"]["authorization"] == "Bearer tier-secret"
    assert body["max_tokens"] == 16 and body["ignore_eos"] is True and body["stream"] is True
    assert body["temperature"] == 0.0
    for answer in answers:
        sample = sample_of(answer, 0.0)
        assert answer.tier == "int4" and answer.load == 1 and answer.endpoint == stub.url
        assert sample is not None and sample.tpot is not None and sample.tpot > 0


def test_a_probe_of_a_tier_that_refuses_gives_nothing(make_stub: Callable[[], Any]) -> None:
    stub = make_stub()
    stub.mode = "unavailable"
    answers = asyncio.run(probe_tier("int4", stub.url, None, ON))
    assert answers == [] and len(stub.requests) == ON.min_samples


def test_busy_tiers_on_one_host_are_judged_against_their_median() -> None:
    alone, host = relative_to_host({"int4": LiveFactor(1.43, 0.01, 30, True)})
    assert host == 1.0 and alone["int4"].factor == 1.43  # one busy tier: nothing to compare
    found, host = relative_to_host(
        {"int4": LiveFactor(1.43, 0.01, 30, True), "int8": LiveFactor(1.56, 0.03, 30, True)}
    )
    assert abs(host - 1.495) < 1e-9 and rounded(found, 0.05) == {}
    throttled, host = relative_to_host(
        {
            "int4": LiveFactor(2.0, 0.01, 30, True),
            "int8": LiveFactor(1.0, 0.006, 30, True),
            "fp16": LiveFactor(1.0, 0.009, 8, True),
        }
    )
    assert host == 1.0 and rounded(throttled, 0.05) == {"int4": 2.0}
    held, host = relative_to_host(
        {
            "int4": LiveFactor(1.5, 0.01, 30, True),
            "int8": LiveFactor(1.5, 0.01, 30, True),
            "fp16": LiveFactor(3.0, 0.03, 30, False),
        }
    )
    assert host == 1.5 and held["fp16"].factor == 3.0 and held["int4"].factor == 1.0


MIXED = """\
tiers: [fp16, int8, int4]
routes:
  tolerant: {tiers: [int4, int8, fp16], derive: {floor: 0.6}}
  code: {tiers: [int8, fp16], derive: {floor: 0.9}}
  math: [fp16, int8]
  long: [fp16, int8, int4]
live_routes: {enabled: true, interval_s: 1, min_samples: 8, shared_host: SHARED}
"""


def test_two_busy_tiers_slowing_each_other_do_not_move_the_routes_on_a_shared_host(
    tmp_path: Path,
) -> None:
    """What bench_live_routes.py --steady found: chit-chat on int4 and code on int8 at once,
    each ~1.5x its calibration, the idle fp16 as calibrated; without the host's median the
    code route moved to fp16."""
    firsts = {}
    for shared in ("true", "false"):
        path = tmp_path / f"routing-{shared}.yaml"
        path.write_text(MIXED.replace("SHARED", shared))
        figures = {
            "fp16": tier("fp16", 1.0, 0.030),
            "int8": tier("int8", 0.97, 0.022),
            "int4": tier("int4", 0.8, 0.015),
        }
        store = PolicyStore(path, measured=figures, reference="fp16")
        store.load()
        live = Live(clock=lambda: 1000.0)
        live.samples["int4"] = spread(0.015 * 1.43, 30, 1000.0)
        live.samples["int8"] = spread(0.022 * 1.56, 30, 1000.0)
        loop = LiveRoutes(FakeRuntime(store, live), clock=lambda: 1000.0, prober=no_probe)  # type: ignore[arg-type]
        asyncio.run(loop.tick())
        firsts[shared] = store.active.policy.routes.code.tiers[0]
    assert firsts == {"true": "int8", "false": "fp16"}
