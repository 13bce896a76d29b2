"""gateway/control/reset_schedule.py: windows, conditions, the last-ready rule and choose_reset."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.control.reset_schedule import (
    ResetDecision,
    TierResetState,
    choose_reset,
    conditions_met,
    last_ready_for_a_class,
    window_open,
)
from gateway.policy.schema import ResetsPolicy, ResetWindow, RoutingPolicy, parse_policy
from gateway.request.route.router import TierStatus

BASE = """\
tiers: [fp16, int8, int4]
routes:
  tolerant: [int4, int8, fp16]
  code: [fp16, int8]
  math: [fp16, int8]
  long: {strategy: most_free_kv, tiers: [fp16, int8, int4]}
"""
HOUR = 3600.0
NIGHT = datetime(2024, 1, 15, 3, 10, tzinfo=UTC).timestamp()  # inside 02:00-05:00 UTC
DAY = datetime(2024, 1, 15, 13, 5, tzinfo=UTC).timestamp()  # outside it
QUIET = 300.0  # seconds of quiet traffic: more than for_seconds (120)


def at(text: str) -> float:
    """Epoch seconds of an ISO time (UTC unless it carries an offset)."""
    moment = datetime.fromisoformat(text)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def window(start: str, end: str, timezone: str = "UTC") -> ResetWindow:
    return ResetWindow(start=start, end=end, timezone=timezone)


def resets(**overrides: Any) -> ResetsPolicy:
    values: dict[str, Any] = {
        "enabled": True,
        "windows": [{"start": "02:00", "end": "05:00", "timezone": "UTC"}],
        "quiet": {"max_rps": 0.5, "for_seconds": 120},
        "when": "window_and_quiet",
        "min_interval_seconds": 6 * HOUR,
    }
    return ResetsPolicy.model_validate(values | overrides)


def policy(routes: str | None = None, **overrides: Any) -> RoutingPolicy:
    text = BASE if routes is None else BASE.split("routes:")[0] + routes
    return parse_policy(text, "t.yaml").model_copy(update={"resets": resets(**overrides)})


def tier(
    name: str,
    state: str = "ready",
    last: float | None = None,
    *,
    preemptions: float = 0.0,
    at_last: float = 0.0,
    p90: float | None = None,
    baseline: float | None = None,
) -> TierResetState:
    return TierResetState(name, state, last, preemptions, at_last, p90, baseline)


def tiers(**states: str) -> list[TierResetState]:
    """fp16, int8 and int4, ready and never reset unless ``name=state`` says otherwise."""
    return [tier(name, states.get(name, "ready")) for name in ("fp16", "int8", "int4")]


# --------------------------------------------------------------------------- window_open


@pytest.mark.parametrize(
    ("start", "end", "zone", "now", "expected"),
    [
        ("02:00", "05:00", "UTC", "2024-01-15T01:59:59", False),
        ("02:00", "05:00", "UTC", "2024-01-15T02:00:00", True),
        ("02:00", "05:00", "UTC", "2024-01-15T04:59:59", True),
        ("02:00", "05:00", "UTC", "2024-01-15T05:00:00", False),  # end is exclusive
        ("02:00", "05:00", "UTC", "2024-01-15T13:05:00", False),
        # across midnight
        ("23:00", "02:00", "UTC", "2024-01-15T22:59:00", False),
        ("23:00", "02:00", "UTC", "2024-01-15T23:00:00", True),
        ("23:00", "02:00", "UTC", "2024-01-16T00:30:00", True),
        ("23:00", "02:00", "UTC", "2024-01-16T01:59:00", True),
        ("23:00", "02:00", "UTC", "2024-01-16T02:00:00", False),
        ("23:00", "02:00", "UTC", "2024-01-16T12:00:00", False),
        # New York: UTC-5 in January, UTC-4 (daylight saving) in July
        ("02:00", "05:00", "America/New_York", "2024-01-15T07:30:00", True),  # 02:30 EST
        ("02:00", "05:00", "America/New_York", "2024-01-15T03:30:00", False),  # 22:30 EST
        ("02:00", "05:00", "America/New_York", "2024-01-15T09:30:00", True),  # 04:30 EST
        ("02:00", "05:00", "America/New_York", "2024-07-15T09:30:00", False),  # 05:30 EDT
        ("02:00", "05:00", "America/New_York", "2024-07-15T06:00:00", True),  # 02:00 EDT
        # a half-hour zone, across midnight: 23:00-01:00 in Kolkata is 17:30-19:30 UTC
        ("23:00", "01:00", "Asia/Kolkata", "2024-01-15T17:29:00", False),
        ("23:00", "01:00", "Asia/Kolkata", "2024-01-15T17:30:00", True),
        ("23:00", "01:00", "Asia/Kolkata", "2024-01-15T19:29:00", True),
        ("23:00", "01:00", "Asia/Kolkata", "2024-01-15T19:30:00", False),
        # the same instant given with an offset
        ("02:00", "05:00", "UTC", "2024-01-15T10:10:00+07:00", True),
    ],
)
def test_window_open(start: str, end: str, zone: str, now: str, expected: bool) -> None:
    assert window_open(at(now), [window(start, end, zone)]) is expected


def test_any_window_of_several_opens() -> None:
    windows = [window("02:00", "03:00"), window("12:00", "14:00", "Europe/Paris")]
    assert window_open(at("2024-01-15T02:30:00"), windows)
    assert window_open(at("2024-01-15T11:30:00"), windows)  # 12:30 in Paris (UTC+1)
    assert not window_open(at("2024-01-15T07:00:00"), windows)


def test_no_window_is_never_open() -> None:
    assert not window_open(NIGHT, [])


# --------------------------------------------------------------------------- conditions_met

OPEN, CLOSED = NIGHT, DAY
LONG_QUIET, SHORT_QUIET, BUSY = 300.0, 30.0, 0.0


@pytest.mark.parametrize(
    ("when", "now", "quiet_for", "expected"),
    [
        ("window_and_quiet", OPEN, LONG_QUIET, True),
        ("window_and_quiet", OPEN, SHORT_QUIET, False),
        ("window_and_quiet", CLOSED, LONG_QUIET, False),
        ("window_and_quiet", CLOSED, BUSY, False),
        ("window_or_quiet", OPEN, BUSY, True),
        ("window_or_quiet", CLOSED, LONG_QUIET, True),
        ("window_or_quiet", CLOSED, SHORT_QUIET, False),
        ("window", OPEN, BUSY, True),
        ("window", CLOSED, LONG_QUIET, False),
        ("quiet", CLOSED, LONG_QUIET, True),
        ("quiet", OPEN, SHORT_QUIET, False),
        ("quiet", OPEN, 120.0, True),  # exactly for_seconds
    ],
)
def test_conditions(when: str, now: float, quiet_for: float, expected: bool) -> None:
    met, reason = conditions_met(now, resets(when=when), quiet_for)
    assert met is expected
    assert reason.isascii() and "\n" not in reason


@pytest.mark.parametrize(
    ("when", "now", "quiet_for", "rps", "reason"),
    [
        ("window", CLOSED, 0.0, None, "window closed (02:00-05:00 UTC, now 13:05)"),
        ("window", OPEN, 0.0, None, "window open (02:00-05:00 UTC, now 03:10)"),
        ("quiet", OPEN, 0.0, 3.2, "traffic 3.2 rps >= 0.5"),
        ("quiet", OPEN, 0.0, None, "traffic not below 0.5 rps"),
        ("quiet", OPEN, 30.0, 0.1, "traffic below 0.5 rps for 30 s < 2 min"),
        ("quiet", OPEN, 600.0, 0.1, "traffic below 0.5 rps for 10 min"),
        (
            "window_and_quiet",
            CLOSED,
            0.0,
            3.2,
            "window closed (02:00-05:00 UTC, now 13:05) and traffic 3.2 rps >= 0.5",
        ),
        ("window_and_quiet", OPEN, 0.0, 3.2, "traffic 3.2 rps >= 0.5"),
        (
            "window_and_quiet",
            OPEN,
            300.0,
            0.0,
            "window open (02:00-05:00 UTC, now 03:10) and traffic below 0.5 rps for 5 min",
        ),
        ("window_or_quiet", CLOSED, 300.0, 0.0, "traffic below 0.5 rps for 5 min"),
        (
            "window_or_quiet",
            CLOSED,
            0.0,
            1.0,
            "window closed (02:00-05:00 UTC, now 13:05) and traffic 1.0 rps >= 0.5",
        ),
    ],
)
def test_condition_reasons(
    when: str, now: float, quiet_for: float, rps: float | None, reason: str
) -> None:
    assert conditions_met(now, resets(when=when), quiet_for, rps=rps)[1] == reason


def test_each_window_is_shown_in_its_own_zone() -> None:
    windows = [
        {"start": "02:00", "end": "05:00", "timezone": "UTC"},
        {"start": "23:00", "end": "01:00", "timezone": "America/New_York"},
    ]
    met, reason = conditions_met(DAY, resets(when="window", windows=windows), 0.0)
    assert not met
    assert reason == (
        "windows closed (02:00-05:00 UTC, now 13:05; 23:00-01:00 America/New_York, now 08:05)"
    )


def test_a_missing_quiet_condition_is_never_met() -> None:
    met, reason = conditions_met(NIGHT, resets(when="window_or_quiet", quiet=None), 1e9)
    assert met  # the window is open
    met, reason = conditions_met(DAY, resets(when="quiet", quiet=None), 1e9)
    assert (met, reason) == (False, "no quiet condition configured")


# --------------------------------------------------------------------------- last ready


def test_last_ready_for_a_class_by_state_strings() -> None:
    routes = policy().routes
    all_ready = {"fp16": "ready", "int8": "ready", "int4": "ready"}
    assert last_ready_for_a_class("fp16", all_ready, routes) is None
    assert last_ready_for_a_class("fp16", all_ready | {"int8": "down"}, routes) == "code"
    assert last_ready_for_a_class("int8", all_ready | {"fp16": "resetting"}, routes) == "code"
    # int4 is only in tolerant and long, which keep int8 and fp16
    assert last_ready_for_a_class("int4", all_ready | {"fp16": "down"}, routes) is None
    # a tier missing from the states counts as not ready
    assert last_ready_for_a_class("fp16", {"fp16": "ready"}, routes) == "tolerant"
    # a tier no route names strands nobody
    assert last_ready_for_a_class("bf16", {}, routes) is None


def test_last_ready_for_a_class_by_status_objects() -> None:
    routes = policy().routes
    statuses = {
        name: TierStatus(name, state, 0.0, 0.0, 4096)
        for name, state in (("fp16", "ready"), ("int8", "starting"), ("int4", "ready"))
    }
    assert last_ready_for_a_class("fp16", statuses, routes) == "code"
    assert last_ready_for_a_class("int4", statuses, routes) is None
    states = {t.name: t for t in tiers(int8="down")}
    assert last_ready_for_a_class("fp16", states, routes) == "code"


def test_only_the_tiers_a_route_names_count() -> None:
    routes = policy(
        "routes:\n  tolerant: [int4]\n  code: [fp16]\n  math: [fp16, int8]\n  long: [int8]\n"
    ).routes
    ready = {"fp16": "ready", "int8": "ready", "int4": "ready"}
    assert last_ready_for_a_class("int4", ready, routes) == "tolerant"  # int8 is ready elsewhere
    assert last_ready_for_a_class("fp16", ready, routes) == "code"
    assert last_ready_for_a_class("int8", ready, routes) == "long"


# --------------------------------------------------------------------------- choose_reset


def decide(
    states: list[TierResetState],
    now: float = NIGHT,
    quiet_for: float = QUIET,
    force: str | None = None,
    the_policy: RoutingPolicy | None = None,
    **kwargs: Any,
) -> ResetDecision:
    decision = choose_reset(now, the_policy or policy(), states, quiet_for, force, **kwargs)
    assert decision.reason.isascii() and "\n" not in decision.reason
    return decision


def test_nothing_when_disabled() -> None:
    assert decide(tiers(), the_policy=policy(enabled=False)) == ResetDecision(
        None, "resets are disabled"
    )


def test_nothing_outside_the_window_or_while_busy_traffic() -> None:
    closed = decide(tiers(), now=DAY)
    assert closed == ResetDecision(None, "window closed (02:00-05:00 UTC, now 13:05)")
    busy = decide(tiers(), quiet_for=0.0, rps=3.2)
    assert busy == ResetDecision(None, "traffic 3.2 rps >= 0.5")


def test_never_reset_tiers_go_first_in_policy_order() -> None:
    decision = decide(tiers())
    assert decision.tier == "fp16"
    assert decision.reason == (
        "reset fp16: never reset; "
        "window open (02:00-05:00 UTC, now 03:10) and traffic below 0.5 rps for 5 min"
    )


@pytest.mark.parametrize(
    ("ages", "expected"),
    [
        ({"fp16": 7, "int8": 8, "int4": None}, "int4"),  # never reset first
        ({"fp16": 7, "int8": 8, "int4": 10}, "int4"),  # then the oldest reset
        ({"fp16": 9, "int8": 8, "int4": 7}, "fp16"),
        ({"fp16": 1, "int8": 7, "int4": 9}, "int4"),  # fp16 is not due
        ({"fp16": 8, "int8": 8, "int4": 8}, "fp16"),  # a tie: the policy's order
        ({"fp16": None, "int8": None, "int4": 1}, "fp16"),
        ({"fp16": 1, "int8": 2, "int4": 5.9}, None),  # nobody due
        ({"fp16": 1, "int8": 2, "int4": 6}, "int4"),  # exactly min_interval
    ],
)
def test_the_due_tier_with_the_oldest_reset_is_chosen(
    ages: dict[str, float | None], expected: str | None
) -> None:
    states = [
        tier(name, last=None if hours is None else NIGHT - hours * HOUR)
        for name, hours in ages.items()
    ]
    assert decide(states).tier == expected


def test_the_interval_is_explained() -> None:
    states = [tier("fp16", last=NIGHT - 2 * HOUR), tier("int8", last=NIGHT - 30 * 60)]
    states.append(tier("int4", last=NIGHT - 5.5 * HOUR))
    assert decide(states) == ResetDecision(
        None,
        "no tier to reset: fp16 reset 2 h ago < 6 h; int8 reset 30 min ago < 6 h; "
        "int4 reset 5.5 h ago < 6 h",
    )


def test_a_reset_in_the_future_is_not_due() -> None:  # clocks out of step
    states = [tier(name, last=NIGHT + HOUR) for name in ("fp16", "int8", "int4")]
    assert decide(states).tier is None


def test_a_chosen_tier_says_how_long_ago() -> None:
    states = [tier(name, last=NIGHT - h * HOUR) for name, h in (("fp16", 1), ("int8", 7))]
    states.append(tier("int4", last=NIGHT - 2 * HOUR))
    assert decide(states).reason.startswith("reset int8: last reset 7 h ago; window open")


# --------------------------------------------------------------------------- triggers

RECENT = NIGHT - HOUR  # within min_interval


@pytest.mark.parametrize(
    ("triggers", "fp16", "due", "because"),
    [
        ({"preemptions_growth": 10}, {"preemptions": 30, "at_last": 10}, True, "preemptions +20"),
        ({"preemptions_growth": 10}, {"preemptions": 19, "at_last": 10}, False, "reset 60 min"),
        ({"preemptions_growth": 10}, {"preemptions": 20, "at_last": 10}, True, ">= 10"),
        # the counter went back (the tier restarted): growth counts from 0
        ({"preemptions_growth": 10}, {"preemptions": 12, "at_last": 50}, True, "preemptions +12"),
        ({"preemptions_growth": 10}, {"preemptions": 5, "at_last": 50}, False, "reset 60 min"),
        ({}, {"preemptions": 1e6, "at_last": 0}, False, "reset 60 min"),  # trigger off
        ({"ttft_p90_factor": 2.0}, {"p90": 900, "baseline": 400}, True, "TTFT p90 900 ms > 2 x"),
        ({"ttft_p90_factor": 2.0}, {"p90": 800, "baseline": 400}, False, "reset 60 min"),
        ({"ttft_p90_factor": 2.0}, {"p90": 900, "baseline": None}, False, "reset 60 min"),
        ({"ttft_p90_factor": 2.0}, {"p90": None, "baseline": 400}, False, "reset 60 min"),
        ({"ttft_p90_factor": 2.0}, {"p90": 900, "baseline": 0}, False, "reset 60 min"),
        ({}, {"p90": 9000, "baseline": 100}, False, "reset 60 min"),  # trigger off
    ],
)
def test_triggers_make_a_tier_due_before_its_interval(
    triggers: dict[str, float], fp16: dict[str, Any], due: bool, because: str
) -> None:
    states = [tier("fp16", last=RECENT, **fp16)]
    states += [tier(name, last=RECENT) for name in ("int8", "int4")]
    decision = decide(states, the_policy=policy(triggers=triggers))
    assert decision.tier == ("fp16" if due else None)
    assert because in decision.reason


def test_a_trigger_still_needs_the_conditions() -> None:
    states = [tier("fp16", last=RECENT, preemptions=100)]
    states += [tier(name, last=RECENT) for name in ("int8", "int4")]
    the_policy = policy(triggers={"preemptions_growth": 10})
    assert decide(states, the_policy=the_policy).tier == "fp16"
    assert decide(states, now=DAY, the_policy=the_policy).tier is None
    assert decide(states, quiet_for=10.0, the_policy=the_policy).tier is None


# --------------------------------------------------------------------------- safety


def test_a_tier_that_is_not_ready_is_skipped() -> None:
    assert decide(tiers(int4="starting")).tier == "fp16"
    # fp16 starting: int8 is code's last ready tier, so int4 is the one
    assert decide(tiers(fp16="starting")).tier == "int4"
    assert decide(tiers(fp16="down", int8="down", int4="starting")) == ResetDecision(
        None, "no tier to reset: fp16 is down; int8 is down; int4 is starting"
    )


def test_the_last_ready_tier_of_a_class_is_kept() -> None:
    # int8 is down: fp16 alone serves code and math
    states = [tier("fp16"), tier("int8", "down"), tier("int4", last=NIGHT - HOUR)]
    assert decide(states) == ResetDecision(
        None,
        "no tier to reset: fp16 is the last ready tier of code; int8 is down; "
        "int4 reset 60 min ago < 6 h",
    )
    states[2] = tier("int4")  # int4 due: tolerant and long still have fp16
    assert decide(states).tier == "int4"


def test_a_class_with_a_single_tier_route_keeps_it() -> None:
    routes = "routes:\n  tolerant: [int4]\n  code: [fp16, int8]\n  math: [fp16]\n  long: [fp16]\n"
    decision = decide(tiers(), the_policy=policy(routes))
    assert decision.tier == "int8"  # fp16 is math's only tier, int4 tolerant's
    only = policy("routes:\n  tolerant: [int4]\n  code: [fp16]\n  math: [int8]\n  long: [fp16]\n")
    assert decide(tiers(), the_policy=only).reason == (
        "no tier to reset: fp16 is the last ready tier of code; "
        "int8 is the last ready tier of math; int4 is the last ready tier of tolerant"
    )


@pytest.mark.parametrize("busy", ["draining", "resetting"])
def test_one_reset_at_a_time(busy: str) -> None:
    decision = decide(tiers(int4=busy))
    assert decision == ResetDecision(None, f"int4 is {busy} (one reset at a time)")
    forced = decide(tiers(int4=busy), force="fp16")
    assert forced == ResetDecision(
        None, f"forced reset of fp16 refused: int4 is {busy} (one reset at a time)"
    )


def test_tiers_the_policy_does_not_declare_are_ignored() -> None:
    states = [tier("bf16"), *[tier(n, last=NIGHT - HOUR) for n in ("fp16", "int8", "int4")]]
    assert decide(states).tier is None
    assert decide([tier("bf16", "draining"), *tiers()]).tier == "fp16"
    assert decide(states, force="bf16").reason == "forced reset refused: unknown tier bf16"


def test_no_tiers_at_all() -> None:
    assert decide([]) == ResetDecision(None, "no tier to reset: no tiers")


# --------------------------------------------------------------------------- force


def test_force_skips_enabled_window_quiet_and_interval() -> None:
    states = [tier(name, last=NIGHT - 60) for name in ("fp16", "int8", "int4")]
    off = policy(enabled=False)
    decision = decide(states, now=DAY, quiet_for=0.0, force="int8", the_policy=off)
    assert decision == ResetDecision("int8", "reset int8: forced by an operator")


@pytest.mark.parametrize(
    ("states", "force", "reason"),
    [
        (tiers(), "int2", "forced reset refused: unknown tier int2"),
        (tiers(), "f\u00fcnf", "forced reset refused: unknown tier f\\xfcnf"),
        (tiers(int8="down"), "int8", "forced reset of int8 refused: int8 is down"),
        (
            tiers(int8="down"),
            "fp16",
            "forced reset of fp16 refused: fp16 is the last ready tier of code",
        ),
        (
            tiers(fp16="draining"),
            "int4",
            "forced reset of int4 refused: fp16 is draining (one reset at a time)",
        ),
    ],
)
def test_force_keeps_the_safety_rules(
    states: list[TierResetState], force: str, reason: str
) -> None:
    assert decide(states, force=force) == ResetDecision(None, reason)


def test_a_tier_not_admitted_for_a_class_does_not_keep_it_served() -> None:
    """int8 kept out of code by the admission check: fp16 is code's last tier, so it stays."""
    routes = policy().routes
    statuses = {
        "fp16": TierStatus("fp16", "ready", 0.0, 0.0, 4096),
        "int8": TierStatus("int8", "ready", 0.0, 0.0, 4096, frozenset({"tolerant"})),
        "int4": TierStatus("int4", "ready", 0.0, 0.0, 4096),
    }
    assert last_ready_for_a_class("fp16", statuses, routes) == "code"
    admitted = statuses | {
        "int8": TierStatus("int8", "ready", 0.0, 0.0, 4096, frozenset({"code", "math"}))
    }
    assert last_ready_for_a_class("fp16", admitted, routes) is None
