import socket
import sys
import time
from pathlib import Path

from backends.supervisor import RestartPolicy, Supervisor, next_step, restart_delay
from backends.tier_state import TierState
from backends.vllm_args import TierLaunch

POLICY = RestartPolicy(max_restarts=3, backoff_initial_s=1.0, backoff_max_s=5.0)


def test_backoff_doubles_and_caps() -> None:
    assert [restart_delay(n, POLICY) for n in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_next_step_decisions() -> None:
    assert next_step(TierState.READY, True, 0, 0.0, POLICY) == "nothing"
    assert next_step(TierState.READY, False, 0, 0.0, POLICY) == "mark_down"
    assert next_step(TierState.DRAINING, False, 0, 0.0, POLICY) == "mark_down"
    assert next_step(TierState.DOWN, False, 1, 1.0, POLICY) == "nothing"  # backoff 2 s
    assert next_step(TierState.DOWN, False, 1, 2.5, POLICY) == "restart"
    assert next_step(TierState.DOWN, False, 3, 99.0, POLICY) == "give_up"


def _fake_server(tmp_path: Path) -> Path:
    """A stand-in for vLLM: answers /health on the --port it is given."""
    script = tmp_path / "python"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys, http.server\n"
        "port = int(sys.argv[sys.argv.index('--port') + 1])\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        "http.server.HTTPServer(('127.0.0.1', port), H).serve_forever()\n"
    )
    script.chmod(0o755)
    return script


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_starts_in_turn_restarts_a_crash_and_stops_everything(tmp_path: Path) -> None:
    launches = [
        TierLaunch(name=n, model_dir=tmp_path, served_model_name="m", port=_port())
        for n in ("fp16", "int4")
    ]
    events: list[tuple[str, str]] = []
    warmed: list[str] = []
    sup = Supervisor(
        launches,
        _fake_server(tmp_path),
        tmp_path / "logs",
        RestartPolicy(max_restarts=2, backoff_initial_s=0.2, backoff_max_s=1.0),
        warm_up=lambda launch: warmed.append(launch.name),
        on_state=lambda name, state: events.append((name, state.value)),
        start_timeout=30,
    )
    sup.start_all()
    try:
        assert sup.states() == {"fp16": TierState.READY, "int4": TierState.READY}
        assert warmed == ["fp16", "int4"]
        # fp16 is ready (and warm) before int4 starts.
        assert events.index(("fp16", "ready")) < events.index(("int4", "starting"))
        first = sup.records["int4"].process.process
        assert first is not None
        first.kill()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            proc = sup.records["int4"].process.process
            if proc is not first and sup.states()["int4"] is TierState.READY:
                break
            time.sleep(0.1)
        assert sup.states()["int4"] is TierState.READY
        assert sup.records["int4"].restarts == 1
        assert ("int4", "down") in events
    finally:
        sup.stop_all()
    assert not any(r.process.alive() for r in sup.records.values())
    assert sup.states() == {"fp16": TierState.DOWN, "int4": TierState.DOWN}
