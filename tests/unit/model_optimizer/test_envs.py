import pytest

from common import env_paths
from model_optimizer import envs


def test_paths_are_re_exported_from_common() -> None:
    assert envs.ROOT == env_paths.ROOT
    assert envs.cache_root is env_paths.cache_root
    assert envs.env_python is env_paths.env_python


def test_unknown_env_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        envs.main(["ensure", "gpu-stuff"])
    assert exc.value.code == 2
    assert "unknown environment 'gpu-stuff'" in capsys.readouterr().err
