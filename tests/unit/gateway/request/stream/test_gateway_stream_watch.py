"""gateway/request/stream/stream_watch.py: held back, released, cut before the degenerate text; and
escalation through a real gateway over stub tiers (127.0.0.1)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from gateway.config import hash_key
from gateway.request.events.chunk import read_chunk
from gateway.request.events.sse import payloads
from gateway.request.stream.degeneration import LoopCheck, ScriptCheck
from gateway.request.stream.stream_watch import KEEP, StreamWatch

MODEL = "stub-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Capital of France?"}]}


def chunk(text: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    return b"data: " + json.dumps({"id": "a", "choices": [choice]}).encode() + b"\n\n"


def texts(events: bytes) -> str:
    chunks = [read_chunk(data, chat=True) for data in payloads(events)]
    return "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)


def watch(holdback: int = 10) -> StreamWatch:
    return StreamWatch(LoopCheck(8, 4, 12), ScriptCheck(16, 2), holdback, chat=True)


def test_text_is_held_until_holdback_characters_follow_it_and_released_at_the_end() -> None:
    w = watch(holdback=10)
    assert w.feed(chunk("Hello ")) == b""  # 6 characters: held
    out = w.feed(chunk("there, how are"))  # 20 now: "Hello " is 14 behind the end
    assert texts(out) == "Hello "
    out = w.feed(chunk(" you?", finish="stop") + b"data: [DONE]\n\n")
    assert texts(out) == "there, how are you?" and out.endswith(b"data: [DONE]\n\n")
    assert w.verdict is None and w.sent == len("Hello there, how are you?")


def test_a_loop_within_the_held_text_is_cut_before_it_is_sent() -> None:
    w = watch(holdback=40)
    out = w.feed(chunk("Sure: ") + b"".join(chunk("ISS") for _ in range(6)))
    assert w.verdict is not None and w.verdict.kind == "loop"
    assert texts(out) == "Sure: ISS"  # the first occurrence kept, the repeats never sent
    assert w.text == "Sure: ISS" and w.sent == len("Sure: ISS")


def test_a_cut_inside_one_event_shortens_that_event() -> None:
    w = watch(holdback=40)
    out = w.feed(chunk("Ok " + "ab" * 8))
    assert texts(out) == "Ok ab" and w.verdict is not None


def test_a_shortened_event_keeps_the_logprobs_of_the_tokens_it_keeps_only() -> None:
    tokens = ["Ok", " ", "ab", "ab", "ab", "ab", "ab", "ab", "ab", "ab"]
    content = [{"token": t, "logprob": -0.5, "top_logprobs": []} for t in tokens]
    choice = {"index": 0, "delta": {"content": "".join(tokens)}, "logprobs": {"content": content}}
    w = watch(holdback=40)
    out = w.feed(b"data: " + json.dumps({"id": "a", "choices": [choice]}).encode() + b"\n\n")
    assert texts(out) == "Ok ab" and w.verdict is not None
    kept = json.loads(payloads(out)[0])["choices"][0]["logprobs"]["content"]
    assert [entry["token"] for entry in kept] == ["Ok", " ", "ab"]


def test_a_shortened_completion_event_keeps_its_lists_in_step() -> None:
    tokens = ["Ok", " ", "ab", "ab", "ab", "ab", "ab", "ab", "ab", "ab"]
    logprobs = {
        "tokens": tokens,
        "token_logprobs": [-0.5] * len(tokens),
        "top_logprobs": [None] * len(tokens),
        "text_offset": [0, 2, 3, 5, 7, 9, 11, 13, 15, 17],
    }
    choice = {"index": 0, "text": "".join(tokens), "logprobs": logprobs, "finish_reason": None}
    w = StreamWatch(LoopCheck(8, 4, 12), ScriptCheck(16, 2), 40, chat=False)
    out = w.feed(b"data: " + json.dumps({"id": "a", "choices": [choice]}).encode() + b"\n\n")
    event = json.loads(payloads(out)[0])["choices"][0]
    assert event["text"] == "Ok ab"
    assert event["logprobs"] == {
        "tokens": ["Ok", " ", "ab"],
        "token_logprobs": [-0.5] * 3,
        "top_logprobs": [None] * 3,
        "text_offset": [0, 2, 3],
    }


def test_a_verdict_never_takes_back_what_was_sent() -> None:
    w = watch(holdback=0)  # nothing held: every event goes at once
    sent = b"".join(w.feed(chunk("ab")) for _ in range(5))
    assert texts(sent) == "ab" * 5 and w.verdict is None  # 10 characters: not yet a loop
    out = w.feed(chunk("ab"))
    assert w.verdict is not None and texts(out) == ""
    assert w.verdict.cut == 10  # where the sent text ends, not after the first "ab"


def test_garbage_scripts_are_cut_at_the_third_script() -> None:
    w = watch(holdback=40)
    out = w.feed(chunk("Paris est ") + chunk("ბა%(Β¥#ינג"))
    assert w.verdict is not None and w.verdict.kind == "scripts"
    assert texts(out) == "Paris est ბა%(Β¥#"


def test_resume_drops_what_was_held() -> None:
    w = watch(holdback=40)
    w.feed(chunk("Hello there"))
    w.resume()
    assert (w.text, w.sent) == ("", 0)


# --- through the gateway ------------------------------------------------------------------


def _stream(client: httpx.Client, url: str) -> list[str]:
    with client.stream("POST", url, json={**CHAT, "stream": True, "max_tokens": 60}) as answer:
        assert answer.status_code == 200
        return [line for line in answer.iter_lines() if line]


def _content(lines: list[str]) -> str:
    payloads = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert not any("error" in p for p in payloads), lines
    return "".join(p["choices"][0]["delta"].get("content") or "" for p in payloads)


def test_a_looping_tier_is_cut_and_continued_on_the_next(
    make_stub: Any, start_gateway: Any, client: httpx.Client, two_tier_policy: Any
) -> None:
    looping, healthy = make_stub(), make_stub()
    looping.stream_texts = ["De la ", "bibli", "é", *["KISS"] * 30]
    healthy.stream_texts = ["Paris."]
    policy = two_tier_policy(escalation="{tiers: [t0], holdback_chars: 64}")
    gateway = start_gateway(looping.url, healthy.url, policy_path=policy, watch_policy=False)
    lines = _stream(client, f"{gateway}/v1/chat/completions")
    assert _content(lines) == "De la bibliéKISS" + "Paris."
    assert ": answer continued on tier t1 after tier t0 degenerated (loop)" in lines
    assert lines.count("data: [DONE]") == 1 and lines[-1] == "data: [DONE]"
    sent = healthy.last_request["body"]
    assert sent["messages"][-1] == {"role": "assistant", "content": "De la bibliéKISS"}
    metrics = client.get(f"{gateway}/metrics").text
    labels = 'class="tolerant",from_tier="t0",kind="loop",to_tier="t1"'
    assert f"gateway_stream_escalations_total{{{labels}}} 1.0" in metrics


def test_unwatched_tiers_and_healthy_answers_pass_unchanged(
    make_stub: Any, start_gateway: Any, client: httpx.Client, two_tier_policy: Any
) -> None:
    looping, healthy = make_stub(), make_stub()
    looping.stream_texts = ["ab"] * 30
    policy = two_tier_policy(escalation="{tiers: [], holdback_chars: 64}")  # off
    gateway = start_gateway(looping.url, healthy.url, policy_path=policy, watch_policy=False)
    assert _content(_stream(client, f"{gateway}/v1/chat/completions")) == "ab" * 30
    assert healthy.requests == []
    looping.stream_texts = ["The capital ", "of France ", "is Paris."]
    policy = two_tier_policy(escalation="{tiers: [t0]}")
    watched = start_gateway(looping.url, healthy.url, policy_path=policy, watch_policy=False)
    text = _content(_stream(client, f"{watched}/v1/chat/completions"))
    assert text == "The capital of France is Paris." and healthy.requests == []


def test_the_degenerate_tier_is_closed_not_left_generating(
    make_stub: Any, start_gateway: Any, client: httpx.Client, two_tier_policy: Any
) -> None:
    looping, healthy = make_stub(), make_stub()
    looping.mode = "slow"  # a chunk every 50 ms: it would go on generating unless closed
    looping.stream_texts = ["Hi ", *["KISS"] * 100]
    policy = two_tier_policy(escalation="{tiers: [t0], holdback_chars: 64}")
    gateway = start_gateway(looping.url, healthy.url, policy_path=policy, watch_policy=False)
    assert _content(_stream(client, f"{gateway}/v1/chat/completions")).startswith("Hi KISSw0")
    assert looping.stream_cancelled.wait(10)  # its connection closed: vLLM would abort
    assert not looping.stream_finished.is_set()


def test_held_text_reaches_the_client_when_no_tier_can_continue(
    make_stub: Any, start_gateway: Any, client: httpx.Client, two_tier_policy: Any, refused_url: str
) -> None:
    dying = make_stub()
    dying.mode = "die"  # two chunks, then the connection drops
    dying.stream_texts = ["Hello ", "there ", "friend"]
    policy = two_tier_policy(escalation="{tiers: [t0], holdback_chars: 64}")  # both chunks held
    gateway = start_gateway(dying.url, refused_url, policy_path=policy, watch_policy=False)
    with client.stream(
        "POST", f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}
    ) as answer:
        lines = [line for line in answer.iter_lines() if line]
    payloads = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert "error" in payloads[-1] and lines[-1] == "data: [DONE]"
    text = "".join(p["choices"][0]["delta"].get("content") or "" for p in payloads[:-1])
    assert text == "Hello there "


def test_the_watch_keeps_a_bounded_tail_of_a_long_answer() -> None:
    w = watch(holdback=10)
    for i in range(60_000):
        w.feed(chunk(f"w{i} "))
    assert w.end == sum(len(f"w{i} ") for i in range(60_000)) and w.verdict is None
    assert len(w.text) <= 2 * (KEEP + 10)


def test_a_tier_that_keeps_escalating_a_class_is_withheld_from_it(
    make_stub: Any, start_gateway: Any, client: httpx.Client, two_tier_policy: Any
) -> None:
    looping, healthy = make_stub(), make_stub()
    looping.stream_texts = ["Hi ", *["KISS"] * 30]
    guard = "{window: 4, min_samples: 2, max_rate: 0.5, per_key: false}"  # one client
    policy = two_tier_policy(escalation=f"{{tiers: [t0], holdback_chars: 64, guard: {guard}}}")
    gateway = start_gateway(looping.url, healthy.url, policy_path=policy, watch_policy=False)
    url = f"{gateway}/v1/chat/completions"
    for _ in range(2):  # two of two watched streams escalated: over the 50 % allowed
        assert ": answer continued on tier t1 after tier t0 degenerated (loop)" in _stream(
            client, url
        )
    asked = len(looping.requests)
    with client.stream("POST", url, json={**CHAT, "stream": True}) as answer:
        assert answer.headers["x-route-tier"] == "t1"  # t0 withheld from the class
        answer.read()
    assert len(looping.requests) == asked
    metrics = client.get(f"{gateway}/metrics").text
    assert 'gateway_live_guard_trips_total{class="tolerant",tier="t0"} 1.0' in metrics


def _logprob_chunk(text: str, *logprobs: float) -> bytes:
    content = [{"token": "t", "logprob": lp} for lp in logprobs]
    choice = {"index": 0, "delta": {"content": text}, "logprobs": {"content": content}}
    return b"data: " + json.dumps({"id": "a", "choices": [choice]}).encode() + b"\n\n"


def test_low_confidence_cuts_where_its_window_began() -> None:
    from gateway.request.stream.degeneration import ConfidenceCheck

    confident = ConfidenceCheck(window_tokens=3, min_mean=-4.0)
    watching = StreamWatch(None, None, 10, chat=True, confidence=confident)
    out = watching.feed(_logprob_chunk("Paris is ", -0.1, -0.2) + _logprob_chunk("the ", -0.1))
    out += watching.feed(_logprob_chunk("capital", -0.3))
    assert texts(out) == "Paris is "  # "the capital" held back
    out += watching.feed(_logprob_chunk("zq", -9.0) + _logprob_chunk("vx", -8.0))
    assert watching.verdict is not None and watching.verdict.kind == "logprob"
    # The window (-0.3, -9, -8) drops at "zq": the answer is cut before it.
    assert texts(out) == "Paris is the capital"
    # Without logprobs in the events (the client did not ask), the check sees nothing.
    plain = StreamWatch(None, None, 0, chat=True, confidence=confident)
    plain.feed(chunk("zq") + chunk("vx") + chunk("wy"))
    assert plain.verdict is None


def test_a_tier_losing_confidence_is_escalated_when_the_client_asked_logprobs(
    make_stub: Any, start_gateway: Any, client: httpx.Client, two_tier_policy: Any
) -> None:
    unsure, healthy = make_stub(), make_stub()
    unsure.stream_texts = ["Paris ", "is ", "zq", "vx", "wy", "kj"]
    unsure.stream_logprobs = [-0.1, -0.2, -9.0, -8.0, -9.5, -7.0]
    healthy.stream_texts = ["the capital."]
    rule = "{tiers: [t0], holdback_chars: 64, logprobs: {window_tokens: 3, min_mean: -4.0}}"
    gateway = start_gateway(
        unsure.url, healthy.url, policy_path=two_tier_policy(escalation=rule), watch_policy=False
    )
    body = {**CHAT, "stream": True, "max_tokens": 60, "logprobs": True}
    with client.stream("POST", f"{gateway}/v1/chat/completions", json=body) as answer:
        lines = [line for line in answer.iter_lines() if line]
    assert _content(lines) == "Paris is " + "the capital."
    assert ": answer continued on tier t1 after tier t0 degenerated (logprob)" in lines
    # Asked without logprobs, the same answer carries none to judge: not escalated.
    unsure.stream_logprobs = None
    assert _content(_stream(client, f"{gateway}/v1/chat/completions")) == "Paris is zqvxwykj"


def test_one_key_cannot_withhold_a_tier_from_a_class_many_keys_can(
    make_stub: Any, start_gateway: Any, client: httpx.Client, two_tier_policy: Any
) -> None:
    """Issue 35, item 16: with escalation.guard.per_key (the default), one API key's escalated
    streams count at most max(1, max_rate x min_samples) of a window."""
    looping, healthy = make_stub(), make_stub()
    looping.stream_texts = ["Hi ", *["KISS"] * 30]
    guard = "{window: 10, min_samples: 4, max_rate: 0.5}"  # one key counts at most 2
    policy = two_tier_policy(escalation=f"{{tiers: [t0], holdback_chars: 64, guard: {guard}}}")
    keys = [f"key-{i}" for i in range(3)]
    gateway = start_gateway(
        looping.url, healthy.url, policy_path=policy, watch_policy=False,
        api_key_hashes=[hash_key(key) for key in keys],
    )  # fmt: skip
    url = f"{gateway}/v1/chat/completions"

    def escalates(key: str) -> bool:
        headers = {"Authorization": f"Bearer {key}"}
        with client.stream("POST", url, json={**CHAT, "stream": True}, headers=headers) as answer:
            lines = [line for line in answer.iter_lines() if line]
            return answer.headers["x-route-tier"] == "t0" and any("degenerated" in x for x in lines)

    for _ in range(6):  # one tenant, escalating every time: the class keeps its tier
        assert escalates(keys[0])
    metrics = client.get(f"{gateway}/metrics").text
    assert "gateway_live_guard_trips_total{" not in metrics
    assert escalates(keys[1])  # a second tenant's two: four of four count, over 50 %
    assert escalates(keys[1])
    with client.stream("POST", url, json={**CHAT, "stream": True},
                       headers={"Authorization": f"Bearer {keys[2]}"}) as answer:  # fmt: skip
        assert answer.headers["x-route-tier"] == "t1"  # t0 withheld from the class
    metrics = client.get(f"{gateway}/metrics").text
    assert 'gateway_live_guard_trips_total{class="tolerant",tier="t0"} 1.0' in metrics
