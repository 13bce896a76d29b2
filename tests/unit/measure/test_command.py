"""``model-optimizer bench``: bad input is one line on stderr and exit 2, before any load."""

from pathlib import Path

import pytest

from backends.process import free_port
from model_optimizer.cli import main
from tests.unit.measure.conftest import StubServer


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--target", "http://192.168.1.1:8000"], "not on loopback"),
        (["--concurrency", "4,x"], "--concurrency"),
        (["--concurrency", "0"], "--concurrency"),
        (["--input-len", "0"], "--input-len must be at least 1"),
        (["--num-prompts", "0"], "--num-prompts must be at least 1"),
    ],
)
def test_bad_flags(args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", *args]) == 2
    assert says in _error_line(capsys)


def test_unreachable_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--target", f"http://127.0.0.1:{free_port()}"]) == 2
    assert "unreachable" in _error_line(capsys)


def test_unknown_tier(
    stub_gateway: StubServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    code = main(["bench", "--target", stub_gateway.url, "--tier", "int9", "--output", str(out)])
    assert code == 2
    assert "unknown tier 'int9'" in _error_line(capsys)
    assert not out.exists() and stub_gateway.bodies == []


def test_existing_output_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--output", str(tmp_path)]) == 2
    assert "already exists" in _error_line(capsys)
