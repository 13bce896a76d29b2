"""The optimizer on the real default model: variants, artifacts, the check, the cache, vLLM."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from model_optimizer.envs import cache_root, env_python
from tests.integration.conftest import MODEL, Stack, cli

pytestmark = pytest.mark.integration
FILES = ("config.json", "model.safetensors", "tokenizer.json", "layout.json")
FILES += ("kv_cache_config.json", "metadata.json")


@pytest.fixture(scope="session")
def variants(stack: Stack) -> Path:
    """The variants the session's ``up`` serves: ``up`` runs this optimizer on the embedded
    default into the cache (a build on a cold cache, the optimizer's own no-op check on a warm
    one, see test_rerun_is_a_no_op), so a second fresh run here would cost CI minutes for the
    same files. Tests below only read them (a broken copy goes to its own folder)."""
    folder = cache_root() / "variants" / MODEL
    assert "optimize:" in stack.log_text()  # up's optimize phase ran on this folder
    return folder


def _meta(folder: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((folder / "metadata.json").read_text())


def test_three_verified_variants_with_artifacts(variants: Path) -> None:
    assert sorted(p.name for p in variants.iterdir()) == ["fp16", "int4", "int8"]
    sizes = {}
    for name in ("fp16", "int8", "int4"):
        folder = variants / name
        for file in FILES:
            assert (folder / file).is_file(), f"{name}/{file}"
        meta = _meta(folder)
        assert meta["passed"] is True and meta["check"]["passed"] is True
        assert meta["target"]["framework"].startswith("vllm==0.32")
        assert 0.0 <= meta["check"]["report"]["mean_kl"] <= 1.0
        sizes[name] = (folder / "model.safetensors").stat().st_size
    # INT4 < INT8 < bf16 on disk (measured by hand: 113, 163, 269 MB).
    assert sizes["int4"] < sizes["int8"] < sizes["fp16"]


def test_layout_and_kv_config(variants: Path) -> None:
    int4 = json.loads((variants / "int4" / "layout.json").read_text())
    layers = {layer["name"]: layer for layer in int4["layers"]}
    down = layers["model.layers.0.mlp.down_proj"]
    assert (down["precision"], down["group_size"]) == ("int4", 64)
    assert down["shape"] == [576, 1536] and down["packed_shape"] == [576, 192]
    int8 = json.loads((variants / "int8" / "layout.json").read_text())
    assert {layer["precision"] for layer in int8["layers"] if "proj" in layer["name"]} == {"int8"}
    kv = json.loads((variants / "int4" / "kv_cache_config.json").read_text())
    assert kv["bytes_per_token"] == 2 * 30 * 3 * 64 * 2  # layers x kv heads x head dim x bf16
    assert kv["kv_cache_memory_bytes"] >= kv["bytes_per_token"] * kv["max_model_len"]


def test_rerun_is_a_no_op(variants: Path) -> None:
    before = {p: p.stat().st_mtime_ns for p in variants.rglob("*")}
    started = time.monotonic()
    result = cli("optimize", "--model", "default", "--output", str(variants), timeout=120)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert "nothing to do" in result.stderr
    assert {p: p.stat().st_mtime_ns for p in variants.rglob("*")} == before
    assert elapsed < 60, f"a no-op took {elapsed:.0f}s"


def _corrupt_scale(src: Path, dest: Path, tensor: str, factor: float) -> None:
    shutil.copytree(src, dest)
    script = (
        "import sys\nfrom safetensors.torch import load_file, save_file\n"
        "path, name, factor = sys.argv[1], sys.argv[2], float(sys.argv[3])\n"
        "t = load_file(path)\nt[name] = t[name] * factor\n"
        "save_file(t, path, metadata={'format': 'pt'})\n"
    )
    subprocess.run(
        [
            str(env_python("optimize")),
            "-c",
            script,
            str(dest / "model.safetensors"),
            tensor,
            str(factor),
        ],
        check=True,
        timeout=120,
    )


@pytest.mark.slow
def test_broken_variant_fails_the_check_and_names_the_layer(variants: Path, tmp_path: Path) -> None:
    broken = tmp_path / "int4-broken"
    layer = "model.layers.5.mlp.down_proj"
    _corrupt_scale(variants / "int4", broken, f"{layer}.weight_scale", 50.0)
    result = cli("check", "--model", "default", "--variant", str(broken), timeout=600)
    assert result.returncode == 1, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("precision check")]
    assert lines and lines[0].startswith("precision check failed for int4")
    assert layer in lines[0]
    assert f"- layers: [{layer}" in result.stderr or layer in result.stderr.split("layers:")[-1]


@pytest.mark.slow
def test_the_intact_variant_passes_the_same_check(variants: Path) -> None:
    result = cli("check", "--model", "default", "--variant", str(variants / "int8"), timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
