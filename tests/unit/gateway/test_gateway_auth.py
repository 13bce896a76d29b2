"""API keys, the admin key, per-key rate limits, /admin and /metrics, against a stub tier."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.auth import bearer, matches
from gateway.config import GatewayConfig, TierEndpoint, hash_key, keys_from_environment
from gateway.policy.schema import parse_policy
from gateway.server import server_options
from model_optimizer.envs import ROOT

MODEL = "stub-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
KEY, ADMIN = "sk-test-key", "admin-test-key"


def test_bearer_and_matching_use_digests() -> None:
    scope = {"headers": [(b"authorization", b"Bearer  sk-1 ")]}
    assert bearer(scope) == "sk-1"
    assert bearer({"headers": [(b"api-key", b"sk-2")]}) == "sk-2"
    assert bearer({"headers": [(b"authorization", b"Basic abc")]}) is None
    digest = hash_key("sk-1")
    assert matches("sk-1", [hash_key("other"), digest]) == digest
    assert matches("sk-2", [digest]) is None
    assert matches(None, [digest]) is None


def test_keys_from_the_environment_are_stored_hashed() -> None:
    config = GatewayConfig(model_name="m", tiers=[TierEndpoint(name="a", base_url="http://x")])
    loaded = keys_from_environment(
        config, {"MO_GATEWAY_API_KEYS": "k1, k2", "MO_GATEWAY_ADMIN_KEYS": "adm"}
    )
    assert loaded.api_key_hashes == [hash_key("k1"), hash_key("k2")]
    assert loaded.admin_key_hashes == [hash_key("adm")]
    assert "k1" not in loaded.model_dump_json()
    with pytest.raises(ValueError, match="sha256"):
        GatewayConfig(
            model_name="m",
            tiers=[TierEndpoint(name="a", base_url="http://x")],
            api_key_hashes=["plain-key"],
        )


def test_v1_needs_a_valid_key_and_the_openai_client_sends_it(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(stub.url, api_key_hashes=[hash_key(KEY)])
    missing = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    assert missing.headers["www-authenticate"] == "Bearer"
    assert not stub.requests  # refused before anything reached the tier
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{gateway}/v1", api_key="wrong").models.list()
    good = openai.OpenAI(base_url=f"{gateway}/v1", api_key=KEY)
    assert good.models.list().data[0].id == MODEL
    assert client.get(f"{gateway}/healthz").status_code == 200  # probes stay open
    auth = {"Authorization": f"Bearer {KEY}"}
    assert client.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=auth).is_success
    assert "authorization" not in stub.last_request["headers"]  # the key stays at the gateway


def test_admin_is_off_without_a_key_and_needs_its_own_key(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    off = start_gateway(stub.url)
    assert client.get(f"{off}/admin/tiers").status_code == 403
    gateway = start_gateway(
        stub.url, api_key_hashes=[hash_key(KEY)], admin_key_hashes=[hash_key(ADMIN)]
    )
    as_user = client.get(f"{gateway}/admin/tiers", headers={"Authorization": f"Bearer {KEY}"})
    assert as_user.status_code == 401
    tiers = client.get(f"{gateway}/admin/tiers", headers={"Authorization": f"Bearer {ADMIN}"})
    assert tiers.status_code == 200
    assert tiers.json()["tiers"]["t0"]["state"] == "ready"
    assert tiers.json()["shared_state"] is False  # no Redis configured


def test_rate_limit_answers_429_with_retry_after(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(stub.url, rate_limit_per_minute=2)
    codes = [client.post(f"{gateway}/v1/chat/completions", json=CHAT) for _ in range(3)]
    assert [r.status_code for r in codes] == [200, 200, 429]
    assert codes[2].json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(codes[2].headers["retry-after"]) <= 60
    assert len(stub.requests) == 2


def test_admin_policy_shows_the_policy_and_reloads(
    stub: Any, start_gateway: Any, client: httpx.Client, tmp_path: Path
) -> None:
    policy = tmp_path / "routing.yaml"
    policy.write_text(
        (ROOT / "policies" / "routing.yaml")
        .read_text()
        .replace("[fp16, int8, int4]", "[t0]")
        .replace("tiers: [int4, int8, fp16], derive", "tiers: [t0], derive")
        .replace("tiers: [fp16, int8], derive", "tiers: [t0], derive")
        .replace("escalation:\n  tiers: [int4]", "escalation:\n  tiers: [t0]")
    )
    headers = {"Authorization": f"Bearer {ADMIN}"}
    gateway = start_gateway(
        stub.url,
        admin_key_hashes=[hash_key(ADMIN)],
        policy_path=str(policy),
        watch_policy=False,
    )
    status = client.get(f"{gateway}/admin/policy", headers=headers).json()
    assert status["last_error"] is None
    assert status["policy"]["routes"]["code"]["tiers"] == ["t0"]
    answer = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert (answer.headers["x-route-class"], answer.headers["x-route-tier"]) == ("tolerant", "t0")

    policy.write_text("tiers: [t0]\nroutes: {tolerant: [t9]}\n")
    reloaded = client.post(f"{gateway}/admin/policy/reload", headers=headers).json()
    assert reloaded["outcome"] == "rejected"
    assert "routing.yaml" in reloaded["last_error"]
    assert reloaded["digest"] == status["digest"]
    assert client.post(f"{gateway}/v1/chat/completions", json=CHAT).status_code == 200


def test_an_admin_policy_reload_parses_off_the_event_loop(
    stub: Any,
    start_gateway: Any,
    client: httpx.Client,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The reload ran on the event loop: /healthz, /readyz and every request waited for it.
    routes = "{tolerant: [t0], code: [t0], math: [t0], long: [t0]}"
    policy = tmp_path / "routing.yaml"
    policy.write_text(f"tiers: [t0]\nroutes: {routes}\n")
    headers = {"Authorization": f"Bearer {ADMIN}"}
    gateway = start_gateway(
        stub.url,
        admin_key_hashes=[hash_key(ADMIN)],
        policy_path=str(policy),
        watch_policy=False,
    )

    def slow_parse(*args: Any, **kwargs: Any) -> Any:
        time.sleep(1.0)
        return parse_policy(*args, **kwargs)

    monkeypatch.setattr("gateway.policy.store.parse_policy", slow_parse)
    policy.write_text(f"tiers: [t0]\nroutes: {routes}\n# edited\n")
    outcome: list[str] = []

    def reload() -> None:
        answer = client.post(f"{gateway}/admin/policy/reload", headers=headers, timeout=10)
        outcome.append(answer.json()["outcome"])

    reloading = threading.Thread(target=reload)
    reloading.start()
    time.sleep(0.3)  # the reload is parsing
    started = time.perf_counter()
    assert client.get(f"{gateway}/healthz").status_code == 200
    waited = time.perf_counter() - started
    reloading.join(10)
    assert outcome == ["applied"]
    assert waited < 0.4, f"/healthz waited {waited:.2f} s for the reload"


def test_metrics_count_requests_and_rejections(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(stub.url, api_key_hashes=[hash_key(KEY)])
    auth = {"Authorization": f"Bearer {KEY}"}
    assert client.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=auth).is_success
    assert client.post(f"{gateway}/v1/chat/completions", json=CHAT).status_code == 401
    too_long = {**CHAT, "messages": [{"role": "user", "content": "x " * 3000}]}
    assert client.post(f"{gateway}/v1/chat/completions", json=too_long, headers=auth).is_error
    text = client.get(f"{gateway}/metrics").text
    assert 'gateway_requests_total{class="tolerant",status="200",tier="t0"} 1.0' in text
    assert 'gateway_rejections_total{reason="invalid_api_key"} 1.0' in text
    assert 'gateway_rejections_total{reason="context_length_exceeded"} 1.0' in text
    assert 'gateway_tier_up{tier="t0"} 1.0' in text


def test_keys_never_reach_the_logs(
    stub: Any, start_gateway: Any, client: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    gateway = start_gateway(
        stub.url,
        api_key_hashes=[hash_key(KEY)],
        admin_key_hashes=[hash_key(ADMIN)],
        rate_limit_per_minute=3,
    )
    for key in (KEY, "sk-wrong-secret", ADMIN):
        headers = {"Authorization": f"Bearer {key}"}
        for _ in range(3):
            client.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=headers)
        client.get(f"{gateway}/admin/tiers", headers=headers)
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert caplog.records  # the gateway did log (requests, refusals)
    for secret in (KEY, "sk-wrong-secret", ADMIN):
        assert secret not in logged


def test_a_request_counts_against_the_rate_limit_as_the_sequences_it_generates(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    # n, best_of and list prompts multiply the tier's work; each request counted as one.
    gateway = start_gateway(stub.url, rate_limit_per_minute=4)
    url = f"{gateway}/v1/completions"
    assert client.post(url, json={"prompt": "x", "n": 3}).status_code == 200  # 3 of 4
    refused = client.post(url, json={"prompt": ["x", "y"]})  # 2 more: 5 > 4
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert len(stub.requests) == 1


def test_a_request_costing_more_than_the_whole_rate_limit_is_400(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(stub.url, rate_limit_per_minute=3)
    response = client.post(f"{gateway}/v1/completions", json={"prompt": "x", "n": 4})
    assert response.status_code == 400  # a 429 would be retried for ever
    error = response.json()["error"]
    assert error["code"] == "request_costs_more_than_the_rate_limit"
    assert "4" in error["message"] and "3 per minute" in error["message"]
    assert stub.requests == []


def test_keys_are_checked_under_a_root_path(
    stub: Any, start_server: Any, client: httpx.Client
) -> None:
    # Served with a root path (uvicorn --root-path, a proxy's prefix), scope["path"] carries
    # it: the check saw /api/v1/... as neither /v1 nor /admin and let it through unchecked,
    # while the router, which strips the root path, served it.
    config = GatewayConfig(
        model_name=MODEL,
        tiers=[TierEndpoint(name="t0", base_url=stub.url)],
        api_key_hashes=[hash_key(KEY)],
        admin_key_hashes=[hash_key(ADMIN)],
    )
    gateway = start_server(create_app(config), **server_options(config), root_path="/api")
    assert client.post(f"{gateway}/v1/chat/completions", json=CHAT).status_code == 401
    assert client.get(f"{gateway}/admin/tiers").status_code == 401
    auth = {"Authorization": f"Bearer {KEY}"}
    assert client.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=auth).is_success
    assert stub.requests and len(stub.requests) == 1


def test_admin_requests_are_rate_limited_per_address(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(
        stub.url, admin_key_hashes=[hash_key(ADMIN)], admin_rate_limit_per_minute=3
    )
    good, wrong = {"Authorization": f"Bearer {ADMIN}"}, {"Authorization": "Bearer guess"}
    codes = [client.get(f"{gateway}/admin/tiers", headers=wrong).status_code for _ in range(3)]
    limited = client.get(f"{gateway}/admin/tiers", headers=wrong)
    assert [*codes, limited.status_code] == [401, 401, 401, 429]  # guesses are bounded
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(limited.headers["retry-after"]) >= 1
    # once spent, the right key gets the same 429 as a wrong one: the answer tells nothing
    assert client.get(f"{gateway}/admin/tiers", headers=good).status_code == 429
    assert client.post(f"{gateway}/v1/chat/completions", json=CHAT).status_code == 200  # open
    fresh = start_gateway(
        stub.url, admin_key_hashes=[hash_key(ADMIN)], admin_rate_limit_per_minute=3
    )
    # a valid admin key is never counted (operators' dashboards poll /admin)
    assert [client.get(f"{fresh}/admin/tiers", headers=good).status_code for _ in range(5)] == [
        200
    ] * 5
    assert (
        GatewayConfig(
            model_name="m", tiers=[TierEndpoint(name="a", base_url="http://x")]
        ).admin_rate_limit_per_minute
        == 300
    )


def test_an_admin_key_listed_as_an_api_key_opens_v1_and_shows_the_route_reason(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(
        stub.url,
        api_key_hashes=[hash_key(KEY), hash_key(ADMIN)],
        admin_key_hashes=[hash_key(ADMIN)],
    )
    as_user = client.post(
        f"{gateway}/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {KEY}"}
    )
    assert as_user.status_code == 200 and "x-route-reason" not in as_user.headers
    as_admin = client.post(
        f"{gateway}/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {ADMIN}"}
    )
    assert as_admin.status_code == 200 and as_admin.headers["x-route-reason"]


def _guessing_gateway(stub: Any, start_gateway: Any) -> str:
    return start_gateway(
        stub.url,
        api_key_hashes=[hash_key(KEY)],
        admin_key_hashes=[hash_key(ADMIN)],
        admin_rate_limit_per_minute=3,
    )


def test_keys_guessed_on_v1_spend_the_budget_admin_refuses_too(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = _guessing_gateway(stub, start_gateway)
    url = f"{gateway}/v1/chat/completions"
    guesses = [
        client.post(url, json=CHAT, headers={"Authorization": f"Bearer sk-guess-{i}"})
        for i in range(4)
    ]
    assert [r.status_code for r in guesses] == [401, 401, 401, 429]
    refused = guesses[-1].json()["error"]
    assert refused["code"] == "rate_limit_exceeded" and refused["type"] == "requests"
    assert int(guesses[-1].headers["retry-after"]) >= 1
    # the right key is not looked at: the same 429, on /v1 and on /admin
    right = client.post(url, json=CHAT, headers={"Authorization": f"Bearer {KEY}"})
    assert right.status_code == 429
    admin = client.get(f"{gateway}/admin/tiers", headers={"Authorization": f"Bearer {ADMIN}"})
    assert admin.status_code == 429
    assert len(stub.requests) == 0


def test_keys_guessed_on_admin_spend_the_budget_v1_refuses_too(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = _guessing_gateway(stub, start_gateway)
    wrong = {"Authorization": "Bearer guess"}
    codes = [client.get(f"{gateway}/admin/tiers", headers=wrong).status_code for _ in range(3)]
    assert codes == [401, 401, 401]
    right = client.post(
        f"{gateway}/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {KEY}"}
    )
    assert right.status_code == 429 and right.json()["error"]["code"] == "rate_limit_exceeded"


def test_v1_without_a_key_is_not_a_guess_and_valid_keys_are_not_counted(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = _guessing_gateway(stub, start_gateway)
    url = f"{gateway}/v1/chat/completions"
    assert [client.post(url, json=CHAT).status_code for _ in range(4)] == [401] * 4
    good = {"Authorization": f"Bearer {KEY}"}
    assert [client.post(url, json=CHAT, headers=good).status_code for _ in range(4)] == [200] * 4


def test_an_admin_only_key_does_not_open_v1(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = _guessing_gateway(stub, start_gateway)
    as_admin = client.post(
        f"{gateway}/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {ADMIN}"}
    )
    assert as_admin.status_code == 401 and as_admin.json()["error"]["code"] == "invalid_api_key"
    assert len(stub.requests) == 0


def test_a_spent_budget_frees_when_its_window_passes() -> None:
    import asyncio

    from gateway.key_guesses import GUESS_WINDOW, GuessBudget
    from gateway.shared.state import SharedState

    now = [0.0]
    shared = SharedState(None, clock=lambda: now[0])
    budget = GuessBudget(2, lambda: shared, clock=lambda: now[0])

    async def run() -> list[float | None]:
        return [await budget.failed("10.0.0.1"), await budget.failed("10.0.0.1")]

    assert asyncio.run(run()) == [None, None]  # the second took the last unit
    assert budget.refused_for("10.0.0.1") == GUESS_WINDOW
    assert budget.refused_for("10.0.0.2") is None  # per address
    now[0] = GUESS_WINDOW + 0.5
    assert budget.refused_for("10.0.0.1") is None
    assert asyncio.run(budget.failed("10.0.0.1")) is None
