"""conversations: each turn resends the history, how turns are keyed, the pool's counter deltas."""

from __future__ import annotations

import json
from itertools import count

import httpx
import pytest

from backends.metrics import TierMetrics
from measure.conversations import (
    SESSION_HEADER,
    Phase,
    PoolCache,
    Turn,
    converse,
    plan,
    pool_cache,
    questions,
    session_headers,
    settled,
)

TEXTS = [f"Question {i}?" for i in range(40)]


def test_plans_differ_from_their_first_token_and_have_their_turns() -> None:
    a, b = plan(0, "n-a", TEXTS, 3), plan(0, "n-b", TEXTS, 3)
    assert a.system.startswith("Conversation n-a.") and b.system.startswith("Conversation n-b.")
    assert a.system.split(".", 1)[1] == b.system.split(".", 1)[1]  # only the nonce differs
    assert len(a.users) == 3 and len(set(a.users)) == 3
    assert plan(1, "n-a", TEXTS, 3).users != a.users  # another conversation, other turns


def test_the_shipped_questions_load() -> None:
    texts = questions()
    assert len(texts) == 80 and all(isinstance(t, str) and t for t in texts)


def test_session_headers_by_mode() -> None:
    keys = (f"k{i}" for i in count())
    assert session_headers("affinity", "conv", lambda: next(keys)) == {SESSION_HEADER: "conv"}
    assert session_headers("spread", "conv", lambda: next(keys)) == {SESSION_HEADER: "k0"}
    assert session_headers("spread", "conv", lambda: next(keys)) == {SESSION_HEADER: "k1"}
    assert session_headers("none", "conv", lambda: next(keys)) == {}
    with pytest.raises(ValueError, match="unknown mode"):
        session_headers("sticky", "conv", lambda: "x")


def _gateway(
    seen: list[tuple[list[dict[str, str]], dict[str, str]]], fail_at: int = 99
) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((body["messages"], dict(request.headers)))
        if len(seen) == fail_at:
            return httpx.Response(503, json={"error": {"message": "busy"}})
        answer = {
            "choices": [{"message": {"role": "assistant", "content": f"answer {len(seen)}"}}],
            "usage": {"prompt_tokens": 100 * len(seen)},
        }
        headers = {"x-route-tier": "int4", "x-route-endpoint": f"e-{len(seen) % 2}"}
        return httpx.Response(200, json=answer, headers=headers)

    return httpx.Client(transport=httpx.MockTransport(handler))


def test_each_turn_resends_the_history_with_the_answers() -> None:
    seen: list[tuple[list[dict[str, str]], dict[str, str]]] = []
    conversation = plan(2, "n", TEXTS, 3)
    with _gateway(seen) as client:
        turns = converse(client, "http://gw", conversation, "affinity", model="m")
    assert [t.status for t in turns] == [200, 200, 200]
    assert [t.prompt_tokens for t in turns] == [100, 200, 300]
    assert [t.endpoint for t in turns] == ["e-1", "e-0", "e-1"]
    first, second, third = (messages for messages, _ in seen)
    assert first == [
        {"role": "system", "content": conversation.system},
        {"role": "user", "content": conversation.users[0]},
    ]
    # Turn k's prompt starts with turn k-1's: what makes the prefix cache useful.
    assert second[:2] == first and second[2] == {"role": "assistant", "content": "answer 1"}
    assert third[:4] == second and third[4] == {"role": "assistant", "content": "answer 2"}
    keys = {headers[SESSION_HEADER] for _, headers in seen}
    assert len(keys) == 1  # one key for the whole conversation


def test_spread_sends_a_new_key_each_turn_and_a_failed_turn_ends_the_conversation() -> None:
    seen: list[tuple[list[dict[str, str]], dict[str, str]]] = []
    with _gateway(seen, fail_at=3) as client:
        turns = converse(
            client, "http://gw", plan(0, "n", TEXTS, 4), "spread", model="m", headers={"a": "b"}
        )
    assert [t.status for t in turns] == [200, 200, 503]
    assert len({headers[SESSION_HEADER] for _, headers in seen}) == 3
    assert all(headers["a"] == "b" for _, headers in seen)


def _m(queries: float, hits: float, finished: float) -> TierMetrics:
    return TierMetrics(
        prefix_cache_queries=queries, prefix_cache_hits=hits, requests_finished=finished
    )


def test_pool_cache_sums_the_replicas_and_a_restart_counts_from_zero() -> None:
    before = {"a": _m(100, 50, 1), "b": _m(1000, 900, 9)}
    after = {"a": _m(400, 250, 4), "b": _m(300, 100, 2)}  # b restarted
    cache = pool_cache(before, after)
    assert cache.per_replica == {"a": (300, 200), "b": (300, 100)}
    assert (cache.queries, cache.hits, cache.hit_rate) == (600, 300, 0.5)
    assert cache.finished == {"a": 3, "b": 2}
    assert pool_cache(before, before).hit_rate is None


def test_settled_waits_for_the_requests_and_two_equal_reads() -> None:
    before = {"a": _m(0, 0, 0)}
    reads = iter([_m(10, 0, 1), _m(30, 10, 2), _m(40, 20, 2), _m(40, 20, 2), _m(99, 99, 9)])
    assert settled(lambda: {"a": next(reads)}, before, 2, pause=0)["a"] == _m(40, 20, 2)
    with pytest.raises(TimeoutError, match="1 of 2 requests"):
        settled(lambda: {"a": _m(10, 0, 1)}, before, 2, timeout=0, pause=0)


def test_a_phase_reports_its_rate_split_and_kept_conversations() -> None:
    phase = Phase("affinity")
    phase.conversations = [
        [Turn(200, "int4", "e-a", 10, 1.0), Turn(200, "int4", "e-a", 20, 1.0)],
        [Turn(200, "int4", "e-a", 10, 1.0), Turn(200, "int4", "e-b", 20, 1.0)],
    ]
    phase.cache = [PoolCache(100, 30, {}, {}), PoolCache(100, 50, {}, {})]
    assert phase.hit_rate == 0.4
    assert phase.endpoint_split() == {"e-a": 3, "e-b": 1}
    assert phase.kept() == 1
    assert Phase("none").hit_rate is None
