"""``model-optimizer classifier evaluate|train``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from model_optimizer import classifier as command
from model_optimizer.cli import main


def test_evaluate_prints_both_classifiers_side_by_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        {"prompt": "Write a Python function that sorts a list.", "label": "code"},
        {"prompt": "Write a short poem about autumn in Paris.", "label": "tolerant"},
        {"prompt": "Solve for x: 3x + 5 = 20", "label": "math"},
        {"prompt": "Summarize these.", "label": "long"},  # decided by tokens: left out
    ]
    file = tmp_path / "labeled.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = tmp_path / "figures.json"
    assert main(["classifier", "evaluate", str(file), "--json", str(figures)]) == 0
    out = capsys.readouterr().out
    assert "| prompts | 3 | 3 |" in out
    assert "model (prompt-model v4, threshold" in out and "keyword rules" in out
    recorded = json.loads(figures.read_text())["files"][str(file)]
    assert recorded["keyword rules"]["prompts"] == 3


def test_evaluate_refuses_a_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["classifier", "evaluate", "/nonexistent.jsonl"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_train_runs_in_the_train_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(command, "ensure", lambda name, gpu: calls.append(name) or tmp_path)

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(command.subprocess, "run", run)
    assert main(["classifier", "train", "--output", "w.json", "--version", "2"]) == 0
    assert calls[0] == "train"
    argv = calls[1]
    assert argv[:4] == [str(tmp_path / "bin" / "python"), "-m", "classifier", "train"]
    assert argv[argv.index("--version") + 1] == "2"
    assert Path(argv[argv.index("--output") + 1]).is_absolute()
