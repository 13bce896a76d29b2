"""GGUF variants on the real default model with the real llama.cpp build: the optimizer's
single-variant form writes a complete folder, and the precision check names the layer a bad
quantization broke (optimizer/gguf_*.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from common.llama_cpp import LlamaCppMissing, locate
from optimizer.gguf_build import gguf_names
from optimizer.gguf_measure import judged_modules, phase_check
from optimizer.gguf_table import read_table
from optimizer.pipeline import Job
from optimizer.recipe import load_recipe
from optimizer.sources import ModelSource

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "policies" / "recipes" / "default.yaml"
BROKEN = "model.layers.5.mlp.down_proj"


@pytest.fixture(scope="session")
def llama() -> Any:
    try:
        return locate()
    except LlamaCppMissing as exc:  # ./mo setup builds it on every CPU host
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def int8_variant(tmp_path_factory: pytest.TempPathFactory, llama: Any) -> Path:
    """The int8 GGUF variant of the default model: the one the llama.cpp stack's ``up`` built
    in this run (the integration tests run first), else ``optimize --quantize int8
    --target-framework llama.cpp`` into a folder of its own."""
    from model_optimizer.envs import cache_root

    built = cache_root() / "variants" / "SmolLM2-135M-Instruct-gguf" / "int8"
    if (built / "metadata.json").is_file():
        return built
    output = tmp_path_factory.mktemp("gguf") / "int8"

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "optimizer",
            "optimize",
            "--model",
            "default",
            "--quantize",
            "int8",
            "--output",
            str(output),
            "--target-framework",
            "llama.cpp",
            "--cache",
            str(cache_root()),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return output


def test_a_gguf_variant_folder_is_complete(int8_variant: Path, llama: Any) -> None:
    files = {p.name for p in int8_variant.iterdir()}
    assert {"model.gguf", "tokenizer.json", "layout.json", "kv_cache_config.json"} <= files
    assert "metadata.json" in files and "generation_config.json" in files
    meta = json.loads((int8_variant / "metadata.json").read_text())
    assert meta["format"] == "gguf" and meta["passed"] is True
    assert meta["target"]["framework"] == llama.version
    assert meta["precision"]["ggml_type"] == "Q8_0"
    assert meta["check"]["report"]["top1"] > 0.9
    layout = json.loads((int8_variant / "layout.json").read_text())
    assert layout["quant_method"] == "gguf" and layout["summary"]["layers"] == 30 * 7 + 1
    q_proj = next(
        layer for layer in layout["layers"] if layer["name"].endswith("0.self_attn.q_proj")
    )
    assert (q_proj["format"], q_proj["group_size"], q_proj["shape"]) == ("Q8_0", 32, [576, 576])
    kv = json.loads((int8_variant / "kv_cache_config.json").read_text())
    assert kv["bytes_per_token"] == 2 * 30 * 3 * 64 * 2  # F16 KV: 2 x layers x kv heads x dim
    leftovers = [p.name for p in int8_variant.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # no staging or work folder left behind


def _scale_blocks(path: Path, tensor: str, factor: float) -> None:
    """Multiply the f16 scale of every Q8_0 block (2 bytes of scale, 32 int8) of ``tensor``:
    its weights are then ``factor`` times too large, as a broken kernel's would be."""
    import numpy as np

    table = read_table(path)
    [entry] = [t for t in table.tensors if t.name == tensor]
    assert entry.type_id == 8  # Q8_0
    blocks = entry.shape[0] * entry.shape[1] // 32
    start = table.data_start + entry.offset
    data = np.memmap(path, dtype=np.uint8, mode="r+", offset=start, shape=(blocks, 34))
    scales = data[:, :2].copy().view(np.float16)
    data[:, :2] = (scales * np.float16(factor)).view(np.uint8)
    data.flush()


def test_a_layer_broken_in_the_file_fails_the_check_and_is_named(
    int8_variant: Path, llama: Any, original: Any, tokenizer: Any, model_dir: Path, tmp_path: Path
) -> None:
    """Q8_0 everywhere but one down projection at 2 bits: the int8 check fails on it."""
    base = tmp_path / "base.gguf"
    source = json.loads((int8_variant / "metadata.json").read_text())["source"]["path"]
    subprocess.run(
        [str(llama.quantize), "--allow-requantize", source, str(base), "BF16"],
        capture_output=True,
        check=True,
        timeout=300,
    )
    broken = tmp_path / "broken.gguf"
    subprocess.run(
        [str(llama.quantize), str(base), str(broken), "Q8_0"],
        capture_output=True,
        check=True,
        timeout=300,
    )
    _scale_blocks(broken, "blk.5.ffn_down.weight", 20.0)
    names = {gguf: module for module, gguf in gguf_names(original).items()}
    job = Job(
        source=ModelSource("hf", model_dir, model_dir.name),
        model_dir=model_dir,
        recipe=load_recipe(RECIPE),
        recipe_path=str(RECIPE),
        outputs={"int8": tmp_path / "int8"},
        target_framework="llama.cpp",
    )
    check = phase_check(job, "int8", original, tokenizer, broken, judged_modules(broken, names))
    assert not check["passed"]
    worst = check["verdict"]["worst_layers"][0]["name"]
    assert worst == BROKEN, check["verdict"]
    assert BROKEN in check["message"] and "layer_overrides" in check["message"]
