"""The three virtual environments: build what is missing (their paths are common/env_paths.py).

Standard library only: ``./mo`` runs this with the machine's python3 before any environment
exists. ``python3 -m model_optimizer.envs ensure`` creates what is missing (idempotent, seconds
when cached); ``python3 -m model_optimizer.envs path NAME`` prints an environment's folder.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m model_optimizer.envs")
    sub = parser.add_subparsers(dest="command", required=True)
    ens = sub.add_parser("ensure", help="create missing environments")
    known = (*ENV_NAMES, *ON_DEMAND_ENV_NAMES)
    ens.add_argument(
        "names", nargs="*", help=f"some of {', '.join(known)} (default: {', '.join(ENV_NAMES)})"
    )
    path = sub.add_parser("path", help="print an environment's folder")
    path.add_argument("name", choices=known)
    args = parser.parse_args(argv)
    unknown = sorted(set(getattr(args, "names", [])) - set(known))
    if unknown:
        parser.error(f"unknown environment {unknown[0]!r}: choose from {', '.join(known)}")
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
