from pathlib import Path

import pytest

from common import env_paths


def test_env_hash_follows_the_pins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.txt").write_text("x==1\n")
    monkeypatch.setattr(env_paths, "REQUIREMENTS", tmp_path)
    spec = env_paths.EnvSpec("t", ("a.txt",))
    first = env_paths.env_hash(spec)
    assert first == env_paths.env_hash(spec)
    (tmp_path / "a.txt").write_text("x==2\n")
    assert env_paths.env_hash(spec) != first


def test_env_dirs_live_in_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MODEL_OPTIMIZER_CACHE", str(tmp_path))
    for name in env_paths.ENV_NAMES:
        path = env_paths.env_dir(name, gpu=False)
        assert path.parent == tmp_path / "envs"
        assert path.name.startswith(f"{name}-")


def test_cpu_and_gpu_serve_envs_differ() -> None:
    assert (
        env_paths.specs(False)["serve"].requirements != env_paths.specs(True)["serve"].requirements
    )
    assert "torchvision" in env_paths.specs(False)["serve"].uninstall


def test_cache_lock_makes_a_second_holder_wait(tmp_path: Path) -> None:
    import threading

    lock = tmp_path / "sub" / ".model.lock"
    order: list[str] = []
    first_holds = threading.Event()
    second_waits = threading.Event()

    def first() -> None:
        with env_paths.cache_lock(lock):
            first_holds.set()
            assert second_waits.wait(10)
            order.append("first done")

    thread = threading.Thread(target=first)
    thread.start()
    assert first_holds.wait(10)
    with env_paths.cache_lock(lock, waiting=second_waits.set):
        order.append("second holds")
    thread.join(10)
    assert order == ["first done", "second holds"]


def test_cache_lock_free_does_not_call_waiting(tmp_path: Path) -> None:
    called: list[bool] = []
    with env_paths.cache_lock(tmp_path / ".x.lock", waiting=lambda: called.append(True)):
        pass
    assert called == []
