"""Resolve a model source to a Hugging Face folder, using the optimize environment.

The conversion (GGUF → safetensors) needs torch; the CLI runs in the light gateway
environment, so it asks ``python -m optimizer materialize`` in the optimize environment.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from model_optimizer.envs import ROOT, cache_root, env_python


class ModelError(RuntimeError):
    """A model source that cannot be used; one line naming it."""


class AlreadyReported(RuntimeError):
    """A failure a child process has already explained on stderr; exit with ``code``."""

    def __init__(self, code: int) -> None:
        super().__init__(f"exit {code}")
        self.code = code


def optimize_env_run(args: list[str], capture: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``python -m optimizer ARGS`` in the optimize environment."""
    python = env_python("optimize")
    if not python.exists():
        raise ModelError(f"the optimize environment is missing ({python}): run ./mo setup")
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run(
        [str(python), "-m", "optimizer", *args],
        env=env,
        text=True,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
        check=False,
    )


def materialize(model: str, cache: Path | None = None) -> Path:
    """A Hugging Face folder for ``model`` ('default', a folder or a GGUF file), cached."""
    cache = cache or cache_root()
    if model != "default" and not Path(model).expanduser().exists():
        raise ModelError(f"model not found: {model} does not exist")
    result = optimize_env_run(["materialize", str(model), "--cache", str(cache)])
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("error:")]
        message = (errors or lines or ["model conversion failed"])[-1]
        raise ModelError(message.removeprefix("error: "))
    return Path(result.stdout.strip().splitlines()[-1])
