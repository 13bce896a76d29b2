import socket
import sys
import time
from pathlib import Path

from backends.commands import Programs
from backends.launch import TierLaunch
from backends.supervisor import (
    RestartPolicy,
    Supervisor,
    next_step,
    recent_restarts,
    restart_delay,
)
from backends.tier_state import TierState
from tests.servers import port_is_free

POLICY = RestartPolicy(max_restarts=3, backoff_initial_s=1.0, backoff_max_s=5.0, window_s=60.0)


def test_backoff_doubles_and_caps() -> None:
    assert [restart_delay(n, POLICY) for n in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_next_step_decisions() -> None:
    assert next_step(TierState.READY, True, 0, 0.0, POLICY) == "nothing"
    assert next_step(TierState.READY, False, 0, 0.0, POLICY) == "mark_down"
    assert next_step(TierState.DRAINING, False, 0, 0.0, POLICY) == "mark_down"
    assert next_step(TierState.DOWN, False, 1, 1.0, POLICY) == "nothing"  # backoff 2 s
    assert next_step(TierState.DOWN, False, 1, 2.5, POLICY) == "restart"
    assert next_step(TierState.DOWN, False, 3, 99.0, POLICY) == "capped"


def test_a_live_tier_that_misses_health_probes_in_a_row_is_hung() -> None:
    policy = RestartPolicy(health_misses=3)
    assert next_step(TierState.READY, True, 0, 0.0, policy, misses=2) == "nothing"
    assert next_step(TierState.READY, True, 0, 0.0, policy, misses=3) == "hung"
    assert next_step(TierState.STARTING, True, 0, 0.0, policy, misses=3) == "nothing"


def test_the_restart_cap_is_a_rate() -> None:
    """At most max_restarts restarts in any window_s seconds: old restarts stop counting."""
    times = [0.0, 10.0, 50.0]
    assert recent_restarts(times, 55.0, POLICY) == 3  # all within the last 60 s: capped
    assert next_step(TierState.DOWN, False, recent_restarts(times, 55.0, POLICY), 99.0, POLICY)
    assert recent_restarts(times, 60.5, POLICY) == 2  # the first left the window
    assert recent_restarts(times, 200.0, POLICY) == 0  # backoff starts over, too
    step = next_step(TierState.DOWN, False, recent_restarts(times, 200.0, POLICY), 1.0, POLICY)
    assert step == "restart"


def _restarted(sup: Supervisor, name: str, before: object, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = sup.records[name].process.process
        if proc is not before and sup.states()[name] is TierState.READY:
            return True
        time.sleep(0.1)
    return False


def test_a_tier_that_crashes_once_per_window_is_always_restarted(tmp_path: Path) -> None:
    """One restart allowed per second: a crash, a quiet second, a crash again: both restarted
    (a cap per lifetime gave up on the second)."""
    launch = TierLaunch(name="int4", model_dir=tmp_path, served_model_name="m", port=_port())
    policy = RestartPolicy(max_restarts=1, backoff_initial_s=0.1, backoff_max_s=0.1, window_s=1.0)
    sup = Supervisor(
        [launch], Programs(vllm_python=_fake_server(tmp_path)), tmp_path / "logs", policy
    )
    sup.start_all()
    try:
        for crash in (1, 2):
            first = sup.records["int4"].process.process
            assert first is not None
            first.kill()
            assert _restarted(sup, "int4", first), sup.records["int4"].history
            assert sup.records["int4"].restarts == crash
            time.sleep(1.2)  # the restart leaves the window
    finally:
        sup.stop_all()


def test_a_slow_restart_does_not_hold_up_another_tiers(tmp_path: Path) -> None:
    """int4's restart takes 30 s to become healthy; fp16, crashed meanwhile, is restarted in
    seconds (one supervising thread per tier; a single one waited for int4 first)."""
    launches = [
        TierLaunch(name=n, model_dir=tmp_path, served_model_name="m", port=_port())
        for n in ("fp16", "int4")
    ]
    policy = RestartPolicy(max_restarts=3, backoff_initial_s=0.1, backoff_max_s=0.1)
    sup = Supervisor(
        launches,
        Programs(vllm_python=_fake_server(tmp_path)),
        tmp_path / "logs",
        policy,
        start_timeout=60,
    )
    sup.start_all()
    try:
        (tmp_path / f"slow-{launches[1].port}").touch()  # int4's next start: 30 s
        int4 = sup.records["int4"].process.process
        assert int4 is not None
        int4.kill()
        deadline = time.monotonic() + 10
        while (
            sup.records["int4"].process.process is int4 or not sup.records["int4"].process.alive()
        ):
            assert time.monotonic() < deadline, sup.records["int4"].history
            time.sleep(0.05)
        assert sup.states()["int4"] is TierState.STARTING
        fp16 = sup.records["fp16"].process.process
        assert fp16 is not None
        fp16.kill()
        assert _restarted(sup, "fp16", fp16, timeout=10), sup.records["fp16"].history
        assert sup.states()["int4"] is TierState.STARTING  # still on its slow start
    finally:
        sup.stop_all()


def test_a_hung_tier_is_killed_and_restarted(tmp_path: Path) -> None:
    """The process lives on but /health stops answering: after health_misses probes in a row
    the supervisor kills its process group and restarts it (it was never restarted before)."""
    launch = TierLaunch(name="int8", model_dir=tmp_path, served_model_name="m", port=_port())
    policy = RestartPolicy(
        backoff_initial_s=0.1, health_interval_s=0.2, health_timeout_s=0.5, health_misses=3
    )
    sup = Supervisor(
        [launch], Programs(vllm_python=_fake_server(tmp_path)), tmp_path / "logs", policy
    )
    sup.start_all()
    try:
        hung = sup.records["int8"].process.process
        assert hung is not None
        (tmp_path / f"hang-{hung.pid}").touch()
        assert _restarted(sup, "int8", hung), sup.records["int8"].history
        assert hung.poll() is not None  # killed, not left running beside the new one
        assert any("hung" in line for line in sup.records["int8"].history)
        assert sup.records["int8"].restarts == 1
    finally:
        sup.stop_all()


def _fake_server(tmp_path: Path) -> Path:
    """A stand-in for vLLM: answers /health on the --port it is given (after 30 s when the file
    slow-<port> exists beside it; never once hang-<pid> exists)."""
    script = tmp_path / "python"
    script.write_text(
        f"#!{sys.executable}\n"
        "import os, sys, time, http.server\n"
        "port = int(sys.argv[sys.argv.index('--port') + 1])\n"
        f"if os.path.exists(os.path.join({str(tmp_path)!r}, f'slow-{{port}}')):\n"
        "    time.sleep(30)\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        f"        if os.path.exists(os.path.join({str(tmp_path)!r}, f'hang-{{os.getpid()}}')):\n"
        "            time.sleep(3600)\n"
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
        Programs(vllm_python=_fake_server(tmp_path)),
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


def test_each_tier_s_port_is_held_until_just_before_it_starts(tmp_path: Path) -> None:
    """up holds every tier's port from the start (reserve_port) and the supervisor releases
    each right before that tier starts: a tier not yet started keeps its port taken while the
    ones before it start; its own is free the moment it starts."""
    from backends.process import reserve_port

    launches = [
        TierLaunch(name=n, model_dir=tmp_path, served_model_name="m", port=_port())
        for n in ("fp16", "int4")
    ]
    held = {t.port: reserve_port(t.host, t.port) for t in launches}
    seen: list[tuple[str, bool, bool]] = []

    def release(launch: TierLaunch) -> None:
        later = launches[[t.name for t in launches].index(launch.name) + 1 :]
        others_held = all(not port_is_free(t.port) for t in later)
        held.pop(launch.port).close()
        seen.append((launch.name, others_held, port_is_free(launch.port)))

    sup = Supervisor(
        launches,
        Programs(vllm_python=_fake_server(tmp_path)),
        tmp_path / "logs",
        POLICY,
        before_start=release,
    )
    try:
        sup.start_all()
        assert seen == [("fp16", True, True), ("int4", True, True)]
        assert sup.states() == {"fp16": TierState.READY, "int4": TierState.READY}
        assert held == {}
    finally:
        sup.stop_all()
        for sock in held.values():
            sock.close()
