"""PolicyStore: first load, reload outcomes (a bad edit keeps the last good policy), status, and
watch() on a real directory. Every wait is bounded, so no test can hang."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from gateway.policy.schema import PolicyError, parse_policy
from gateway.policy.store import PolicyStore
from gateway.request.classify.classes import CompiledClasses

KNOWN = ("fp16", "int8", "int4")
GOOD = """\
tiers: [fp16, int8, int4]
routes:
  tolerant: [int4, int8, fp16]
  code: [fp16, int8]
  math: [fp16, int8]
  long: {strategy: most_free_kv, tiers: [fp16, int8, int4]}
"""
EDITED = GOOD.replace("code: [fp16, int8]", "code: [int8, fp16]")
# Valid on its own, but int2 is not a tier the gateway has; the tiers in block style (line 4).
UNKNOWN_TIER = GOOD.replace("int4", "int2").replace(
    "tiers: [fp16, int8, int2]\n", "tiers:\n  - fp16\n  - int8\n  - int2\n", 1
)
WAIT = 2.0  # a change must be reloaded within this many seconds
LOGGER = "gateway.policy.store"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "routing.yaml"
    path.write_text(GOOD)
    return path


@pytest.fixture
def store(policy_file: Path, clock: Clock) -> PolicyStore:
    store = PolicyStore(policy_file, KNOWN, clock=clock)
    store.load()
    return store


# --------------------------------------------------------------------------- parse_policy


def test_parse_policy_checks_known_tiers_only_when_given() -> None:
    assert parse_policy(GOOD, "t.yaml").tiers == list(KNOWN)
    assert parse_policy(GOOD, "t.yaml", KNOWN).tiers == list(KNOWN)
    with pytest.raises(PolicyError) as info:
        parse_policy(GOOD, "t.yaml", ["fp16", "int8"])
    assert str(info.value) == "t.yaml:1: tiers[2]: unknown tier int4 (the gateway has fp16, int8)"


def test_an_unknown_tier_names_its_own_line() -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(UNKNOWN_TIER, "t.yaml", KNOWN)
    assert str(info.value) == (
        "t.yaml:4: tiers[2]: unknown tier int2 (the gateway has fp16, int8, int4)"
    )


# --------------------------------------------------------------------------- load


def test_load_serves_the_file(policy_file: Path, clock: Clock) -> None:
    store = PolicyStore(policy_file, KNOWN, clock=clock)
    active = store.load()
    assert store.active is active
    assert active.policy.routes.code.tiers == ["fp16", "int8"]
    assert isinstance(active.rules, CompiledClasses)
    assert active.rules.long_min_tokens == active.policy.classes.long.min_tokens
    assert active.digest == _sha(GOOD)
    assert active.loaded_at == 1000.0
    assert active.source == str(policy_file)
    assert store.last_error is None and store.last_error_at is None


def test_the_shipped_policy_loads_against_the_shipped_tiers() -> None:
    shipped = Path(__file__).resolve().parents[4] / "policies" / "routing.yaml"
    store = PolicyStore(shipped, KNOWN)
    assert store.load().policy.tiers == list(KNOWN)
    model = store.status()["classifier_model"]
    assert (model["name"], model["version"], len(model["digest"])) == ("prompt-model", 4, 12)


def test_nothing_is_served_before_a_load(policy_file: Path) -> None:
    store = PolicyStore(policy_file, KNOWN)
    with pytest.raises(RuntimeError, match="not loaded"):
        _ = store.active
    with pytest.raises(RuntimeError, match="not loaded"):
        store.reload()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tiers: [fp16\nroutes: {}\n", ":2: invalid YAML"),
        ("", ":1: tiers: required field is missing"),
        (GOOD.replace("int4", "int2"), ":1: tiers[2]: unknown tier int2 (the gateway has"),
        (GOOD + "saturation:\n  max_kv_usage: 2\n", ":8: saturation.max_kv_usage: Input"),
    ],
    ids=["garbage", "empty", "unknown-tier", "schema"],
)
def test_a_bad_first_load_raises_one_line(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(text)
    store = PolicyStore(path, KNOWN)
    with pytest.raises(PolicyError) as info:
        store.load()
    message = str(info.value)
    assert message.startswith(f"{path}{expected}")
    assert "\n" not in message
    with pytest.raises(RuntimeError):
        _ = store.active


def test_a_missing_file_is_a_policy_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(PolicyError, match=r"absent\.yaml: cannot read routing policy"):
        PolicyStore(path).load()


def test_without_known_tiers_any_declared_tier_loads(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(GOOD.replace("int4", "int2"))
    assert PolicyStore(path).load().policy.tiers == ["fp16", "int8", "int2"]


# --------------------------------------------------------------------------- reload


def _garbage(path: Path) -> str:
    path.write_text("tiers: [fp16\n")
    return f"{path}:2: invalid YAML"


def _empty(path: Path) -> str:
    path.write_text("")
    return f"{path}:1: tiers: required field is missing"


def _unknown_tier(path: Path) -> str:
    path.write_text(UNKNOWN_TIER)
    return f"{path}:4: tiers[2]: unknown tier int2 (the gateway has fp16, int8, int4)"


def _deleted(path: Path) -> str:
    path.unlink()
    return f"{path}: cannot read routing policy: No such file or directory"


def _not_utf8(path: Path) -> str:
    path.write_bytes(b"tiers: [\xff]\n")
    return f"{path}: cannot read routing policy:"


def _over_1_mib(path: Path) -> str:
    # A valid policy with a pasted log below it: read whole and parsed, 16 MB took ~12 s of
    # the event loop.
    path.write_text(GOOD + "# " + "x" * (1 << 20) + "\n")
    return f"{path}: cannot read routing policy: larger than 1,048,576 bytes"


def _an_alias(path: Path) -> str:
    # Valid and harmless on its own, but aliases are what an alias bomb is made of.
    text = GOOD.replace("tiers: [fp16, int8, int4]", "tiers: &all [fp16, int8, int4]", 1)
    path.write_text(text.replace("tiers: [fp16, int8, int4]}", "tiers: *all}"))
    return f"{path}:6: invalid YAML: alias *all: YAML aliases are not allowed in operator files"


@pytest.mark.parametrize(
    "break_it",
    [_garbage, _empty, _unknown_tier, _deleted, _not_utf8, _over_1_mib, _an_alias],
    ids=["garbage", "empty", "unknown-tier", "deleted", "not-utf8", "over-1-mib", "alias"],
)
def test_a_bad_edit_is_rejected_and_the_last_good_policy_serves(
    store: PolicyStore,
    policy_file: Path,
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
    break_it: Callable[[Path], str],
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    before = store.active
    expected = break_it(policy_file)
    clock.now = 2000.0
    assert store.reload() == "rejected"
    assert store.active is before
    assert store.last_error is not None and store.last_error.startswith(expected)
    assert "\n" not in store.last_error
    assert store.last_error_at == 2000.0
    status = store.status()
    assert status["last_error"] == store.last_error
    assert status["last_error_at"] == "1970-01-01T00:33:20.000Z"
    assert status["digest"] == _sha(GOOD)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert str(policy_file) in warnings[0].getMessage()
    assert store.last_error in warnings[0].getMessage()


def test_a_good_edit_is_applied_and_clears_the_error(
    store: PolicyStore, policy_file: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    _garbage(policy_file)
    assert store.reload() == "rejected"
    caplog.set_level(logging.INFO, logger=LOGGER)
    policy_file.write_text(EDITED)
    clock.now = 3000.0
    assert store.reload() == "applied"
    assert store.active.policy.routes.code.tiers == ["int8", "fp16"]
    assert store.active.digest == _sha(EDITED)
    assert store.active.loaded_at == 3000.0
    assert store.last_error is None and store.last_error_at is None
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == [f"routing policy {policy_file} applied (sha256 {_sha(EDITED)[:12]})"]


def test_the_same_bytes_are_unchanged(store: PolicyStore, policy_file: Path, clock: Clock) -> None:
    before = store.active
    policy_file.write_text(GOOD)  # rewritten, same bytes
    clock.now = 4000.0
    assert store.reload() == "unchanged"
    assert store.active is before
    assert store.active.loaded_at == 1000.0


def test_back_to_the_serving_bytes_clears_the_error(store: PolicyStore, policy_file: Path) -> None:
    before = store.active
    _empty(policy_file)
    assert store.reload() == "rejected"
    assert store.last_error is not None
    policy_file.write_text(GOOD)
    assert store.reload() == "unchanged"
    assert store.active is before
    assert store.last_error is None and store.last_error_at is None
    assert store.status()["last_error"] is None


def test_the_same_bad_edit_warns_once(
    store: PolicyStore, policy_file: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    _garbage(policy_file)
    assert store.reload() == "rejected"
    clock.now = 5000.0
    assert store.reload() == "rejected"
    assert store.last_error_at == 5000.0
    _empty(policy_file)
    assert store.reload() == "rejected"
    assert len(caplog.records) == 2


def test_status_describes_the_serving_policy(store: PolicyStore, policy_file: Path) -> None:
    status = store.status()
    assert set(status) == {
        "path",
        "digest",
        "loaded_at",
        "last_error",
        "last_error_at",
        "policy",
        "derived_routes",
        "classifier_model",
    }
    assert status["classifier_model"] is None  # keyword rules, no model
    assert status["derived_routes"] == {}  # no measurements: routes as written
    assert status["path"] == str(policy_file)
    assert status["digest"] == _sha(GOOD)
    assert status["loaded_at"] == "1970-01-01T00:16:40.000Z"
    assert status["last_error"] is None and status["last_error_at"] is None
    assert status["policy"] == store.active.policy.model_dump(mode="json")
    assert status["policy"]["routes"]["long"]["strategy"] == "most_free_kv"


# --------------------------------------------------------------------------- watch


async def _watching(
    store: PolicyStore, edit: Callable[[], None], until: Callable[[], bool]
) -> list[str]:
    """Start watch(), make ``edit``, wait (bounded) for ``until``, then stop the watch."""
    outcomes: list[str] = []
    changed = asyncio.Event()
    stop = asyncio.Event()

    def on_reload(outcome: str) -> None:
        outcomes.append(outcome)
        changed.set()

    task = asyncio.create_task(store.watch(on_reload, debounce_ms=50, stop_event=stop))
    try:
        await asyncio.sleep(0.2)  # the watcher is set up
        edit()
        deadline = asyncio.get_running_loop().time() + WAIT
        while not until() and asyncio.get_running_loop().time() < deadline:
            changed.clear()
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                await asyncio.wait_for(changed.wait(), max(remaining, 0.01))
            except TimeoutError:
                break
        stop.set()
        await asyncio.wait_for(task, 1.0)  # stop_event ends the watch promptly
    finally:
        task.cancel()
    return outcomes


def _edited(store: PolicyStore) -> Callable[[], bool]:
    return lambda: store.active.digest == _sha(EDITED)


def test_watch_reloads_a_file_replaced_by_rename(store: PolicyStore, policy_file: Path) -> None:
    def replace() -> None:
        temp = policy_file.with_name(".routing.yaml.swp")
        temp.write_text(EDITED)
        os.replace(temp, policy_file)

    outcomes = asyncio.run(_watching(store, replace, _edited(store)))
    assert outcomes and outcomes[-1] == "applied"
    assert store.active.policy.routes.code.tiers == ["int8", "fp16"]


def test_watch_reloads_a_file_written_in_place(store: PolicyStore, policy_file: Path) -> None:
    def write() -> None:
        with policy_file.open("w") as out:
            out.write(EDITED)

    outcomes = asyncio.run(_watching(store, write, _edited(store)))
    assert outcomes[-1:] == ["applied"]
    assert store.active.digest == _sha(EDITED)
    assert store.last_error is None


def test_watch_reports_a_rejected_edit(store: PolicyStore, policy_file: Path) -> None:
    outcomes = asyncio.run(
        _watching(store, lambda: _garbage(policy_file), lambda: store.last_error is not None)
    )
    assert outcomes and set(outcomes) == {"rejected"}
    assert store.active.digest == _sha(GOOD)


def test_watch_ignores_other_files(store: PolicyStore, policy_file: Path) -> None:
    other = policy_file.with_name("other.yaml")
    outcomes = asyncio.run(_watching(store, lambda: other.write_text(EDITED), lambda: False))
    assert outcomes == []


def test_watch_follows_a_configmap_symlink_swap(tmp_path: Path, clock: Clock) -> None:
    # Kubernetes' layout: routing.yaml -> ..data/routing.yaml, ..data -> ..<timestamp>/
    (tmp_path / "..v1").mkdir()
    (tmp_path / "..v1" / "routing.yaml").write_text(GOOD)
    (tmp_path / "..data").symlink_to("..v1")
    (tmp_path / "routing.yaml").symlink_to("..data/routing.yaml")
    store = PolicyStore(tmp_path / "routing.yaml", KNOWN, clock=clock)
    store.load()

    def swap() -> None:
        (tmp_path / "..v2").mkdir()
        (tmp_path / "..v2" / "routing.yaml").write_text(EDITED)
        (tmp_path / "..data_tmp").symlink_to("..v2")
        os.replace(tmp_path / "..data_tmp", tmp_path / "..data")

    outcomes = asyncio.run(_watching(store, swap, _edited(store)))
    assert outcomes[-1:] == ["applied"]


def _kubelet_write(folder: Path, stamp: str, text: str) -> None:
    """What kubelet's AtomicWriter does to a mounted ConfigMap: the payload in a new
    timestamped folder, ``..data_tmp`` pointed at it and renamed over ``..data``, the
    user-visible ``routing.yaml -> ..data/routing.yaml`` made once, the old folder removed."""
    old = os.readlink(folder / "..data") if (folder / "..data").is_symlink() else None
    (folder / stamp).mkdir()
    (folder / stamp / "routing.yaml").write_text(text)
    (folder / "..data_tmp").symlink_to(stamp)
    os.replace(folder / "..data_tmp", folder / "..data")
    if not (folder / "routing.yaml").is_symlink():
        (folder / "routing.yaml").symlink_to("..data/routing.yaml")
    if old is not None:
        (folder / old / "routing.yaml").unlink()
        (folder / old).rmdir()


def test_watch_follows_kubelets_configmap_updates_one_after_another(
    tmp_path: Path, clock: Clock
) -> None:
    _kubelet_write(tmp_path, "..2026_01_02_03_04_05.000000001", GOOD)
    store = PolicyStore(tmp_path / "routing.yaml", KNOWN, clock=clock)
    store.load()
    second = EDITED.replace("tolerant: [int4, int8, fp16]", "tolerant: [int8, int4, fp16]")

    def first_update() -> None:
        _kubelet_write(tmp_path, "..2026_01_02_03_05_06.000000002", EDITED)

    outcomes = asyncio.run(_watching(store, first_update, _edited(store)))
    assert outcomes[-1:] == ["applied"]
    assert store.active.policy.routes.code.tiers == ["int8", "fp16"]
    assert not (tmp_path / "..2026_01_02_03_04_05.000000001").exists()

    def second_update() -> None:
        _kubelet_write(tmp_path, "..2026_01_02_03_06_07.000000003", second)

    outcomes = asyncio.run(
        _watching(store, second_update, lambda: store.active.digest == _sha(second))
    )
    assert outcomes[-1:] == ["applied"]
    assert store.active.policy.routes.tolerant.tiers == ["int8", "int4", "fp16"]


def test_a_cancelled_watch_ends_promptly_and_leaves_the_stop_event_alone(
    store: PolicyStore,
) -> None:
    async def main() -> bool:
        stop = asyncio.Event()
        task = asyncio.create_task(store.watch(stop_event=stop))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 1.0)
        return stop.is_set()

    assert asyncio.run(main()) is False


def test_a_task_group_cancel_ends_the_watch_promptly(store: PolicyStore) -> None:
    # anyio cancellation (how the gateway's lifespan stops the watch) cannot interrupt awatch's
    # worker thread; the watch must still end well before awatch's default 5 s thread timeout.
    async def main() -> float:
        async with anyio.create_task_group() as group:
            group.start_soon(store.watch)
            await anyio.sleep(0.2)
            started = time.perf_counter()
            group.cancel_scope.cancel()
        return time.perf_counter() - started

    assert anyio.run(main) < 1.0


def test_a_failing_callback_does_not_end_the_watch(store: PolicyStore, policy_file: Path) -> None:
    calls: list[str] = []

    async def main() -> None:
        stop = asyncio.Event()

        def on_reload(outcome: str) -> None:
            calls.append(outcome)
            raise ValueError("callback bug")

        task = asyncio.create_task(store.watch(on_reload, debounce_ms=50, stop_event=stop))
        try:
            await asyncio.sleep(0.2)
            _garbage(policy_file)
            await _until(lambda: len(calls) >= 1)
            policy_file.write_text(EDITED)
            await _until(lambda: "applied" in calls)
            assert not task.done()
            stop.set()
            await asyncio.wait_for(task, 1.0)
        finally:
            task.cancel()

    asyncio.run(main())
    assert calls[0] == "rejected" and calls[-1] == "applied"


async def _until(condition: Callable[[], bool]) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    "error", [RecursionError("maximum recursion depth exceeded"), KeyError("x")]
)
def test_any_failure_while_building_is_a_rejection_not_a_crash(
    store: PolicyStore, policy_file: Path, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    # Only PolicyError was caught: anything else escaped reload() and ended the watch for good.
    def broken(*args: object, **kwargs: object) -> None:
        raise error

    before = store.active
    monkeypatch.setattr("gateway.policy.store.CompiledClasses.build", broken)
    policy_file.write_text(EDITED)
    assert store.reload() == "rejected"
    assert store.active is before
    assert store.last_error is not None
    assert store.last_error.startswith(f"{policy_file}: cannot use routing policy: ")
    assert type(error).__name__ in store.last_error and "\n" not in store.last_error
    monkeypatch.undo()
    assert store.reload() == "applied"  # the file fixed (here: the code), the watch goes on


def test_a_deeply_nested_edit_is_rejected_and_the_restored_file_serves(
    store: PolicyStore, policy_file: Path
) -> None:
    policy_file.write_text(GOOD + "saturation: " + "[" * 5000 + "]" * 5000 + "\n")
    assert store.reload() == "rejected"
    assert store.last_error is not None and "nested too deeply" in store.last_error
    policy_file.write_text(EDITED)
    assert store.reload() == "applied"


def _alias_bomb(levels: int) -> str:
    """``levels`` lists of 9 aliases to the list before: 9**levels nodes to walk, expanded."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_rejected_at_once(store: PolicyStore, policy_file: Path) -> None:
    # 360 bytes; the duplicate-key check walked the aliased graph: 1.3 s here, 17 s at 8 levels.
    before = store.active
    policy_file.write_text(GOOD + _alias_bomb(6))
    started = time.perf_counter()
    assert store.reload() == "rejected"
    assert time.perf_counter() - started < 0.5
    assert store.active is before
    assert store.last_error == (
        f"{policy_file}:8: invalid YAML: alias *a0: YAML aliases are not allowed in operator "
        "files (write the value out)"
    )


def test_the_watch_parses_off_the_event_loop(
    store: PolicyStore, policy_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow parse (here 0.6 s) runs in a worker thread: the loop, which serves every request
    and /healthz, keeps ticking meanwhile."""

    def slow_parse(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.6)
        return parse_policy(*args, **kwargs)

    monkeypatch.setattr("gateway.policy.store.parse_policy", slow_parse)
    gaps: list[float] = []

    async def main() -> list[str]:
        async def tick() -> None:
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0.01)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticker = asyncio.create_task(tick())
        try:
            return await _watching(store, lambda: policy_file.write_text(EDITED), _edited(store))
        finally:
            ticker.cancel()

    assert asyncio.run(main()) == ["applied"]
    assert store.active.digest == _sha(EDITED)
    assert max(gaps) < 0.3, f"the event loop stalled {max(gaps):.2f} s"
