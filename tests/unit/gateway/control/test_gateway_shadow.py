"""Shadow sampling: the pure decision, copies and agreement; the policy section; and the gateway
comparing stub tiers in the background without holding the client."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer, models, pre_tokenizers

from gateway.app import create_app
from gateway.config import GatewayConfig, TierEndpoint
from gateway.control.shadow import (
    COMPARE,
    SKIP,
    Load,
    agreement,
    answer_text,
    decide,
    encoder,
    is_greedy,
    shadow_body,
    text_agreement,
)
from gateway.policy.schema import PolicyError, ShadowPolicy, parse_policy
from gateway.request.tokens.limits import TokenCounter
from gateway.request.tokens.prompt_count import ByteCounter
from tests.integration.conftest import wait_until
from tests.unit.gateway.conftest import MODEL, StubTier

POLICY = ShadowPolicy(fraction=0.5, tiers=["int4", "int8"], reference="fp16", max_concurrent=2)
IDLE = Load(
    running=0,
    gateway_in_flight=0,
    gateway_limit=10,
    reference_state="ready",
    reference_waiting=0.0,
    tier_state="ready",
)


def _decide(tier: str = "int4", draw: float = 0.1, streaming: bool = False, **load: Any) -> str:
    greedy = load.pop("greedy", True)
    return decide(POLICY, tier, draw, streaming, greedy, Load(**{**IDLE.__dict__, **load}))


def test_decide_draws_only_the_shadowed_tiers() -> None:
    assert _decide() == COMPARE
    assert _decide(draw=0.5) == SKIP  # draw >= fraction: not sampled, nothing counted
    assert _decide(tier="fp16") == SKIP and _decide(tier="int2") == SKIP
    off = ShadowPolicy(fraction=0.0)
    assert decide(off, "int4", 0.0, False, True, IDLE) == SKIP


def test_decide_names_why_a_drawn_request_is_dropped() -> None:
    assert _decide(streaming=True) == "streaming"
    assert _decide(reference_state="draining") == "reference_not_ready"
    assert _decide(reference_waiting=1.0) == "reference_busy"
    assert _decide(tier_state="down") == COMPARE  # greedy: the served tier is not asked again
    assert _decide(tier_state="down", greedy=False) == "tier_not_ready"
    assert _decide(running=2) == "slots_full" and _decide(running=1) == COMPARE
    assert _decide(gateway_in_flight=6) == "overloaded"  # more than 0.5 x 10
    assert _decide(gateway_in_flight=5) == COMPARE
    # The gateway's own bounds are named before the tiers' states.
    assert _decide(running=2, reference_waiting=1.0) == "slots_full"


def test_the_draw_follows_the_fraction() -> None:
    rng = random.Random(7)
    drawn = sum(_decide(draw=rng.random()) == COMPARE for _ in range(10_000))
    assert 4_700 < drawn < 5_300


def test_greedy_means_temperature_zero() -> None:
    assert is_greedy({"temperature": 0}) and is_greedy({"temperature": 0.0})
    assert not is_greedy({}) and not is_greedy({"temperature": 0.7})
    assert not is_greedy({"temperature": False}) and not is_greedy({"temperature": "0"})


def test_shadow_copies_are_greedy_whole_and_capped() -> None:
    body = {"messages": [], "stream": True, "stream_options": {}, "n": 3, "max_tokens": 500}
    body |= {"temperature": 0.8, "presence_penalty": 0.5}
    copy = shadow_body(body, "max_tokens", 64)
    assert copy == {
        "messages": [],
        "n": 1,
        "max_tokens": 64,
        "temperature": 0,
        "presence_penalty": 0.5,
    }
    assert shadow_body({"max_completion_tokens": 10}, "max_completion_tokens", 64) == {
        "max_completion_tokens": 10,
        "temperature": 0,
        "n": 1,
    }
    assert shadow_body({}, "max_tokens", 64)["max_tokens"] == 64


def test_answer_text_of_chat_and_completions() -> None:
    chat = {"choices": [{"message": {"role": "assistant", "content": "Paris."}}]}
    assert answer_text(json.dumps(chat).encode()) == "Paris."
    assert answer_text(json.dumps({"choices": [{"text": " Paris"}]}).encode()) == " Paris"
    tool = {"choices": [{"message": {"role": "assistant", "content": None}}]}
    assert answer_text(json.dumps(tool).encode()) is None
    assert answer_text(b"not json") is None and answer_text(b'{"choices": []}') is None


def test_agreement_is_the_common_prefix_over_the_longer_answer() -> None:
    assert agreement([1, 2, 3], [1, 2, 3]) == 1.0
    assert agreement([], []) == 1.0
    assert agreement([1, 2, 3, 4], [1, 2, 9, 4]) == 0.5  # diverges at position 2 of 4
    assert agreement([1, 2], [1, 2, 3, 4]) == 0.5  # one stopped early
    assert agreement([5], [1, 2]) == 0.0
    assert agreement([], [1]) == 0.0


def test_text_agreement_tokenizes_and_cuts_both_answers() -> None:
    words = ["[UNK]", "the", "capital", "of", "france", "is", "paris", "lyon", "."]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, "[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    encode = encoder(TokenCounter(tokenizer))
    same = "the capital of france is paris ."
    assert text_agreement(same, same, encode, 64) == 1.0
    assert text_agreement(same, "the capital of france is lyon .", encode, 64) == 5 / 7
    # Cut to 3 tokens, the answers agree on all of them.
    assert text_agreement(same, "the capital of france is lyon .", encode, 3) == 1.0
    assert text_agreement("ab", "ac", encoder(ByteCounter()), 64) == 0.5  # no tokenizer: bytes


MINIMAL = """\
tiers: [fp16, int8, int4]
routes: {tolerant: [int4], code: [fp16], math: [fp16], long: [fp16]}
"""


def test_policy_shadow_defaults_and_checks() -> None:
    default = parse_policy(MINIMAL).shadow
    assert (default.fraction, default.tiers, default.reference) == (0.0, ["int4", "int8"], "fp16")
    shipped = Path(__file__).resolve().parents[4] / "policies" / "routing.yaml"
    assert parse_policy(shipped.read_text()).shadow.max_tokens == 64
    with pytest.raises(PolicyError, match=r"t.yaml:5: shadow.tiers\[0\]: unknown tier int2"):
        parse_policy(MINIMAL + "shadow:\n  fraction: 0.1\n  tiers: [int2]\n", "t.yaml")
    with pytest.raises(PolicyError, match=r"shadow.reference: unknown tier bf16"):
        parse_policy(MINIMAL + "shadow: {fraction: 0.1, reference: bf16}\n")
    with pytest.raises(PolicyError, match=r"shadow.tiers\[1\]: fp16 is the reference tier"):
        parse_policy(MINIMAL + "shadow: {fraction: 0.1, tiers: [int4, fp16]}\n")
    with pytest.raises(PolicyError, match=r"shadow.fraction: Input should be less than"):
        parse_policy(MINIMAL + "shadow: {fraction: 1.5}\n")
    # Off, the tier names are not checked (the gateway's default policy has other tiers).
    assert parse_policy(MINIMAL + "shadow: {tiers: [t9]}\n").shadow.tiers == ["t9"]


# --------------------------------------------------------------------------- the gateway


def metric_values(client: httpx.Client, gateway: str) -> dict[str, float]:
    """Every sample of the gateway's /metrics as ``name{label=value,...}`` -> value."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(client.get(f"{gateway}/metrics").text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def shadow_gateway(
    tmp_path: Path,
    start_gateway: Callable[..., str],
    reference: StubTier,
    served: StubTier,
    **shadow: Any,
) -> str:
    """A gateway routing everything to ``served`` (t1), shadowing it against ``reference`` (t0)."""
    settings = {"fraction": 1.0, "tiers": ["t1"], "reference": "t0", **shadow}
    policy = tmp_path / "routing.yaml"
    policy.write_text(
        "tiers: [t0, t1]\n"
        "routes: {tolerant: [t1], code: [t1], math: [t1], long: [t1]}\n"
        f"shadow: {json.dumps(settings)}\n"
    )
    return start_gateway(reference.url, served.url, policy_path=str(policy), metrics_interval=0.2)


CHAT = {"messages": [{"role": "user", "content": "Capital of France?"}], "max_tokens": 200}


def test_a_greedy_answer_is_compared_with_one_reference_copy(
    tmp_path: Path,
    make_stub: Callable[[], StubTier],
    start_gateway: Callable[..., str],
    client: httpx.Client,
) -> None:
    reference, served = make_stub(), make_stub()
    gateway = shadow_gateway(tmp_path, start_gateway, reference, served, max_tokens=16)
    answer = client.post(f"{gateway}/v1/chat/completions", json={**CHAT, "temperature": 0})
    assert answer.status_code == 200 and answer.headers["x-route-tier"] == "t1"
    wait_until(
        lambda: metric_values(client, gateway).get("gateway_shadow_comparisons_total{tier=t1}"), 10
    )
    values = metric_values(client, gateway)
    assert values["gateway_shadow_agreement_sum{tier=t1}"] == 1.0  # the stubs answer alike
    assert values.get("gateway_shadow_deviations_total{tier=t1}", 0.0) == 0.0
    assert len(served.requests) == 1  # the client's answer was reused
    copy = reference.last_request["body"]
    assert (copy["temperature"], copy["max_tokens"], copy["n"]) == (0, 16, 1)
    # The copy is not a client request: one request counted, and it was t1's.
    requests = {k: v for k, v in values.items() if k.startswith("gateway_requests_total")}
    assert list(requests.values()) == [1.0] and "tier=t1" in next(iter(requests))


def test_a_sampled_answer_sends_greedy_copies_to_both_tiers_and_counts_a_deviation(
    tmp_path: Path,
    make_stub: Callable[[], StubTier],
    start_gateway: Callable[..., str],
    client: httpx.Client,
) -> None:
    reference, served = make_stub(), make_stub()
    reference.answer_text = "The capital of France is Lyon."
    gateway = shadow_gateway(tmp_path, start_gateway, reference, served)
    assert client.post(f"{gateway}/v1/chat/completions", json=CHAT).status_code == 200
    wait_until(
        lambda: metric_values(client, gateway).get("gateway_shadow_deviations_total{tier=t1}"), 10
    )
    values = metric_values(client, gateway)
    assert values["gateway_shadow_comparisons_total{tier=t1}"] == 1.0
    assert 0.0 < values["gateway_shadow_agreement_sum{tier=t1}"] < 0.9
    assert len(served.requests) == 2 and served.last_request["body"]["temperature"] == 0
    assert "temperature" not in served.requests[0]["body"]  # the client's own request


def test_the_client_is_answered_while_its_shadow_runs_and_a_full_slot_drops(
    tmp_path: Path,
    make_stub: Callable[[], StubTier],
    start_gateway: Callable[..., str],
    client: httpx.Client,
) -> None:
    reference, served = make_stub(), make_stub()
    reference.mode = "hang"  # the reference copy never answers
    gateway = shadow_gateway(
        tmp_path, start_gateway, reference, served, max_concurrent=1, timeout_seconds=2
    )
    greedy = {**CHAT, "temperature": 0}
    assert client.post(f"{gateway}/v1/chat/completions", json=greedy).status_code == 200
    values = metric_values(client, gateway)
    assert values["gateway_shadow_in_flight{}"] == 1.0  # answered while its shadow still runs
    assert client.post(f"{gateway}/v1/chat/completions", json=greedy).status_code == 200
    values = metric_values(client, gateway)
    assert values["gateway_shadow_dropped_total{reason=slots_full,tier=t1}"] == 1.0
    # The hanging copy is given up after timeout_seconds, and its connection closed.
    wait_until(
        lambda: metric_values(client, gateway).get(
            "gateway_shadow_dropped_total{reason=timeout,tier=t1}"
        ),
        10,
    )
    assert reference.request_aborted.wait(10)
    assert metric_values(client, gateway)["gateway_shadow_in_flight{}"] == 0.0


def test_streamed_requests_are_counted_as_dropped(
    tmp_path: Path,
    make_stub: Callable[[], StubTier],
    start_gateway: Callable[..., str],
    client: httpx.Client,
) -> None:
    reference, served = make_stub(), make_stub()
    gateway = shadow_gateway(tmp_path, start_gateway, reference, served)
    answer = client.post(f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True})
    assert answer.status_code == 200 and "[DONE]" in answer.text
    values = metric_values(client, gateway)
    assert values["gateway_shadow_dropped_total{reason=streaming,tier=t1}"] == 1.0
    assert reference.requests == []


def test_a_comparison_is_its_own_span_linked_to_the_request(
    tmp_path: Path,
    make_stub: Callable[[], StubTier],
    start_server: Callable[[Any], str],
    client: httpx.Client,
) -> None:
    reference, served = make_stub(), make_stub()
    policy = tmp_path / "routing.yaml"
    policy.write_text(
        "tiers: [t0, t1]\nroutes: {tolerant: [t1], code: [t1], math: [t1], long: [t1]}\n"
        "shadow: {fraction: 1.0, tiers: [t1], reference: t0}\n"
    )
    tiers = [
        TierEndpoint(name="t0", base_url=reference.url),
        TierEndpoint(name="t1", base_url=served.url),
    ]
    config = GatewayConfig(model_name=MODEL, tiers=tiers, policy_path=str(policy))
    exporter = InMemorySpanExporter()
    gateway = start_server(create_app(config, span_exporter=exporter))
    greedy = {**CHAT, "temperature": 0}
    assert client.post(f"{gateway}/v1/chat/completions", json=greedy).status_code == 200
    names = ("gateway.shadow", "POST /v1/chat/completions")  # the request's is the server span
    wait_until(lambda: set(names) <= {s.name for s in exporter.get_finished_spans()}, 10)
    spans = exporter.get_finished_spans()
    (shadow,) = [s for s in spans if s.name == "gateway.shadow"]
    (request,) = [s for s in spans if s.name == "POST /v1/chat/completions"]
    assert shadow.parent is None and shadow.context.trace_id != request.context.trace_id
    assert [link.context.span_id for link in shadow.links] == [request.context.span_id]
    assert shadow.attributes is not None and shadow.attributes["gateway.shadow.agreement"] == 1.0
    # The reference copy carried the shadow span's trace, not the client's.
    traceparent = reference.last_request["headers"]["traceparent"]
    assert traceparent.split("-")[1] == f"{shadow.context.trace_id:032x}"
