"""choose_endpoints: which endpoint of a tier's pool, in which order (plain values)."""

from __future__ import annotations

from backends.tier_state import TierState
from gateway.request.route.endpoint_choice import (
    EndpointStatus,
    Saturation,
    choose_endpoints,
    endpoint_id,
    hrw_score,
    session_key,
)

LIMITS = Saturation(max_requests_waiting=4, max_kv_usage=0.9)
READY = TierState.READY


def pool(count: int) -> list[EndpointStatus]:
    return [EndpointStatus(f"http://10.0.0.{i}:8000", READY) for i in range(1, count + 1)]


def test_least_loaded_first_waiting_then_kv_then_running() -> None:
    endpoints = [
        EndpointStatus("http://a", READY, requests_waiting=1, kv_usage=0.1),
        EndpointStatus("http://b", READY, requests_waiting=0, kv_usage=0.5),
        EndpointStatus("http://c", READY, requests_waiting=0, kv_usage=0.2, requests_running=3),
        EndpointStatus("http://d", READY, requests_waiting=0, kv_usage=0.2, requests_running=1),
    ]
    choice = choose_endpoints(endpoints, None, LIMITS)
    assert choice.order == ["http://d", "http://c", "http://b", "http://a"]
    assert not choice.affinity


def test_endpoints_that_tie_take_turns() -> None:
    """Scrapes that show no load (short answers on a fast machine finish between two of them)
    must not send every request to the same endpoint."""
    idle = pool(3)
    firsts = [choose_endpoints(idle, None, LIMITS, turn).order[0] for turn in range(6)]
    assert firsts == [e.url for e in idle] * 2
    assert choose_endpoints(idle, None, LIMITS, 1).order == [e.url for e in idle[1:] + idle[:1]]
    # Load still comes first: a busier endpoint is last whatever the turn.
    busy = [EndpointStatus(idle[0].url, READY, requests_running=2), *idle[1:]]
    assert all(choose_endpoints(busy, None, LIMITS, t).order[-1] == idle[0].url for t in range(3))


def test_not_ready_draining_and_saturated_are_skipped() -> None:
    endpoints = [
        EndpointStatus("http://down", TierState.DOWN),
        EndpointStatus("http://drain", TierState.DRAINING),
        EndpointStatus("http://busy", READY, requests_waiting=9),
        EndpointStatus("http://full", READY, kv_usage=0.95),
        EndpointStatus("http://ok", READY, requests_waiting=2),
    ]
    assert choose_endpoints(endpoints, None, LIMITS).order == ["http://ok"]


def test_all_draining_gives_none() -> None:
    endpoints = [EndpointStatus(f"http://{i}", TierState.DRAINING) for i in range(3)]
    assert choose_endpoints(endpoints, "session", LIMITS).order == []
    assert choose_endpoints([], None, LIMITS).order == []


def test_all_saturated_keeps_them_least_loaded_first() -> None:
    endpoints = [
        EndpointStatus("http://a", READY, requests_waiting=9),
        EndpointStatus("http://b", READY, requests_waiting=5),
        EndpointStatus("http://c", TierState.DOWN),
    ]
    assert choose_endpoints(endpoints, None, LIMITS).order == ["http://b", "http://a"]


def test_a_session_sticks_to_its_hrw_endpoint_whatever_the_load() -> None:
    endpoints = pool(4)
    own = max(endpoints, key=lambda e: hrw_score("conv-1", e.url)).url
    loaded = [
        EndpointStatus(e.url, READY, requests_waiting=3 if e.url == own else 0) for e in endpoints
    ]
    choice = choose_endpoints(loaded, "conv-1", LIMITS)
    assert choice.order[0] == own and choice.affinity
    assert sorted(choice.order) == sorted(e.url for e in endpoints)  # the rest stay as failover


def test_affinity_is_stable_when_an_unrelated_endpoint_leaves() -> None:
    endpoints = pool(5)
    sessions = [f"user-{i}" for i in range(200)]
    before = {s: choose_endpoints(endpoints, s, LIMITS).order[0] for s in sessions}
    leaving = endpoints[2].url
    rest = endpoints[:2] + endpoints[3:]
    after = {s: choose_endpoints(rest, s, LIMITS).order[0] for s in sessions}
    for s in sessions:
        if before[s] != leaving:
            assert after[s] == before[s]  # only the leaver's sessions move
    assert {before[s] for s in sessions} == {e.url for e in endpoints}  # spread over all five
    draining = [
        EndpointStatus(e.url, TierState.DRAINING if e.url == leaving else READY) for e in endpoints
    ]
    for s in sessions:
        if before[s] != leaving:
            assert choose_endpoints(draining, s, LIMITS).order[0] == before[s]


def test_saturated_preferred_endpoint_falls_back_to_the_least_loaded() -> None:
    endpoints = pool(3)
    own = max(endpoints, key=lambda e: hrw_score("conv-9", e.url)).url
    others = [e.url for e in endpoints if e.url != own]
    loaded = [
        EndpointStatus(
            e.url,
            READY,
            requests_waiting=9 if e.url == own else 0,
            kv_usage=0.5 if e.url == others[0] else 0.1,
        )
        for e in endpoints
    ]
    choice = choose_endpoints(loaded, "conv-9", LIMITS)
    assert choice.order == [others[1], others[0]] and not choice.affinity


def test_the_session_key_comes_from_the_header_then_the_user_field() -> None:
    assert session_key({"x-session-id": " s1 "}, {"user": "u"}) == "s1"
    assert session_key({}, {"user": "u"}) == "u"
    assert session_key({}, {"user": 3}) is None
    assert session_key({"x-session-id": ""}, {}) is None
    assert len(session_key({}, {"user": "x" * 10_000}) or "") == 256


def test_endpoint_ids_are_short_and_stable() -> None:
    assert endpoint_id("http://10.0.0.1:8000") == endpoint_id("http://10.0.0.1:8000")
    assert endpoint_id("http://10.0.0.1:8000") != endpoint_id("http://10.0.0.2:8000")
    assert len(endpoint_id("http://x")) == 10
