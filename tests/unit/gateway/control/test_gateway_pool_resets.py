"""Resetting a pool one endpoint at a time (pure step, the roll over a board) and the shared
endpoint marks."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from backends.client import ResetResult, TierClientError
from backends.metrics import TierMetrics
from backends.tier_state import TierState
from gateway.app import create_app
from gateway.config import GatewayConfig, TierEndpoint
from gateway.control.pool_resets import RollSettings, drained, next_endpoint, roll_pool
from gateway.control.reset_marks import (
    MARKS,
    apply_endpoint_marks,
    endpoint_marks_value,
    parse_endpoint_marks,
    parse_marks,
)
from gateway.control.resets import ResetCoordinator
from gateway.control.tier_status import Scrape, TierBoard
from gateway.request.route.endpoint_choice import EndpointStatus
from gateway.runtime import Runtime
from gateway.shared.leader import LeaderLock
from model_optimizer.envs import ROOT

READY, DRAINING, DOWN = TierState.READY, TierState.DRAINING, TierState.DOWN
URLS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"]
POOL = TierEndpoint(name="int8", endpoints=URLS)
FAST = RollSettings(settle=0.0, drain_timeout=0.2, model="m", poll=0.01)


def statuses(*states: TierState) -> list[EndpointStatus]:
    return [EndpointStatus(url, state) for url, state in zip(URLS, states, strict=False)]


def test_the_next_endpoint_is_the_first_ready_one_not_yet_reset() -> None:
    assert next_endpoint(statuses(READY, READY, READY), []).endpoint == URLS[0]
    assert next_endpoint(statuses(READY, READY, READY), [URLS[0]]).endpoint == URLS[1]
    assert next_endpoint(statuses(DOWN, READY, READY), []).endpoint == URLS[1]


def test_the_last_ready_endpoint_of_a_tier_is_never_drained() -> None:
    step = next_endpoint(statuses(READY, DOWN, DRAINING), [])
    assert step.endpoint is None and "last ready endpoint" in step.reason
    step = next_endpoint(statuses(READY, READY), URLS[:1])  # .1 is back; .2 may go now
    assert step.endpoint == URLS[1]
    assert next_endpoint(statuses(READY, READY), URLS[:2]).reason == "every ready endpoint is reset"
    assert next_endpoint(statuses(DOWN, DOWN), []).reason == "no endpoint is ready"


def test_drained_means_nothing_running_or_waiting() -> None:
    assert drained(EndpointStatus("u", DRAINING))
    assert not drained(EndpointStatus("u", DRAINING, requests_running=1))
    assert not drained(EndpointStatus("u", DRAINING, requests_waiting=1))


class FakeClient:
    def __init__(self, url: str, log: list[str], fail: bool) -> None:
        self.url, self.log, self.fail = url, log, fail

    async def reset_kv_pool(self, verify: bool = True) -> ResetResult:
        self.log.append(f"reset {self.url}")
        if self.fail:
            raise TierClientError("500")
        return ResetResult("reset_prefix_cache", True, 0.01, "verified")

    async def warm_up(self, model: str | None = None, requests: int = 2) -> None:
        self.log.append(f"warm {self.url}")


def roll(board: TierBoard, failing: str = "") -> tuple[tuple[str, str], list[str]]:
    log: list[str] = []

    async def mark(url: str, state: TierState | None) -> None:
        # one endpoint out at a time, and never every ready endpoint of the tier
        others = [e for e in board.endpoint_statuses("int8") if e.url != url]
        if state is not None:
            assert any(e.state == READY for e in others), f"{url} was the last ready"
        board.set_endpoint_state("int8", url, state)
        log.append(f"{state or 'back'} {url}")

    def client(url: str) -> FakeClient:
        return FakeClient(url, log, url == failing)

    outcome = asyncio.run(roll_pool(board, "int8", mark, client, FAST))  # type: ignore[arg-type]
    return outcome, log


def test_a_pool_is_reset_one_endpoint_at_a_time() -> None:
    board = TierBoard([POOL])
    board.record("int8", Scrape(False, None, 0.0, "refused"), URLS[2])  # down: not touched
    (outcome, detail), log = roll(board)
    assert outcome == "ok"
    assert log == [
        f"draining {URLS[0]}", f"resetting {URLS[0]}", f"reset {URLS[0]}", f"warm {URLS[0]}",
        f"back {URLS[0]}",
        f"draining {URLS[1]}", f"resetting {URLS[1]}", f"reset {URLS[1]}", f"warm {URLS[1]}",
        f"back {URLS[1]}",
    ]  # fmt: skip
    assert detail.count(": ok (verified)") == 2
    assert [e.state for e in board.endpoint_statuses("int8")] == [READY, READY, DOWN]


def test_a_busy_endpoint_is_given_up_and_a_failure_is_the_outcome() -> None:
    board = TierBoard([POOL])
    busy = Scrape(True, TierMetrics(requests_running=2.0), 0.0)
    board.record("int8", busy, URLS[0])  # never drains within the timeout
    (outcome, detail), log = roll(board, failing=URLS[2])
    assert outcome == "failed"
    assert f"{URLS[0]}: gave_up" in detail and f"{URLS[1]}: ok" in detail
    assert f"{URLS[2]}: failed" in detail
    assert f"reset {URLS[0]}" not in log
    assert {e.state for e in board.endpoint_statuses("int8")} == {READY}  # every mark lifted


def test_a_pool_with_one_ready_endpoint_is_not_reset() -> None:
    board = TierBoard([POOL])
    for url in URLS[1:]:
        board.record("int8", Scrape(False, None, 0.0, "refused"), url)
    (outcome, detail), log = roll(board)
    assert (outcome, log) == ("gave_up", [])
    assert "last ready endpoint" in detail


def test_endpoint_marks_travel_in_the_shared_marks_value() -> None:
    raw = endpoint_marks_value("int8", URLS[1], DRAINING, 7)
    assert parse_endpoint_marks(raw) == {("int8", URLS[1]): DRAINING}
    assert parse_marks(raw) == {}  # no tier is marked: the tier stays in routing
    assert endpoint_marks_value("int8", URLS[1], None, 7) is None
    for garbage in (None, "", "[]", '{"endpoints": 3}', '{"endpoints": {"int8": {"u": "nap"}}}'):
        assert parse_endpoint_marks(garbage) == {}
    board = TierBoard([POOL])
    apply_endpoint_marks(board, parse_endpoint_marks(raw))
    assert [e.state for e in board.endpoint_statuses("int8")] == [READY, DRAINING, READY]
    apply_endpoint_marks(board, {})
    assert board.state("int8") is READY and {e.state for e in board.endpoint_statuses("int8")} == {
        READY
    }


def test_the_coordinator_rolls_through_a_pool_tier_which_stays_in_routing(
    make_stub: Any, tmp_path: Path
) -> None:
    stubs = [make_stub().url for _ in range(3)]
    tiers = [
        TierEndpoint(name="fp16", base_url=stubs[0]),
        TierEndpoint(name="int8", endpoints=stubs[1:]),
        TierEndpoint(name="int4", base_url=stubs[0]),
    ]
    policy = tmp_path / "routing.yaml"
    policy.write_text((ROOT / "policies" / "routing.yaml").read_text())
    config = GatewayConfig(
        model_name="stub-model",
        tiers=tiers,
        policy_path=str(policy),
        watch_policy=False,
        metrics_interval=0.05,
    )
    app = create_app(config)
    log: list[str] = []
    tier_states: list[TierState] = []
    published: list[str | None] = []

    async def main() -> Any:
        async with app.router.lifespan_context(app):
            runtime: Runtime = app.state.runtime
            lock = LeaderLock(None, "test:leader", ttl=30.0)
            await lock.start()
            coordinator = ResetCoordinator(
                runtime,
                lock,
                endpoint_client=lambda tier, url: FakeClient(url, log, False),  # type: ignore[arg-type,return-value]
            )
            put, set_endpoint = coordinator.records.put, runtime.board.set_endpoint_state

            async def publishing(name: str, value: str | None, ttl: float) -> bool:
                if name == MARKS and (not published or published[-1] != value):
                    published.append(value)  # a renewal writes the same value again
                return await put(name, value, ttl)

            def recording(name: str, url: str, state: TierState | None) -> None:
                set_endpoint(name, url, state)
                tier_states.append(runtime.board.state(name))

            coordinator.records.put = publishing  # type: ignore[method-assign]
            runtime.board.set_endpoint_state = recording  # type: ignore[method-assign]
            await coordinator.request("int8")
            await coordinator.tick()
            return await coordinator.history()

    history = asyncio.run(main())
    assert (history[0].tier, history[0].outcome) == ("int8", "ok"), history[0].detail
    assert [line for line in log if line.startswith("reset")] == [f"reset {u}" for u in stubs[1:]]
    assert set(tier_states) == {TierState.READY}  # the tier never left routing
    drains = [parse_endpoint_marks(v) for v in published if v and "draining" in v]
    assert drains == [{("int8", url): TierState.DRAINING} for url in stubs[1:]]
