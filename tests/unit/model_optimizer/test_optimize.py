"""optimize: the optimizer's report relayed to stderr, its per-layer lines condensed in a log."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from model_optimizer import optimize

CHILD = """
for i in range(1, 9):
    print(f"optimize: [int4] quantize {i}/8 model.layers.{i}.q_proj", flush=True)
print("optimize: [int4] write: /tmp/out/int4", flush=True)
print("error: no such model", flush=True)
raise SystemExit(2)
"""


def test_the_report_reaches_stderr_without_a_line_per_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    python = tmp_path / "python"  # a stand-in interpreter that ignores "-m optimizer ARGS"
    python.write_text(f"#!{sys.executable}\n{CHILD}")
    python.chmod(0o755)
    monkeypatch.setattr(optimize, "env_python", lambda name: python)
    monkeypatch.setenv("MODEL_OPTIMIZER_CACHE", str(tmp_path / "cache"))
    assert optimize.run_in_optimize_env(["optimize"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("optimize: [int4] quantize 2/8 (25%) after ")
    assert [line.split(" after ")[0].split(" done in ")[0] for line in lines] == [
        "optimize: [int4] quantize 2/8 (25%)",
        "optimize: [int4] quantize 4/8 (50%)",
        "optimize: [int4] quantize 6/8 (75%)",
        "optimize: [int4] quantize 8/8",
        "optimize: [int4] write: /tmp/out/int4",
        "model-optimizer: error: no such model",
    ]
