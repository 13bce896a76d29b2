"""Which program a tier runs and with what command line, by its engine (pure).

``Programs`` says where the engines are on this machine: vLLM's Python (the serve environment)
and llama.cpp's ``llama-server`` (common/llama_cpp.py finds it). ``command`` picks the argv and
environment builder of the launch's engine (backends/vllm_args.py, backends/llama_args.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from backends import llama_args, vllm_args
from backends.launch import LLAMA_CPP, TierLaunch


class EngineMissing(RuntimeError):
    """A tier's engine is not installed here; one line naming the tier and what to do."""


@dataclass(frozen=True)
class Programs:
    """The programs tiers start: ``vllm_python`` runs vLLM, ``llama_server`` is llama.cpp's."""

    vllm_python: Path | None = None
    llama_server: Path | None = None


def command(
    launch: TierLaunch, programs: Programs, environ: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """The tier's command line and environment."""
    if launch.engine == LLAMA_CPP:
        if programs.llama_server is None:
            raise EngineMissing(f"tier {launch.name}: llama.cpp's llama-server is not available")
        argv = llama_args.build_argv(programs.llama_server, launch)
        return argv, llama_args.build_env(launch, dict(environ))
    if programs.vllm_python is None:
        raise EngineMissing(f"tier {launch.name}: vLLM's environment is not available")
    argv = vllm_args.build_argv(programs.vllm_python, launch)
    return argv, vllm_args.build_env(launch, dict(environ))
