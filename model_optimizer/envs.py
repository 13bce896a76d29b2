"""The three virtual environments: build what is missing (their paths are common/env_paths.py).

Standard library only: ``./mo`` runs this with the machine's python3 before any environment
exists. ``python3 -m model_optimizer.envs ensure`` creates what is missing (idempotent, seconds
when cached); ``python3 -m model_optimizer.envs path NAME`` prints an environment's folder.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from common.env_paths import (
    ENV_NAMES,
    ON_DEMAND_ENV_NAMES,
    RECIPE_VERSION,
    REQUIREMENTS,
    ROOT,
    EnvSpec,
    cache_lock,
    cache_root,
    env_dir,
    env_hash,
    env_python,
    has_nvidia_gpu,
    specs,
)
from common.llama_cpp import ENGINE as LLAMA_CPP
from common.llama_cpp import LLAMA_CPP_ENV
from model_optimizer.llama_build import BuildError, ensure_llama_cpp

# Re-exported for the CLI, tests, benchmarks and scripts that import them from here.
__all__ = [
    "ENV_NAMES",
    "ON_DEMAND_ENV_NAMES",
    "RECIPE_VERSION",
    "REQUIREMENTS",
    "ROOT",
    "EnvSpec",
    "cache_lock",
    "cache_root",
    "ensure",
    "env_dir",
    "env_hash",
    "env_python",
    "has_nvidia_gpu",
    "main",
    "specs",
]


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
    with cache_lock(cache_root() / "envs" / f".{name}.lock"):
        if not done.is_file():
            started = time.monotonic()
            print(f"setup: building the {name} environment in {target} ...", flush=True)
            _build(spec, target)
            done.write_text(f"{time.monotonic() - started:.0f}s\n")
            print(f"setup: {name} ready ({done.read_text().strip()})", flush=True)
        # Every environment sees this clone's packages (gateway/, backends/, optimizer/...).
        _link_project(target)
    return target


class _LlamaBuild(threading.Thread):
    """llama.cpp's build (model_optimizer/llama_build.py) beside the environments' pip installs:
    the compiler keeps the cores busy while pip mostly waits on downloads and disk."""

    def __init__(self) -> None:
        super().__init__(name="llama.cpp-build", daemon=True)
        self.error: str | None = None

    def run(self) -> None:
        try:
            ensure_llama_cpp(lambda message: print(f"setup: {message}", flush=True))
        except (BuildError, OSError, subprocess.SubprocessError) as exc:
            self.error = str(exc)


def wants_llama_cpp(names: list[str], gpu: bool, environ: dict[str, str]) -> bool:
    """Whether ``ensure`` builds llama.cpp: asked by name, or by default on a CPU-only host
    (where its tiers serve), unless ``MO_LLAMA_CPP`` names an existing one (pure)."""
    if environ.get(LLAMA_CPP_ENV, "").strip():
        return False
    return LLAMA_CPP in names if names else not gpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m model_optimizer.envs")
    sub = parser.add_subparsers(dest="command", required=True)
    ens = sub.add_parser("ensure", help="create missing environments (and llama.cpp's build)")
    known = (*ENV_NAMES, *ON_DEMAND_ENV_NAMES)
    ens.add_argument(
        "--for-up",
        action="store_true",
        help="only what up needs here: gateway and optimize, and llama.cpp (CPU) or serve (GPU)",
    )
    ens.add_argument(
        "names",
        nargs="*",
        help=f"some of {', '.join((*known, LLAMA_CPP))} (default: {', '.join(ENV_NAMES)}, and "
        f"{LLAMA_CPP} on a CPU-only host)",
    )
    path = sub.add_parser("path", help="print an environment's folder")
    path.add_argument("name", choices=known)
    args = parser.parse_args(argv)
    unknown = sorted(set(getattr(args, "names", [])) - {*known, LLAMA_CPP})
    if unknown:
        choices = ", ".join((*known, LLAMA_CPP))
        parser.error(f"unknown environment {unknown[0]!r}: choose from {choices}")
    gpu = has_nvidia_gpu()
    if args.command == "path":
        print(env_dir(args.name, gpu))
        return 0
    asked = list(args.names)
    if args.for_up:
        asked = ["gateway", "optimize", "serve" if gpu else LLAMA_CPP]
    build = _LlamaBuild() if wants_llama_cpp(asked, gpu, dict(os.environ)) else None
    if build is not None:
        build.start()
    code = 0
    names = [name for name in asked if name != LLAMA_CPP] if asked else list(ENV_NAMES)
    for name in names:
        try:
            ensure(name, gpu)
        except subprocess.CalledProcessError as exc:
            print(f"setup: building the {name} environment failed: {exc}", file=sys.stderr)
            code = 1
            break
    if build is not None:
        build.join()
        if build.error is not None:
            print(f"setup: {build.error}", file=sys.stderr)
            code = code or 1
    return code


if __name__ == "__main__":
    sys.exit(main())
