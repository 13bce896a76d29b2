"""Bad input to the optimizer: one clear line, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import cli

pytestmark = pytest.mark.integration


def _error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "error:" in line]
    assert len(lines) == 1, stderr
    return lines[0]


def _run(*args: str) -> tuple[int, str]:
    result = cli(*args, timeout=300)
    return result.returncode, result.stderr


def test_missing_model_folder(tmp_path: Path) -> None:
    code, err = _run(
        "--model", str(tmp_path / "nope"), "--quantize", "int8", "--output", str(tmp_path / "out")
    )
    assert code == 2
    assert "model not found" in _error(err)
    assert not (tmp_path / "out").exists()


def test_corrupt_model_folder(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{not json")
    (model / "model.safetensors").write_bytes(b"junk")
    code, err = _run("--model", str(model), "--quantize", "int4", "--output", str(tmp_path / "o"))
    assert code == 2
    assert "corrupt model folder" in _error(err)
    assert not (tmp_path / "o").exists()


def test_unknown_precision(tmp_path: Path) -> None:
    code, err = _run("--model", "default", "--quantize", "int3", "--output", str(tmp_path / "o"))
    assert code == 2
    assert "int3" in _error(err)
    assert not (tmp_path / "o").exists()


def test_recipe_schema_error_names_file_line_and_field(tmp_path: Path) -> None:
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("calibration:\n  num_samples: many\n")
    code, err = _run("optimize", "--recipe", str(recipe), "--output", str(tmp_path / "o"))
    assert code == 2
    line = _error(err)
    assert f"{recipe}:2:" in line and "calibration.num_samples" in line
    assert not (tmp_path / "o").exists()


def test_override_matching_nothing(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "variants: [int4]\nquantization:\n  layer_overrides:\n"
        "    - layers: [model.layers.99.mlp.down_proj]\n      precision: float16\n"
    )
    code, err = _run("optimize", "--recipe", str(recipe), "--output", str(tmp_path / "o"))
    assert code == 2
    assert "model.layers.99.mlp.down_proj" in _error(err)
    assert not (tmp_path / "o").exists()


def test_output_folder_with_other_content(tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, err = _run("optimize", "--output", str(out))
    assert code == 2
    assert "exists with other content" in _error(err)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_single_form_refuses_a_foreign_folder(tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"a": 1}))
    code, err = _run("--model", "default", "--quantize", "int8", "--output", str(out))
    assert code == 2
    assert "exists with other content" in _error(err)
