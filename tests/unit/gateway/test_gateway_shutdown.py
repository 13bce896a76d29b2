"""A shutdown is bounded (gateway/server.py, gateway/serving.py): after SIGTERM uvicorn stops
accepting and lets requests finish for ``shutdown_timeout``; a stream still open then ends
with an error event (503 ``shutting_down``) and ``[DONE]``, and the server exits shortly
after — never after the tier's ``read_timeout``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from backends.process import free_port
from gateway.app import create_app
from gateway.config import GatewayConfig, TierEndpoint
from gateway.server import SHUTDOWN_FLUSH, server_options
from tests.servers import ServerThread
from tests.stub_tier import MODEL

WAIT = 10.0
COUNT = {"messages": [{"role": "user", "content": "Count."}]}


@contextlib.contextmanager
def _gateway(stub: Any, shutdown_timeout: float) -> Iterator[ServerThread]:
    """A gateway in front of ``stub`` with ``shutdown_timeout``, stopped on the way out."""
    config = GatewayConfig(
        model_name=MODEL,
        tiers=[TierEndpoint(name="t0", base_url=stub.url)],
        shutdown_timeout=shutdown_timeout,
    )
    options = server_options(config)
    assert options["timeout_graceful_shutdown"] == shutdown_timeout + SHUTDOWN_FLUSH
    server = ServerThread(create_app(config), graceful=None, **options)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_a_stream_open_at_shutdown_ends_with_an_error_event_within_the_bound(stub: Any) -> None:
    stub.mode = "slow"  # 400 chunks, one every 50 ms: 20 s, far past the bound
    got: list[bytes] = []
    first = threading.Event()
    with _gateway(stub, shutdown_timeout=1.0) as server:

        def read() -> None:
            with (
                httpx.Client(trust_env=False, timeout=WAIT) as client,
                client.stream(
                    "POST", f"{server.url}/v1/chat/completions", json=COUNT | {"stream": True}
                ) as answer,
            ):
                for part in answer.iter_bytes():
                    got.append(part)
                    first.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert first.wait(WAIT)
        started = time.monotonic()
        server.server.should_exit = True  # what uvicorn's SIGTERM handler does
        server.thread.join(1.0 + SHUTDOWN_FLUSH + 3.0)
        stopped = time.monotonic() - started
        assert not server.thread.is_alive(), "the server outlived its shutdown bound"
        reader.join(WAIT)
    assert 1.0 <= stopped < 1.0 + SHUTDOWN_FLUSH + 3.0
    events = [e for e in b"".join(got).decode().split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "shutting_down" and error["type"] == "server_error"
    assert set(error) == {"message", "type", "param", "code"}
    assert len(events) > 3  # the answer went on until the bound: finished requests are let be


def test_a_stream_that_ends_before_the_bound_is_not_cut(stub: Any) -> None:
    stub.chunks = 5
    with (
        _gateway(stub, shutdown_timeout=5.0) as server,
        httpx.Client(trust_env=False, timeout=WAIT) as client,
    ):
        with client.stream(
            "POST", f"{server.url}/v1/chat/completions", json=COUNT | {"stream": True}
        ) as answer:
            started = time.monotonic()
            server.server.should_exit = True
            text = answer.read().decode()
        server.thread.join(WAIT)
        assert time.monotonic() - started < 5.0  # it left as soon as its stream was done
    assert "shutting_down" not in text and text.endswith("data: [DONE]\n\n")


def test_a_whole_answer_awaited_at_shutdown_gets_503_shutting_down(stub: Any) -> None:
    stub.whole_delay = 20.0  # the tier takes far past the bound
    answers: list[httpx.Response] = []
    with _gateway(stub, shutdown_timeout=1.0) as server:

        def ask() -> None:
            with httpx.Client(trust_env=False, timeout=WAIT) as client:
                answers.append(client.post(f"{server.url}/v1/chat/completions", json=COUNT))

        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        deadline = time.monotonic() + WAIT
        while not stub.requests:  # the tier has it
            assert time.monotonic() < deadline
            time.sleep(0.01)
        server.server.should_exit = True
        server.thread.join(1.0 + SHUTDOWN_FLUSH + 3.0)
        assert not server.thread.is_alive(), "the server outlived its shutdown bound"
        asker.join(WAIT)
    [answer] = answers
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "shutting_down"


def test_sigterm_to_python_m_gateway_ends_an_open_stream_and_the_process(
    stub: Any, tmp_path: Path
) -> None:
    """The real entry point and signal: compose and Kubernetes run ``python -m gateway``."""
    stub.mode = "slow"
    port = free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(
        f"model_name: {MODEL}\ntiers: [{{name: t0, base_url: '{stub.url}'}}]\n"
        "shutdown_timeout: 1.0\n"
    )
    root = Path(__file__).resolve().parents[3]
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "--config", str(config), "--port", str(port)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30.0
        with httpx.Client(trust_env=False, timeout=WAIT) as client:
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if client.get(f"{url}/healthz").status_code == 200:
                        break
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
            chat = {"messages": [{"role": "user", "content": "Count."}], "stream": True}
            with client.stream("POST", f"{url}/v1/chat/completions", json=chat) as answer:
                parts = answer.iter_bytes()
                got = [next(parts)]
                started = time.monotonic()
                process.send_signal(signal.SIGTERM)
                got.extend(parts)
        process.wait(1.0 + SHUTDOWN_FLUSH + 5.0)
        stopped = time.monotonic() - started
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = b"".join(got).decode()
    assert '"code":"shutting_down"' in text and text.endswith("data: [DONE]\n\n")
    assert stopped < 1.0 + SHUTDOWN_FLUSH + 5.0
