from pathlib import Path

import pytest

from model_optimizer import envs


def test_env_hash_follows_the_pins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.txt").write_text("x==1\n")
    monkeypatch.setattr(envs, "REQUIREMENTS", tmp_path)
    spec = envs.EnvSpec("t", ("a.txt",))
    first = envs.env_hash(spec)
    assert first == envs.env_hash(spec)
    (tmp_path / "a.txt").write_text("x==2\n")
    assert envs.env_hash(spec) != first


def test_env_dirs_live_in_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MODEL_OPTIMIZER_CACHE", str(tmp_path))
    for name in envs.ENV_NAMES:
        path = envs.env_dir(name, gpu=False)
        assert path.parent == tmp_path / "envs"
        assert path.name.startswith(f"{name}-")


def test_cpu_and_gpu_serve_envs_differ() -> None:
    assert envs.specs(False)["serve"].requirements != envs.specs(True)["serve"].requirements
    assert "torchvision" in envs.specs(False)["serve"].uninstall


def test_unknown_env_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        envs.main(["ensure", "gpu-stuff"])
    assert exc.value.code == 2
    assert "unknown environment 'gpu-stuff'" in capsys.readouterr().err
