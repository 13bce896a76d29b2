"""The gateway's own measurements over a real gateway runtime (stub tiers, the real Redis for
two replicas, injected time; the run itself replaced by figures given here)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from gateway.app import create_app
from gateway.config import GatewayConfig, MeasuredTier, MeasurementConfig, TierEndpoint
from gateway.control.measurement import Measurement, describe, record_name
from gateway.control.measurement_run import RunFailed, RunFigures, RunTarget
from gateway.policy.route_changes import first_tiers
from gateway.runtime import Runtime
from gateway.shared.fenced import FencedValue
from gateway.shared.leader import LeaderLock
from model_optimizer.envs import ROOT

NOW = 1_800_000_000.0
TIERS = ("fp16", "int8", "int4")


def tier(tpot: float, quality: float = 0.95) -> MeasuredTier:
    jitter = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 1.03, 0.97]
    return MeasuredTier(
        quality={"chat": quality, "code": quality, "math": quality},
        ttft_s=0.1,
        tpot_s=tpot,
        throughput_tok_s=1 / tpot,
        ttfts_s=[0.1 * j for j in jitter],
        tpots_s=[tpot * j for j in jitter],
    )


# int8 clearly the fastest, int4 slower than the reference: tolerant goes to int8 first.
INT8_FAST = RunFigures(
    tiers={"fp16": tier(0.05, 1.0), "int8": tier(0.02), "int4": tier(0.06)},
    classes={"fp16": None, "int8": None, "int4": ["tolerant"]},
    verdicts={"fp16": (True, "reference"), "int8": (True, "ok"), "int4": (False, "code low")},
)


class Runs:
    """Stands in for the real run: records each target, answers as told."""

    def __init__(self, *answers: RunFigures | Exception) -> None:
        self.answers, self.targets = list(answers), []  # type: list[RunFigures | Exception], list[RunTarget]

    async def __call__(self, target: RunTarget) -> RunFigures:
        self.targets.append(target)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def config(urls: list[str], tmp_path: Path, **extra: Any) -> GatewayConfig:
    policy = tmp_path / "routing.yaml"
    policy.write_text((ROOT / "policies" / "routing.yaml").read_text())
    return GatewayConfig(
        model_name="stub-model",
        tiers=[TierEndpoint(name=n, base_url=u) for n, u in zip(TIERS, urls, strict=True)],
        policy_path=str(policy),
        watch_policy=False,
        metrics_interval=0.05,
        measurement=MeasurementConfig(quiet_for_s=0.0, quiet_max_rps=1000.0),
        **extra,
    )


Scenario = Callable[[list[Measurement], list[Runtime]], Awaitable[Any]]


def run_replicas(
    configs: list[GatewayConfig], runs: list[Runs], clock: list[float], scenario: Scenario,
    redis_url: str | None = None, lock_key: str = "test:measure-leader",
) -> Any:  # fmt: skip
    async def main() -> Any:
        async with AsyncExitStack() as stack:
            measurements, runtimes = [], []
            for cfg, run in zip(configs, runs, strict=True):
                app = create_app(cfg)
                await stack.enter_async_context(app.router.lifespan_context(app))
                runtime: Runtime = app.state.runtime
                lock = LeaderLock(redis_url, lock_key, ttl=30.0)
                await lock.start()
                stack.push_async_callback(lock.aclose)
                measurements.append(Measurement(runtime, lock, clock=lambda: clock[0], run=run))
                runtimes.append(runtime)
            return await scenario(measurements, runtimes)

    return asyncio.run(main())


def first_tier(runtime: Runtime, cls: str = "tolerant") -> str:
    return first_tiers(runtime.policies.active.policy)[cls]


@pytest.fixture
def stubs(make_stub: Any) -> list[str]:
    return [make_stub().url for _ in TIERS]


def test_at_start_every_endpoint_is_measured_and_the_routes_follow_the_figures(
    stubs: list[str], tmp_path: Path
) -> None:
    runs = Runs(INT8_FAST)

    async def scenario(ms: list[Measurement], rts: list[Runtime]) -> Any:
        before = first_tier(rts[0])
        measured = await ms[0].tick()
        again = await ms[0].tick()  # fresh figures: nothing more to measure
        return before, measured, again, first_tier(rts[0]), rts[0], describe(ms[0])

    before, measured, again, after, runtime, shown = run_replicas(
        [config(stubs, tmp_path)], [runs], [NOW], scenario
    )
    assert before == "int4"  # as written: no figures yet
    assert measured == [dict(zip(TIERS, stubs, strict=True))] and again == []
    assert after == "int8"
    assert runtime.board.classes("int4") == frozenset({"tolerant"})  # its verdict, applied
    changes = [c for c in runtime.policies.history.changes() if c.cls == "tolerant"]
    assert "figures measured by" in changes[-1].reason
    assert runtime.metrics.measurement_runs.labels("ok")._value.get() == 1
    assert shown is not None and shown["source"] == "gateway"  # GET /admin/routes' part
    assert sorted(e["tier"] for e in shown["endpoints"]) == sorted(TIERS)


def test_a_failed_or_interrupted_run_leaves_the_last_good_routes_serving(
    stubs: list[str], tmp_path: Path
) -> None:
    slower = RunFigures({**INT8_FAST.tiers, "int8": tier(0.09)}, INT8_FAST.classes, {})
    runs = Runs(INT8_FAST, RunFailed("tier int8 stopped answering mid-run"), slower)
    clock = [NOW]

    async def scenario(ms: list[Measurement], rts: list[Runtime]) -> Any:
        await ms[0].tick()
        clock[0] += 7 * 3600  # the schedule is due (quiet: the rate bound is high here)
        failed = await ms[0].tick()
        after_failure = first_tier(rts[0])
        soon = await ms[0].tick()  # within retry_s: not measured again yet
        clock[0] += 301
        retried = await ms[0].tick()
        return failed, after_failure, soon, retried, first_tier(rts[0]), rts[0]

    failed, after_failure, soon, retried, last, runtime = run_replicas(
        [config(stubs, tmp_path)], [runs], clock, scenario
    )
    assert failed == [] and after_failure == "int8"  # the last good routes
    assert runtime.metrics.measurement_runs.labels("failed")._value.get() == 1
    assert soon == [] and len(retried) == 1
    assert last != "int8"  # the retry's figures (int8 now slowest) moved the route


def test_up_figures_for_the_same_endpoints_are_not_measured_again_at_start(
    stubs: list[str], tmp_path: Path
) -> None:
    handed = config(stubs, tmp_path, measured=INT8_FAST.tiers, reference_tier="fp16",
                    measured_at=NOW - 60)  # fmt: skip
    runs = Runs(RunFailed("must not run"))

    async def scenario(ms: list[Measurement], rts: list[Runtime]) -> Any:
        measured = await ms[0].tick()
        text = await ms[0].value.read()
        return measured, text, first_tier(rts[0])

    measured, text, first = run_replicas([handed], [runs], [NOW], scenario)
    assert measured == [] and runs.targets == []
    assert '"source":"up"' in text  # the seed is the shared record now
    assert first == "int8"


def test_two_replicas_sharing_redis_route_on_the_figures_one_of_them_measured(
    stubs: list[str], tmp_path: Path, redis_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = config(stubs, tmp_path, redis_url=redis_url, redis_prefix=prefix)
    runs = [Runs(INT8_FAST), Runs(INT8_FAST)]

    async def scenario(ms: list[Measurement], rts: list[Runtime]) -> Any:
        a, b = ms
        before_b = first_tier(rts[1])
        await a.tick()  # leads and measures
        await b.tick()  # the lock is a's: b follows
        seen = (first_tier(rts[0]), first_tier(rts[1]), rts[1].board.classes("int4"))
        # A value that does not parse (written with a larger token): the last good routes stay.
        await FencedValue(rts[1].shared, record_name(cfg)).write("{broken", 10**9)
        with caplog.at_level(logging.WARNING):
            await b.tick()
            await b.tick()
        return before_b, seen, first_tier(rts[1]), b.applied is not None

    before_b, seen, after_bad, kept = run_replicas(
        [cfg, cfg], runs, [NOW], scenario, redis_url=redis_url, lock_key=f"{prefix}:leader"
    )
    assert before_b == "int4"
    assert seen == ("int8", "int8", frozenset({"tolerant"}))
    assert len(runs[0].targets) + len(runs[1].targets) == 1  # one replica measured
    assert after_bad == "int8" and kept
    assert len([r for r in caplog.records if "do not parse" in r.getMessage()]) == 1


def test_a_run_past_its_time_budget_is_interrupted_and_writes_nothing(
    stubs: list[str], tmp_path: Path
) -> None:
    class Stuck(Runs):
        async def __call__(self, target: RunTarget) -> RunFigures:
            self.targets.append(target)
            await asyncio.sleep(30)  # a calibration that never ends (a tier stalled)
            return INT8_FAST

    cfg = config(stubs, tmp_path)
    cfg = cfg.model_copy(
        update={"measurement": cfg.measurement.model_copy(update={"run_timeout_s": 0.3})}
    )

    async def scenario(ms: list[Measurement], rts: list[Runtime]) -> Any:
        measured = await ms[0].tick()
        return measured, await ms[0].value.read(), first_tier(rts[0]), rts[0]

    measured, text, first, runtime = run_replicas([cfg], [Stuck(INT8_FAST)], [NOW], scenario)
    assert measured == [] and text is None and first == "int4"  # as written, still
    assert runtime.metrics.measurement_runs.labels("failed")._value.get() == 1


def test_a_leader_that_loses_its_lock_mid_run_writes_nothing(
    stubs: list[str], tmp_path: Path
) -> None:
    class Slow(Runs):
        async def __call__(self, target: RunTarget) -> RunFigures:
            self.targets.append(target)
            await asyncio.sleep(5)  # long enough for a renewal to find the lock gone
            return INT8_FAST

    async def scenario(ms: list[Measurement], rts: list[Runtime]) -> Any:
        m = ms[0]
        m.lock = LeaderLock(None, "test:short-lease", ttl=0.3)  # renewed every 0.1 s

        async def lost() -> bool:
            return False  # another replica took the lock (its lease expired here)

        m.lock.renew = lost  # type: ignore[method-assign]
        measured = await m.tick()
        return measured, await m.value.read(), first_tier(rts[0]), rts[0]

    measured, text, first, runtime = run_replicas(
        [config(stubs, tmp_path)], [Slow(INT8_FAST)], [NOW], scenario
    )
    assert measured == [] and text is None and first == "int4"
    assert runtime.metrics.measurement_runs.labels("lost_lock")._value.get() == 1


def test_a_tier_the_live_guard_withheld_is_checked_again_and_put_back_when_it_passes(
    stubs: list[str], tmp_path: Path
) -> None:
    failing = RunFigures(
        INT8_FAST.tiers, INT8_FAST.classes, {**INT8_FAST.verdicts, "int8": (False, "code low")}
    )
    runs = Runs(INT8_FAST, failing, INT8_FAST)
    clock = [NOW]

    async def scenario(ms: list[Measurement], rts: list[Runtime]) -> Any:
        guard = rts[0].board.guard
        await ms[0].tick()  # measured at start
        guard.withheld["int8"] = {"tolerant"}  # as the live guard does when shadow agreement falls
        clock[0] += 60
        checked = await ms[0].tick()  # due again at once ("withheld"), but the check fails
        still = guard.classes_withheld("int8")
        clock[0] += 301  # past retry_s: checked once more, and it passes
        again = await ms[0].tick()
        return checked, still, again, guard.classes_withheld("int8"), await ms[0].tick()

    checked, still, again, after, idle = run_replicas(
        [config(stubs, tmp_path)], [runs], clock, scenario
    )
    assert len(checked) == 1 and still == frozenset({"tolerant"})  # a failed check keeps it out
    assert len(again) == 1 and after == frozenset()  # a passing check puts it back
    assert idle == [] and len(runs.targets) == 3  # nothing more to check
