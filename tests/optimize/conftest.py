"""Session fixtures for tests that need torch: the default model (float32) and its tokenizer.

The default model is the bf16 Hugging Face folder the optimizer converts from the embedded GGUF
into the cache; it is found by glob, or converted once if missing. Nothing touches a model hub.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The default model's Hugging Face folder (SmolLM2-135M-Instruct, bf16)."""
    from model_optimizer.envs import cache_root
    from optimizer.sources import DEFAULT_MODEL, DEFAULT_MODEL_NAME, materialize

    found = sorted((cache_root() / "models").glob(f"{DEFAULT_MODEL_NAME}-*/config.json"))
    if found:
        return found[-1].parent
    return materialize(DEFAULT_MODEL, cache_root())


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="session")
def original(model_dir: Path) -> Any:
    """The default model in float32 (bf16 matmuls are several times slower on this CPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
