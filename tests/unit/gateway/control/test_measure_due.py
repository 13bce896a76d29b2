"""Which endpoints are measured when, and how runs are made of them (plain values)."""

from __future__ import annotations

from gateway.control.measure_due import (
    CLOCK_SLACK,
    Due,
    Endpoint,
    Measured,
    Returns,
    Schedule,
    due,
    plan_runs,
)

HOUR = 3600.0
SCHEDULE = Schedule(interval=6 * HOUR, retry=300.0, max_runs=2)
NOW = 1_000_000.0
FP16, INT8 = Endpoint("fp16", "http://a:1"), Endpoint("int8", "http://b:1")


def measured(e: Endpoint, at: float, digest: str = "") -> Measured:
    return Measured(e.tier, e.url, at, digest)


def last(*records: Measured) -> dict[tuple[str, str], Measured]:
    return {(r.tier, r.url): r for r in records}


def test_endpoints_never_measured_are_due_at_once_even_under_load() -> None:
    assert due([FP16, INT8], {}, NOW, quiet=False, schedule=SCHEDULE) == [
        Due("fp16", "http://a:1", "new"),
        Due("int8", "http://b:1", "new"),
    ]


def test_fresh_figures_for_the_same_endpoints_are_not_measured_again() -> None:
    records = last(measured(FP16, NOW - 60), measured(INT8, NOW - 60))
    assert due([FP16, INT8], records, NOW, quiet=True, schedule=SCHEDULE) == []


def test_a_restarted_endpoint_or_a_new_variant_is_due_without_waiting_for_quiet() -> None:
    records = last(measured(FP16, NOW - 60), measured(INT8, NOW - 60, digest="aaa"))
    back = Endpoint("fp16", "http://a:1", back_at=NOW - 10)  # came back after its measurement
    other = Endpoint("int8", "http://b:1", digest="bbb")
    assert due([back, other], records, NOW, quiet=False, schedule=SCHEDULE) == [
        Due("fp16", "http://a:1", "restarted"),
        Due("int8", "http://b:1", "new variant"),
    ]


def test_the_schedule_waits_for_a_quiet_window() -> None:
    records = last(measured(FP16, NOW - 7 * HOUR))
    assert due([FP16], records, NOW, quiet=False, schedule=SCHEDULE) == []
    assert due([FP16], records, NOW, quiet=True, schedule=SCHEDULE) == [
        Due("fp16", "http://a:1", "schedule")
    ]


def test_a_record_from_the_future_is_measured_again_in_the_next_quiet_window() -> None:
    # The clock went back an hour: the record would otherwise never be old enough for days.
    records = last(measured(FP16, NOW + HOUR))
    found = due([FP16], records, NOW, quiet=True, schedule=SCHEDULE)
    assert [d.reason for d in found] == ["schedule (measured in the future: the clock went back)"]
    # a little skew between replicas' clocks is not a jump
    assert due([FP16], last(measured(FP16, NOW + CLOCK_SLACK / 2)), NOW, True, SCHEDULE) == []


def test_an_endpoint_that_is_not_ready_is_not_measured() -> None:
    down = Endpoint("int8", "http://b:1", ready=False)
    assert due([down], {}, NOW, quiet=True, schedule=SCHEDULE) == []


def test_a_failed_run_waits_its_retry_before_its_endpoints_are_due_again() -> None:
    failed = {("fp16", "http://a:1"): NOW - 100}
    assert due([FP16], {}, NOW, True, SCHEDULE, failed) == []
    assert due([FP16], {}, NOW + 300, True, SCHEDULE, failed) == [Due("fp16", "http://a:1", "new")]
    # a failure time ahead of the clock (a jump back) does not block the endpoint for ever
    assert due([FP16], {}, NOW - 10 * HOUR, True, SCHEDULE, failed) != []


def test_each_run_measures_one_ready_endpoint_of_every_tier_the_due_ones_first() -> None:
    pods = [Endpoint("int8", f"http://10.0.0.{i}:8000") for i in (1, 2, 3)]
    int4 = [Endpoint("int4", "http://c:1"), Endpoint("int4", "http://c:2", ready=False)]
    endpoints = [FP16, *pods, *int4]
    wanted = [Due(e.tier, e.url, "new") for e in pods]  # fp16 and int4 measured already
    runs = plan_runs(wanted, endpoints, "fp16", max_runs=2)
    assert runs == [
        {"fp16": "http://a:1", "int8": "http://10.0.0.1:8000", "int4": "http://c:1"},
        {"fp16": "http://a:1", "int8": "http://10.0.0.2:8000", "int4": "http://c:1"},
    ]  # the third pod waits for the next look (max_runs); int4's down pod is in none


def test_no_run_without_a_ready_reference_endpoint() -> None:
    endpoints = [Endpoint("fp16", "http://a:1", ready=False), INT8]
    assert plan_runs([Due("int8", "http://b:1", "new")], endpoints, "fp16", 2) == []


def test_returns_are_the_times_an_endpoint_came_back_to_ready() -> None:
    seen = Returns()
    looks = [True, True, False, False, True, True, False, True]
    found = [seen.observe("int8", "u", ready, float(t)) for t, ready in enumerate(looks)]
    assert found == [None, None, None, None, 4.0, 4.0, 4.0, 7.0]
    seen.forget_except(set())
    assert seen.observe("int8", "u", True, 9.0) is None  # a pod that left and came back is new


def test_a_reset_is_no_return_the_server_kept_running() -> None:
    seen = Returns()
    seen.observe("int8", "u", True, 1.0)
    seen.observe("int8", "u", False, 2.0, away=False)  # draining, then resetting
    seen.observe("int8", "u", False, 3.0, away=False)
    assert seen.observe("int8", "u", True, 4.0) is None
    seen.observe("int8", "u", False, 5.0, away=True)  # down: a restart
    assert seen.observe("int8", "u", True, 6.0) == 6.0


def test_a_tier_the_live_guard_withheld_since_its_last_check_is_due_even_under_load() -> None:
    withheld = Endpoint("int8", "http://b:1", withheld_at=NOW - 30)
    records = last(measured(FP16, NOW - 60), measured(withheld, NOW - 60))
    assert due([FP16, withheld], records, NOW, quiet=False, schedule=SCHEDULE) == [
        Due("int8", "http://b:1", "withheld")
    ]
    # Checked after it was withheld and still out (its check failed): again after ``retry``.
    records = last(measured(FP16, NOW - 60), measured(withheld, NOW - 10))
    assert due([FP16, withheld], records, NOW, quiet=False, schedule=SCHEDULE) == []
    later = NOW - 10 + SCHEDULE.retry
    assert due([FP16, withheld], records, later, quiet=False, schedule=SCHEDULE) == [
        Due("int8", "http://b:1", "withheld")
    ]
