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
